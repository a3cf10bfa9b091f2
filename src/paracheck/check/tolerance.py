"""The tolerance policy: how far a correct target may differ from the oracle, per dtype.

Note [Where the differences come from]
    Rank r's local gradient is computed by the same operations, on the same inputs, in the target
    and in the oracle. What differs is the order of the sum over ranks (gloo/NCCL reduce in their
    own order; the oracle sums rank 0..W-1) and the sum over micro-steps, then one division by W.
    For n = W * accumulation terms, two summation orders differ by at most 2(n-1) u sum|g_rm|
    (u the unit roundoff), elementwise: the bound is proportional to ``grad_absum``, which the
    oracle returns. After the first step the parameters differ by the optimizer's image of that
    error, and the next step's gradients inherit it through the loss curvature; Adam divides by
    sqrt(v)+eps and can amplify a gradient difference by lr/eps. A rigorous bound for the whole
    trajectory is not tractable, so the policy is relative, per tensor:

        |got - ref| <= rtol * (|ref| + scale)   elementwise,

    with ``scale`` = max|ref| over the tensor for parameters and optimizer state, and the max of
    ``grad_absum`` over the tensor for gradients (so structurally-zero elements need no special
    case, and an element near zero is judged on the tensor's scale, not on its own).

    float64 (gloo/NCCL): rtol = 1e-10. Measured on correct targets (every built-in, ci profile,
    world sizes 1..6, up to 4 steps, SGD/momentum/Adam/AdamW, 2026-11-22): worst observed
    |got-ref|/(|ref|+scale) is 1.2e-16 for the DDP family and 3.3e-16 for ZeRO-1 (``CheckReport.
    worst_ratio``, printed by ``paracheck check``), six orders below. The smallest planted bug
    effect measured (forgetting to divide by W under AdamW, float64 parameters: 8.4e-7) is four
    orders above; gradient comparison catches it at relative error ~1.
    float32: rtol = 5e-4 for gradients, 1e-4 for parameters and state: the target computes forward
    and backward in float32 (u = 6e-8) through ~10 layers and accumulations (the oracle runs the
    same float32 computation on the CPU). Measured on gloo/CPU (2026-11-22) correct targets reach
    3.7e-5 (torch DDP, parameters) and 1.2e-5 (FlatDDP); on 2 H200s over NCCL every built-in
    passed (tests/property/test_gpu_nccl.py). The parameter margin is thin (2.7x): widen it only
    with a measurement, never to make a failure go away. A gradient scaled by W (the classic bug) is off by
    a relative (W-1)/W >= 0.5 and is caught by the gradient comparison even where Adam hides it in
    the parameters (DESIGN.md: 4.8e-7 in float32 parameters, inside noise).
    bfloat16 (u = 4e-3): rtol = 5e-2 for gradients, 2e-2 for parameters.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Tolerance", "TOLERANCES", "tolerance_for"]


@dataclass(frozen=True)
class Tolerance:
    grads: float
    params: float
    state: float


TOLERANCES: dict[str, Tolerance] = {
    "float64": Tolerance(grads=1e-10, params=1e-10, state=1e-10),
    "float32": Tolerance(grads=5e-4, params=1e-4, state=1e-4),
    "bfloat16": Tolerance(grads=5e-2, params=2e-2, state=2e-2),
}


def tolerance_for(dtype: str) -> Tolerance:
    if dtype not in TOLERANCES:
        raise ValueError(f"dtype={dtype!r} has no tolerance entry; known: {sorted(TOLERANCES)}")
    return TOLERANCES[dtype]
