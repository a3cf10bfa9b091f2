"""Model builders from frozen specs, and the deterministic data every rank and the oracle share."""

from __future__ import annotations

import torch
from torch import nn

from paracheck.workloads.lm import LM_SIZES, LMSpec, TransformerLM, lm_parameter_count
from paracheck.workloads.mlp import MLP, MLPSpec
from paracheck.workloads.toy import ToyModel, ToyModelWithTiedWeights, ToySpec

__all__ = [
    "LM_SIZES",
    "LMSpec",
    "MLP",
    "MLPSpec",
    "ToyModel",
    "ToyModelWithTiedWeights",
    "ToySpec",
    "TransformerLM",
    "build_model",
    "lm_parameter_count",
    "model_spec_from_dict",
    "model_spec_to_dict",
]

_KINDS = {"mlp": MLPSpec, "toy": ToySpec, "lm": LMSpec}


def build_model(spec, *, seed: int, dtype: torch.dtype = torch.float64, device="cpu") -> nn.Module:
    """Build the model of ``spec`` with every parameter and buffer drawn from ``seed``.

    The same (spec, seed, dtype) gives bitwise the same model in any process. Parameters and
    buffers are redrawn uniformly in [-1/sqrt(fan_in), 1/sqrt(fan_in)] (buffers around 1) from a
    private generator, so the global RNG is neither used nor disturbed.
    """
    if spec.kind == "lm":
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model: nn.Module = TransformerLM(spec)
        return model.to(device=device, dtype=dtype)
    with torch.random.fork_rng(devices=[]):
        model = (
            MLP(spec, dtype=dtype)
            if spec.kind == "mlp"
            else (ToyModelWithTiedWeights() if spec.tied else ToyModel())
        )
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in model.named_parameters():
            fan_in = p.shape[-1] if p.dim() > 1 else max(p.numel(), 1)
            bound = 1.0 / fan_in**0.5
            p.copy_(torch.rand(p.shape, generator=g, dtype=torch.float64) * 2 * bound - bound)
        for _, b in model.named_buffers():
            b.copy_(0.5 + torch.rand(b.shape, generator=g, dtype=torch.float64))
    return model.to(device=device, dtype=dtype)


def model_spec_to_dict(spec) -> dict:
    from dataclasses import asdict

    return {"kind": spec.kind, **asdict(spec)}


def model_spec_from_dict(d: dict):
    d = dict(d)
    kind = d.pop("kind")
    if kind not in _KINDS:
        raise ValueError(f"kind={kind!r} must be one of {sorted(_KINDS)}")
    cls = _KINDS[kind]
    for key in ("widths", "frozen"):
        if key in d:
            d[key] = tuple(d[key])
    return cls(**d)
