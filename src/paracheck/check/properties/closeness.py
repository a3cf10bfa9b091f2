"""How close a rank's tensor is to the oracle's (``close``), and where and how it is not
(``worst_element``, ``whole_factor``): the comparison every property of the equivalence family
makes (``paracheck.check.properties.equivalence``)."""

from __future__ import annotations

import math

import torch

from paracheck.check.properties._divergence import (
    SCALED,
    UNCHANGED,
    UPDATE_CLOSE,
    UPDATE_WRONG,
    two_numbers,
)
from paracheck.oracle.tolerance import UNIT_ROUNDOFF

__all__ = ["close", "update_terms", "whole_factor", "worst_element", "wrong_how"]


# Note [Terms of an update]
#   A parameter after a step is p + d (d the update), a momentum buffer mu * b + g, Adam's first
#   moment beta * m + (1 - beta) * g: sums whose result can be far smaller than its terms. A
#   correct design computes the terms by the same formula from values within rounding of the
#   oracle's, so their results differ by a few units in the last place *of the terms*, and
#   rounded in the parameters' dtype that can be many ulps of a result near zero (measured on
#   correct designs with bfloat16 parameters: a 1-element weight off by 4.9e-4 after an SGD step
#   from 5e-2 to 1e-3, against an allowed 5.9e-5; a momentum buffer of 2e-2 built from terms
#   near 1, off by 2**-7 against an allowed 9.4e-4). So the comparison's scale is the largest
#   magnitude among the terms, not only the result's: the parameters before the step, and for
#   the state, its value before the step and the step's gradient (``update_terms``); the relative
#   tolerance itself is unchanged. A wrong update still differs by its own size, which is the
#   size of the terms it got wrong.
def update_terms(*tensors) -> torch.Tensor | None:
    """The finite elements of every given tensor, flattened into one float64 vector: the scale
    source of Note [Terms of an update]. None where no tensor is given."""
    parts = [
        t.detach().to(torch.float64).cpu().flatten()
        for t in tensors
        if isinstance(t, torch.Tensor) and t.numel()
    ]
    if not parts:
        return None
    flat = torch.cat(parts)
    return flat[torch.isfinite(flat)]


def close(got, ref, rtol: float, scale_src=None):
    """(ok, max_abs_diff, allowed_at_worst, worst_ratio) under |got-ref| <= rtol*(|ref|+scale)."""
    if got is None or ref is None:
        both = got is None and ref is None
        return both, (0.0 if both else float("inf")), 0.0, (0.0 if both else float("inf"))
    got = got.detach().to(torch.float64).cpu()
    ref = ref.detach().to(torch.float64).cpu()
    if got.shape != ref.shape:
        return False, float("inf"), 0.0, float("inf")
    finite = torch.isfinite(ref)
    if not torch.equal(torch.isfinite(got), finite):
        return False, float("nan"), 0.0, float("inf")
    got, ref, allowed, scale = _allowed(got, ref, finite, rtol, scale_src)
    diff = (got - ref).abs()
    ok = bool((diff <= allowed).all())
    denom = ref.abs() + scale
    ratio = (diff / denom.clamp_min(1e-300)).max().item() if diff.numel() else 0.0
    if (denom == 0).any() and (diff[denom == 0] > 0).any():
        ratio = float("inf")
    return (
        ok,
        (diff.max().item() if diff.numel() else 0.0),
        (allowed.max().item() if allowed.numel() else 0.0),
        ratio,
    )


