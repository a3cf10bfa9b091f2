"""The CS336 transformer language model and its size table, for benchmarks and memory accounting.

Pre-norm blocks (RMSNorm -> causal multi-head attention, RMSNorm -> GELU feed-forward), learned
absolute position embeddings, untied ``lm_head``, no biases, as in the course's 2024 basics
model. Parameter count: ``2*V*d + C*d + L*(4d^2 + 2*d*d_ff + 2d) + d``; 'xl' has 1.507e9.
``norm="triton"`` uses paracheck's Triton RMSNorm (needs triton).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["LMSpec", "LM_SIZES", "TransformerLM", "lm_parameter_count"]

# name: (d_model, d_ff, num_layers, num_heads), from the CS336 assignment's table.
LM_SIZES: dict[str, tuple[int, int, int, int]] = {
    "small": (768, 3072, 12, 12),
    "medium": (1024, 4096, 24, 16),
    "large": (1280, 5120, 36, 20),
    "xl": (1600, 6400, 48, 25),
    "2.7B": (2560, 10240, 32, 32),
}


@dataclass(frozen=True)
class LMSpec:
    vocab_size: int = 10000
    context_length: int = 256
    d_model: int = 768
    d_ff: int = 3072
    num_layers: int = 12
    num_heads: int = 12
    norm: str = "torch"  # "torch" | "triton"

    kind = "lm"

    @classmethod
    def size(cls, name: str, **overrides) -> LMSpec:
        if name not in LM_SIZES:
            raise ValueError(f"size={name!r} must be one of {sorted(LM_SIZES)}")
        d, dff, layers, heads = LM_SIZES[name]
        return cls(d_model=d, d_ff=dff, num_layers=layers, num_heads=heads, **overrides)

    def __post_init__(self):
        if self.d_model % self.num_heads:
            raise ValueError(
                f"d_model={self.d_model} must be divisible by num_heads={self.num_heads}"
            )
        if self.norm not in ("torch", "triton"):
            raise ValueError(f"norm={self.norm!r} must be 'torch' or 'triton'")


def lm_parameter_count(spec: LMSpec) -> int:
    d, dff, L = spec.d_model, spec.d_ff, spec.num_layers
    return (
        2 * spec.vocab_size * d
        + spec.context_length * d
        + L * (4 * d * d + 2 * d * dff + 2 * d)
        + d
    )


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def _norm(spec: LMSpec) -> nn.Module:
    if spec.norm == "triton":
        from paracheck.kernels import TritonRMSNorm

        return TritonRMSNorm(spec.d_model)
    return RMSNorm(spec.d_model)


class Block(nn.Module):
    def __init__(self, spec: LMSpec):
        super().__init__()
        d = spec.d_model
        self.num_heads = spec.num_heads
        self.ln1 = _norm(spec)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d, bias=False)
        self.ln2 = _norm(spec)
        self.w1 = nn.Linear(d, spec.d_ff, bias=False)
        self.w2 = nn.Linear(spec.d_ff, d, bias=False)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (
            z.view(b, t, self.num_heads, d // self.num_heads).transpose(1, 2) for z in (q, k, v)
        )
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.w2(F.gelu(self.w1(self.ln2(x))))


class TransformerLM(nn.Module):
    def __init__(self, spec: LMSpec):
        super().__init__()
        self.spec = spec
        self.token_embeddings = nn.Embedding(spec.vocab_size, spec.d_model)
        self.position_embeddings = nn.Embedding(spec.context_length, spec.d_model)
        self.layers = nn.ModuleList(Block(spec) for _ in range(spec.num_layers))
        self.ln_final = _norm(spec)
        self.lm_head = nn.Linear(spec.d_model, spec.vocab_size, bias=False)
        std = 1 / math.sqrt(spec.d_model)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=std)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        t = tokens.shape[-1]
        pos = torch.arange(t, device=tokens.device)
        x = self.token_embeddings(tokens) + self.position_embeddings(pos)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.ln_final(x))
