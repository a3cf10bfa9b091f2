"""Reference RMSNorm: the specification every RMSNorm kernel must equal.

``y = x / sqrt(mean(x**2, -1) + eps) * weight`` over the last dimension of ``x``; ``weight`` has
shape ``(d,)``. Computed in float64 from the exactly upcast inputs, then cast back to ``x.dtype``
(so for float64 inputs nothing is rounded but the float64 arithmetic itself). Pure torch: this
module imports neither ``torch.distributed`` nor triton.
"""

from __future__ import annotations

import torch

__all__ = ["rms_norm_reference", "rms_norm_reference_grads"]


def _rms_norm_float64(x64: torch.Tensor, w64: torch.Tensor, eps: float) -> torch.Tensor:
    # eps sits INSIDE the square root; putting it outside is a classic bug (see the mutants).
    rstd = torch.rsqrt(x64.square().mean(dim=-1, keepdim=True) + eps)
    return x64 * rstd * w64


def _check(x: torch.Tensor, weight: torch.Tensor) -> None:
    if x.dim() < 1 or weight.dim() != 1 or x.shape[-1] != weight.shape[0]:
        raise ValueError(
            f"weight.shape={tuple(weight.shape)} must be (d,) with d = x.shape[-1] "
            f"(x.shape={tuple(x.shape)})"
        )


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of ``x`` over its last dimension, computed in float64, returned in ``x.dtype``."""
    _check(x, weight)
    y = _rms_norm_float64(x.detach().double(), weight.detach().double(), float(eps))
    return y.to(x.dtype)


def rms_norm_reference_grads(
    x: torch.Tensor, weight: torch.Tensor, dy: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(dx, dweight)`` of ``sum(rms_norm(x, weight) * dy)`` by float64 autograd.

    ``dx`` is returned in ``x.dtype`` and ``dweight`` in ``weight.dtype``.
    """
    _check(x, weight)
    if dy.shape != x.shape:
        raise ValueError(f"dy.shape={tuple(dy.shape)} must equal x.shape={tuple(x.shape)}")
    with torch.enable_grad():
        x64 = x.detach().double().requires_grad_(True)
        w64 = weight.detach().double().requires_grad_(True)
        y64 = _rms_norm_float64(x64, w64, float(eps))
        dx, dw = torch.autograd.grad(y64, (x64, w64), grad_outputs=dy.detach().double())
    return dx.to(x.dtype), dw.to(weight.dtype)