def _allowed(got, ref, finite, rtol: float, scale_src):
    """The finite elements of ``got`` and ``ref`` (float64, CPU), each one's allowed difference,
    and the scale: ``close``'s rule."""
    if not finite.all():
        # Not finite in the oracle too (a scaled gradient the GradScaler never saw: a parameter
        # outside the optimizer's groups): the same elements must be, and the rest are compared.
        got, ref = got[finite], ref[finite]
        if scale_src is not None:
            scale_src = scale_src.detach().to(torch.float64).cpu()
            scale_src = scale_src[torch.isfinite(scale_src)]
    src = ref if scale_src is None else scale_src.detach().to(torch.float64).cpu()
    scale = src.abs().max().item() if src.numel() else 0.0
    # An infinite rtol (a derived bound that says nothing: Note [Step 0: a derived bound] with
    # too many terms for the dtype) allows everything, zeros included (inf * 0 is nan).
    allowed = torch.full_like(ref, float("inf")) if math.isinf(rtol) else rtol * (ref.abs() + scale)
    return got, ref, allowed, scale


def worst_element(got, ref, rtol: float, scale_src=None) -> str:
    """Where ``close`` failed worst, in words: the element furthest past its own allowance (the
    largest difference and the largest allowance can be at different elements)."""
    got = got.detach().to(torch.float64).cpu()
    ref = ref.detach().to(torch.float64).cpu()
    g, r, allowed, _ = _allowed(
        got.flatten(),
        ref.flatten(),
        torch.isfinite(ref.flatten()),
        rtol,
        None if scale_src is None else scale_src.flatten(),
    )
    over = (g - r).abs() - allowed
    k = int(over.argmax())
    got_k, expected_k = two_numbers(g[k].item(), r[k].item())
    diff_k, allowed_k = two_numbers(abs(g[k] - r[k]).item(), allowed[k].item(), least=4)
    return (
        f"worst element #{k} (of the finite ones): got {got_k}, expected "
        f"{expected_k}, |got - expected| = {diff_k} where {allowed_k} is allowed"
    )


def whole_factor(got, ref) -> str | None:
    """The whole factor k (2 to 8) or 1/k at which every element of ``got`` stands to ``ref``'s,
    as a sum where a mean is due puts it, or None (Note [A scaled value] in
    ``paracheck.check.properties._divergence``)."""
    g = got.detach().to(torch.float64).cpu().flatten()
    r = ref.detach().to(torch.float64).cpu().flatten()
    if g.shape != r.shape or not (torch.isfinite(g).all() and torch.isfinite(r).all()):
        return None
    size = r.abs().max().item() if r.numel() else 0.0
    if size == 0.0:
        return None
    dtype = str(got.dtype).removeprefix("torch.")
    within = max(1e-3, 4 * UNIT_ROUNDOFF.get(dtype, 0.0)) * size
    for k in range(2, 9):
        if (g - k * r).abs().max().item() <= within * k:
            return str(k)
        if (k * g - r).abs().max().item() <= within:
            return f"1/{k}"
    return None


def wrong_how(got, ref, before=None) -> str:
    """What a wrong tensor's detail says of how it is wrong, where it tells two bugs apart
    (``Divergence.how``): every element a whole factor of the oracle's (``whole_factor``); for
    a parameter after a step (``before``: the rank's own before it), not changed by the step where
    the oracle's was, its update a whole factor of the oracle's (Note [A scaled value] in
    ``paracheck.check.properties._divergence``), within 1e-3 of it (a rounding) or another
    update: a parameter is told by its update, not its value (Note [A parameter's update]
    there)."""
    if before is None or before.shape != got.shape or before.shape != ref.shape:
        factor = whole_factor(got, ref)
        return "" if factor is None else f"; {SCALED} {factor} times its expected value"
    start = before.detach().to(torch.float64).cpu()
    update = ref.detach().to(torch.float64).cpu() - start
    if torch.equal(got.detach().cpu(), before.detach().cpu()) and bool(update.ne(0).any()):
        return f"; {UNCHANGED}"
    moved = got.detach().to(torch.float64).cpu() - start
    factor = whole_factor(moved, update)
    if factor is not None:
        return f"; its update: {SCALED} {factor} times its expected value"
    size = update.abs().max().item() if update.numel() else 0.0
    if size > 0.0 and (moved - update).abs().max().item() <= 1e-3 * size:
        return f"; {UPDATE_CLOSE}"
    return f"; {UPDATE_WRONG}"
