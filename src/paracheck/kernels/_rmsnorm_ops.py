"""The Triton RMSNorm as ``torch.library`` custom ops, for ``torch.compile`` (Note [compiled
callers] in ``paracheck.kernels.rmsnorm``, which registers them at import through
``register_ops``, handing in its launchers so this module does not import it).

Four ops, each with a fake (meta) implementation, the forwards with their autograd:

* ``paracheck::rms_norm_forward`` / ``paracheck::rms_norm_backward``: ``torch.library.triton_op``
  (torch >= 2.6), the launches wrapped by ``wrap_triton`` so Inductor sees the kernels and
  launches them from its own generated code; their fake implementation is their body, which
  allocates and launches nothing on fake tensors.
* ``paracheck::rms_norm_forward_opaque`` / ``paracheck::rms_norm_backward_opaque``:
  ``torch.library.custom_op`` (torch >= 2.4), opaque to the compiler (it calls them as external
  kernels), with explicit fake implementations. The interpreter runs through them: a kernel run
  by ``TRITON_INTERPRET=1`` is plain Python that executes at once, so it cannot be traced into a
  graph, and the triton ops call the opaque ones when interpreting. Where torch has no
  ``triton_op`` the opaque ops are the compiled path.

Outputs: y and dx are contiguous with x's shape and dtype; rstd is float32, one per row; dweight
has weight's shape and dtype.
"""

from __future__ import annotations

import torch

from paracheck.kernels._rmsnorm_kernels import interpreting, triton

__all__ = ["register_ops"]


def _fake_forward(x: torch.Tensor, weight: torch.Tensor, eps: float) -> list[torch.Tensor]:
    rows = x.numel() // x.shape[-1]
    return [
        torch.empty(x.shape, dtype=x.dtype, device=x.device),
        torch.empty((rows,), dtype=torch.float32, device=x.device),
    ]


def _fake_backward(dy, x, weight, rstd) -> list[torch.Tensor]:
    return [
        torch.empty(x.shape, dtype=x.dtype, device=x.device),
        torch.empty(weight.shape, dtype=weight.dtype, device=weight.device),
    ]


def _setup_context(ctx, inputs, output):
    x, weight, _ = inputs
    ctx.save_for_backward(x, weight, output[1])


def _autograd(backward_op):
    def backward(ctx, grads):
        x, weight, rstd = ctx.saved_tensors
        dx, dw = backward_op(grads[0], x, weight, rstd)
        return dx, dw, None

    return backward


def register_ops(forward, backward, check):
    """Register the four ops; return the forward op ``torch.compile`` callers use (the triton op
    where torch has ``triton_op``, else the opaque one), or None where torch has no
    ``custom_op`` or triton is absent. ``forward(x, weight, eps, wrap)`` -> (y, rstd) and
    ``backward(dy, x, weight, rstd, wrap)`` -> (dx, dweight) launch the kernels, through ``wrap``
    unless it is None; ``check(x, weight, eps)`` raises ValueError for inputs the kernels do not
    take. Every forward, fake ones included, checks first, so a compiled caller's bad input is
    refused while Dynamo traces (Dynamo cannot trace the check itself: it asks triton whether
    it interprets). Raises RuntimeError if the ops are registered already."""
    custom_op = getattr(torch.library, "custom_op", None)
    if custom_op is None or triton is None:
        return None

    @custom_op("paracheck::rms_norm_forward_opaque", mutates_args=())
    def forward_opaque(x: torch.Tensor, weight: torch.Tensor, eps: float) -> list[torch.Tensor]:
        check(x, weight, eps)
        return list(forward(x, weight, eps, None))

    @custom_op("paracheck::rms_norm_backward_opaque", mutates_args=())
    def backward_opaque(
        dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor
    ) -> list[torch.Tensor]:
        return list(backward(dy, x, weight, rstd, None))

    @forward_opaque.register_fake
    def _(x, weight, eps):
        check(x, weight, eps)
        return _fake_forward(x, weight, eps)

    backward_opaque.register_fake(_fake_backward)
    ops = torch.ops.paracheck
    torch.library.register_autograd(
        "paracheck::rms_norm_forward_opaque",
        _autograd(ops.rms_norm_backward_opaque),
        setup_context=_setup_context,
    )
    triton_op = getattr(torch.library, "triton_op", None)
    wrap_triton = getattr(torch.library, "wrap_triton", None)
    if triton_op is None or wrap_triton is None:
        return ops.rms_norm_forward_opaque

    @triton_op("paracheck::rms_norm_forward", mutates_args=())
    def forward_op(x: torch.Tensor, weight: torch.Tensor, eps: float) -> list[torch.Tensor]:
        check(x, weight, eps)
        if interpreting():
            return ops.rms_norm_forward_opaque(x, weight, eps)
        return list(forward(x, weight, eps, wrap_triton))

    @triton_op("paracheck::rms_norm_backward", mutates_args=())
    def backward_op(
        dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor
    ) -> list[torch.Tensor]:
        if interpreting():
            return ops.rms_norm_backward_opaque(dy, x, weight, rstd)
        return list(backward(dy, x, weight, rstd, wrap_triton))

    torch.library.register_autograd(
        "paracheck::rms_norm_forward",
        _autograd(ops.rms_norm_backward),
        setup_context=_setup_context,
    )
    return ops.rms_norm_forward
