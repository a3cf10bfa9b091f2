"""Three small models to check a data-parallel wrapper on (``paracheck check TARGET --model
examples/models.py:moe --batch examples/models.py:moe_batch``; docs/guide.md, "Your own model").

Each model is a pair of functions, ``build(seed, dtype) -> nn.Module`` and
``batch(seed, n, dtype) -> (inputs, targets)``, and optionally a loss ``loss(output, targets)``:

* ``moe`` / ``moe_batch``: a top-1-routed mixture of experts. Each row goes to one expert, so an
  expert no row of a rank's batch chose has no gradient on that rank (and none anywhere when no
  rank chose it): the data-dependent structure where a wrapper that skips a ``None`` gradient
  hangs or pairs the wrong tensors.
* ``tied_lm`` / ``lm_batch`` / ``lm_loss``: a tiny language model whose output head is its token
  embedding (one weight, two uses: a lookup and a matrix product).
* ``torch_encoder`` / ``encoder_batch``: a model written elsewhere, PyTorch's own
  ``nn.TransformerEncoder`` (two layers, dropout off), regressing each position's features.
* ``frozen_bn`` / ``bn_batch``: a network with BatchNorm in eval mode, its running statistics
  drawn from the seed as a pretrained network's would be: buffers a wrapper must broadcast.
  ``batchnorm`` is the same network in training mode, which paracheck refuses (exit 2, the module
  named): a BatchNorm in training normalises each rank's rows with their own statistics, so no
  data-parallel wrapper can equal one process on the global batch.

Every function draws only from torch's global generator, which paracheck seeds with ``seed``.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = [
    "batchnorm",
    "bn_batch",
    "frozen_bn",
    "lm_batch",
    "lm_loss",
    "moe",
    "moe_batch",
    "tied_lm",
    "torch_encoder",
    "encoder_batch",
]

MOE_IN, MOE_HIDDEN, MOE_OUT, MOE_EXPERTS = 4, 6, 3, 4
LM_VOCAB, LM_WIDTH, LM_CONTEXT = 11, 8, 5
BN_IN, BN_HIDDEN, BN_OUT = 5, 6, 2
ENC_WIDTH, ENC_HEADS, ENC_FF, ENC_LAYERS, ENC_CONTEXT = 8, 2, 16, 2, 4


class TopOneMoE(nn.Module):
    """A router and ``experts`` two-layer experts; each row's output is its chosen expert's,
    scaled by the router's probability of it (so the router gets a gradient)."""

    def __init__(self, d_in: int, d_hidden: int, d_out: int, experts: int):
        super().__init__()
        self.router = nn.Linear(d_in, experts)
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(d_in, d_hidden), nn.Tanh(), nn.Linear(d_hidden, d_out))
            for _ in range(experts)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = torch.softmax(self.router(x), dim=-1)
        choice = gate.argmax(dim=-1)
        outs, where = [], []
        for e, expert in enumerate(self.experts):
            rows = (choice == e).nonzero().flatten()
            if rows.numel():  # an idle expert is not called: its parameters get no gradient
                outs.append(expert(x[rows]) * gate[rows, e : e + 1])
                where.append(rows)
        # Back in row order; in the experts' own dtype (a wrapper may compute in another).
        order = torch.cat(where).argsort()
        return torch.cat(outs)[order]


def moe(seed: int, dtype: torch.dtype) -> nn.Module:
    return TopOneMoE(MOE_IN, MOE_HIDDEN, MOE_OUT, MOE_EXPERTS).to(dtype)


def moe_batch(seed: int, n: int, dtype: torch.dtype):
    return torch.randn(n, MOE_IN, dtype=dtype), torch.randn(n, MOE_OUT, dtype=dtype)


class TiedLM(nn.Module):
    """Token embedding, a causal running mean over positions, a residual MLP with LayerNorm, and
    logits through the token embedding's own weight (tied)."""

    def __init__(self, vocab: int, width: int, context: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.position = nn.Parameter(torch.randn(context, width) * 0.1)
        self.norm = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 2 * width), nn.Tanh(), nn.Linear(2 * width, width)
        )

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens) + self.position[: tokens.shape[1]]
        steps = torch.arange(1, tokens.shape[1] + 1, dtype=h.dtype, device=h.device)
        h = h.cumsum(dim=1) / steps[:, None]  # each position sees itself and the ones before
        h = h + self.mlp(self.norm(h))
        return h @ self.embed.weight.t()  # the head is the embedding: one weight, two uses


def tied_lm(seed: int, dtype: torch.dtype) -> nn.Module:
    return TiedLM(LM_VOCAB, LM_WIDTH, LM_CONTEXT).to(dtype)


def lm_batch(seed: int, n: int, dtype: torch.dtype):
    tokens = torch.randint(0, LM_VOCAB, (n, LM_CONTEXT + 1))
    return tokens[:, :-1], tokens[:, 1:]


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The mean cross-entropy over the batch's tokens (every row has as many)."""
    return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())


def _bn_net(dtype: torch.dtype) -> nn.Module:
    net = nn.Sequential(
        nn.Linear(BN_IN, BN_HIDDEN),
        nn.BatchNorm1d(BN_HIDDEN),
        nn.Tanh(),
        nn.Linear(BN_HIDDEN, BN_OUT),
    )
    norm = net[1]
    with torch.no_grad():  # statistics a pretrained network would have, drawn from the seed
        norm.running_mean.normal_()
        norm.running_var.uniform_(0.5, 1.5)
    return net.to(dtype)


def frozen_bn(seed: int, dtype: torch.dtype) -> nn.Module:
    """BatchNorm in eval mode (frozen statistics): each row is normalised on its own."""
    net = _bn_net(dtype)
    net[1].eval()
    return net


def batchnorm(seed: int, dtype: torch.dtype) -> nn.Module:
    """BatchNorm in training mode: refused by paracheck (the module docstring says why)."""
    return _bn_net(dtype)


def bn_batch(seed: int, n: int, dtype: torch.dtype):
    return torch.randn(n, BN_IN, dtype=dtype), torch.randn(n, BN_OUT, dtype=dtype)


def torch_encoder(seed: int, dtype: torch.dtype) -> nn.Module:
    """``torch.nn.TransformerEncoder`` as PyTorch ships it; dropout off (paracheck refuses a
    model whose two forwards of one batch differ)."""
    layer = nn.TransformerEncoderLayer(
        ENC_WIDTH, ENC_HEADS, dim_feedforward=ENC_FF, dropout=0.0, batch_first=True
    )
    return nn.TransformerEncoder(layer, ENC_LAYERS, enable_nested_tensor=False).to(dtype)


def encoder_batch(seed: int, n: int, dtype: torch.dtype):
    shape = (n, ENC_CONTEXT, ENC_WIDTH)
    return torch.randn(shape, dtype=dtype), torch.randn(shape, dtype=dtype)
