"""The precision of a case (``paracheck.cases``): where its casts happen, its loss scaling, its
master weights."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import torch

from paracheck.cases._case import AUTOCAST_DTYPES

if TYPE_CHECKING:
    from paracheck.cases._case import Case

__all__ = ["BACKOFF", "GROWTH_INTERVAL", "build_grad_scaler", "forward_context"]


# Note [Precision of a case]
#   What a case's precision fixes is where every cast happens, so that the oracle (one process,
#   the CPU) applies the same casts in the same places as the ranks: parameters and gradients of
#   ``dtype``; each forward under ``torch.autocast(device_type, autocast)`` (matmuls and linears in
#   bfloat16 or float16, the loss in float32: ``loss_fn``); gradients synchronised in their own
#   dtype (a float32 parameter's gradient is float32 however the forward computed); and with
#   ``loss_scale``, losses multiplied by the scaler's scale before backward and gradients divided
#   by it after synchronisation (a power of two: exact both ways). The scaler never grows within a
#   case (``GROWTH_INTERVAL`` steps) and backs off to ``loss_scale * BACKOFF``: a case whose loss
#   scale is 2**40 overflows float16 in its first backward on every rank (every step it runs is
#   skipped, and the next runs at 2**8), one at 2**8 does not overflow on these models; so whether a
#   step is skipped is never decided by a value within rounding of float16's largest (65504), where
#   a rank and the oracle summing in another order could decide differently.
GROWTH_INTERVAL = 2**10
BACKOFF = 2.0**-32


# Note [Master weights]
#   Mixed-precision training keeps the model's parameters in bfloat16 for the forward and the
#   backward, and lets the optimizer step float32 copies of them, the master weights (ZeRO's and
#   Megatron's "fp32 master params"): an update smaller than half a bfloat16 ulp of its parameter
#   (lr 1e-3 on a weight of 0.5: the ulp is 2**-8) would be rounded away every step if the
#   bfloat16 parameter itself were stepped, and a model with its learning rate at such values stops
#   learning. With ``Case.master_weights`` the oracle does what such an optimizer does: its
#   optimizer holds one float32 master per parameter (every piece of optimizer state is float32
#   too); before each step a master's gradient is its parameter's synchronised gradient in
#   float32 (exact), and after it each parameter is its master rounded to bfloat16
#   (``paracheck.oracle.train.train``). A sharding target declares master weights with a
#   ``master_params()`` method (``paracheck.check.targets.Target.master_weights``), and its masters
#   are compared with the oracle's after every step (Note [Comparing master weights]).


# Note [Compute dtype of an FSDP]
#   ``FSDP(module, compute_dtype=torch.bfloat16)`` over a float32 module keeps the float32
#   parameters, sharded, as what the optimizer steps, and runs every forward and backward on
#   their bfloat16 copies: the float32 shards are the master weights, and the bfloat16
#   parameters exist only while a module runs. That is ``Case.master_weights`` with the masters
#   starting as the float32 model (``masters_from_float32``): the oracle builds the model in
#   float32, keeps those as its masters and computes with them rounded to bfloat16 (one
#   rounding, float32 -> bfloat16, as the wrapper's cast is). The inputs are the case's, in
#   bfloat16 (a wrapper that casts its floating inputs to ``compute_dtype`` changes nothing).
#   Where the wrapper reduces the bfloat16 gradients (in bfloat16, or upcast to float32 first:
#   torch's ``MixedPrecisionPolicy`` offers both) rounds the mean differently, never what it
#   is: the gradients are compared at bfloat16's tolerance, and the float32 masters' update is
#   judged on the wrapper's own gradients (Note [Comparing master weights]). A buffer or a layer
#   kept in float32 is computed in float32 beside bfloat16 activations, which neither the
#   wrapper nor torch's casts; such cases are not drawn (``paracheck.check.run``).


def forward_context(case: Case, device="cpu"):
    """The context every forward of ``case`` runs in: ``torch.autocast`` with ``case.autocast`` on
    ``device``'s type, or nothing."""
    if case.autocast is None:
        return contextlib.nullcontext()
    return torch.autocast(
        torch.device(device).type,
        dtype=AUTOCAST_DTYPES[case.autocast],
        cache_enabled=case.autocast_cache,
    )


def build_grad_scaler(case: Case, device="cpu"):
    """``torch.amp.GradScaler`` for ``case.loss_scale`` on ``device``'s type, or None."""
    if case.loss_scale is None:
        return None
    return torch.amp.GradScaler(
        torch.device(device).type,
        init_scale=float(case.loss_scale),
        backoff_factor=BACKOFF,
        growth_interval=GROWTH_INTERVAL,
    )
