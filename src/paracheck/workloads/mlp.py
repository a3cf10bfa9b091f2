"""MLP workloads built deterministically from a frozen, JSON-serialisable spec.

The features exist to reach the corners where data-parallel bugs live:

- ``widths`` may contain 1-element and odd-sized layers;
- ``bias`` adds 1-D parameters (the classic "only averaged 2-D tensors" bug);
- ``frozen`` marks parameters ``requires_grad=False`` that are still used in forward;
- ``tied`` inserts a square block applied twice (one Parameter, two uses in the graph);
- ``unused`` adds a branch that is never used (``"always"``) or used only when the first input
  of the local batch is positive (``"data"``), so a parameter can have a gradient on one rank and
  none on another;
- ``buffer`` registers a non-trainable input scale (it must be broadcast like the parameters);
- ``float32_layer`` keeps one layer's parameters in another dtype than the model's: float32,
  or float64 in a float32 model (its input is cast to that dtype and its output back), so the
  model has parameters of two dtypes whatever dtype it is built in: one flat buffer per dtype,
  or a bucket that mixes them, is where that breaks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

__all__ = ["MLPSpec", "MLP"]


@dataclass(frozen=True)
class MLPSpec:
    """A stack of ``Linear -> tanh`` layers; the last layer has no activation."""

    in_features: int = 4
    widths: tuple[int, ...] = (3,)
    bias: bool = True
    frozen: tuple[str, ...] = ()
    tied: bool = False
    unused: str = "none"  # "none" | "always" | "data"
    buffer: bool = False
    float32_layer: int | None = None  # index into ``widths``

    kind = "mlp"

    def __post_init__(self):
        if self.in_features < 1:
            raise ValueError(f"in_features={self.in_features} must be >= 1")
        if not self.widths or any(w < 1 for w in self.widths):
            raise ValueError(f"widths={self.widths!r} must be a non-empty tuple of ints >= 1")
        if self.unused not in ("none", "always", "data"):
            raise ValueError(f"unused={self.unused!r} must be 'none', 'always' or 'data'")
        object.__setattr__(self, "widths", tuple(int(w) for w in self.widths))
        if self.float32_layer is not None and not 0 <= self.float32_layer < len(self.widths):
            raise ValueError(
                f"float32_layer={self.float32_layer!r} must be None or a layer index in "
                f"0..{len(self.widths) - 1}"
            )
        object.__setattr__(self, "frozen", tuple(self.frozen))

    @property
    def out_features(self) -> int:
        return self.widths[-1]


def other_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of ``MLPSpec.float32_layer`` in a model of ``dtype``: float32, or float64 in a
    float32 model."""
    return torch.float64 if dtype == torch.float32 else torch.float32


class _Float32Linear(nn.Linear):
    """A Linear whose parameters stay in ``own_dtype`` through ``module.to(...)`` (another dtype
    than the model's: ``other_dtype``). It computes in its own dtype and returns its input's."""

    def __init__(
        self, in_features: int, out_features: int, bias: bool = True, *, own_dtype: torch.dtype
    ):
        super().__init__(in_features, out_features, bias=bias, dtype=own_dtype)
        self.own_dtype = own_dtype

    def _apply(self, fn, recurse=True):
        own = self.own_dtype
        return super()._apply(lambda t: fn(t).to(own) if t.is_floating_point() else fn(t), recurse)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.to(self.weight.dtype)).to(x.dtype)


class MLP(nn.Module):
    scale: torch.Tensor  # the buffer registered when spec.buffer

    def __init__(self, spec: MLPSpec, *, dtype: torch.dtype = torch.float64):
        """``dtype``: the dtype the model will be moved to, which fixes the other layer's
        (``other_dtype``)."""
        super().__init__()
        self.spec = spec
        sizes = (spec.in_features, *spec.widths)
        self.layers = nn.ModuleList(
            _Float32Linear(a, b, bias=spec.bias, own_dtype=other_dtype(dtype))
            if i == spec.float32_layer
            else nn.Linear(a, b, bias=spec.bias)
            for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:]))
        )
        if spec.tied:
            # One module registered under two names: parameters() yields its weight once,
            # forward uses it twice, so autograd sums two contributions into one .grad.
            self.tied = nn.Linear(spec.widths[0], spec.widths[0], bias=False)
            self.tied_again = self.tied
        if spec.unused != "none":
            self.branch = nn.Linear(spec.in_features, spec.out_features, bias=spec.bias)
        if spec.buffer:
            self.register_buffer("scale", torch.ones(spec.in_features))
        for name, p in self.named_parameters():
            if name in spec.frozen:
                p.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.spec.buffer:
            x = x * self.scale
        inp = x
        h = x
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            h = layer(h)
            if i == 0 and self.spec.tied:
                h = torch.tanh(h)
                h = self.tied_again(torch.tanh(self.tied(h)))
            if i < last:
                h = torch.tanh(h)
        if self.spec.unused == "data" and bool(inp[0, 0] > 0):
            h = h + self.branch(inp)
        return h
