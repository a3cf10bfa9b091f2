"""The ``float64-bound`` property: in a case that computes below float64, every synchronised
gradient a rank records is within a derived bound of the exact gradient, computed in float64 at
the parameters the target started the step from (Note [A bound against the float64 gradient] in
``paracheck.oracle.exact``).

Reads from each ``RankRecord``: per step, the synchronised ``grads`` (where the kind records
them) and rank 0's ``params`` after the previous step (where every step starts: the target's own
trajectory, so a wrong step does not carry into the next one's verdict). Compares with the
float64 oracle, not the matched-precision one: it is the referee of how far a precision may move
a gradient, independent of where the matched oracle puts its casts.
"""

from __future__ import annotations

import torch

from paracheck.cases import Case
from paracheck.check.kinds import KINDS
from paracheck.check.properties._case import param_names
from paracheck.check.properties._divergence import Divergence, two_numbers
from paracheck.check.ranks.record import RankRecord
from paracheck.oracle import train
from paracheck.oracle.exact import exact_gradients, judged_here

__all__ = ["NAME", "SLACK", "bound_ratio", "check_float64_bound", "oracle_ratios"]

NAME = "float64-bound"
SLACK = 1 + 1e-9  # the bound's own float64 evaluation


def check_float64_bound(
    case: Case,
    traj,
    ranks: list[RankRecord],
    kind: str,
    *,
    device_type: str = "cpu",
    judged_from: dict[int, int] | None = None,
    measured: dict | None = None,
) -> Divergence | None:
    """The first gradient on any rank outside its bound, as a Divergence, or None (also where the
    case is not judged: ``judged_here``). ``measured["float64-bound"]``: the largest ratio of a
    judged gradient's difference to its bound, where every one is inside."""
    # A kind whose ranks compute their gradients their own way (a loop scales its loss as it
    # declares) has no bound derived from the oracle's operations.
    if not KINDS[kind].derived_bound or judged_here(case) is not None:
        return None
    if not ranks or not ranks[0].steps:
        return None
    if any(len(r.steps) != len(traj.steps) for r in ranks):
        return None  # the equivalence family reports the structure
    starts = [traj.initial_params] + [s.params for s in ranks[0].steps[:-1]]
    if any(len(s) != len(traj.initial_params) for s in starts):
        return None
    if any(
        a is None or tuple(a.shape) != tuple(b.shape)
        for s in starts
        for a, b in zip(s, traj.initial_params)
    ):
        return None
    exact = exact_gradients(case, starts, [s.skipped for s in traj.steps], device_type)
    names = param_names(case)
    worst = 0.0
    for k, ex in enumerate(exact):
        for r, rec in enumerate(ranks):
            grads = rec.steps[k].grads
            if grads is None or len(grads) != len(ex.grads):
                continue
            for i, (got, v, bound) in enumerate(zip(grads, ex.grads, ex.bounds)):
                if v is None or got is None or tuple(got.shape) != tuple(v.shape):
                    continue  # not judged here, or the equivalence family's to report
                if judged_from is not None and k < judged_from.get(i, 0):
                    continue
                ratio = bound_ratio(got, v, bound)
                if ratio > SLACK:
                    return _outside(k, r, i, names[i] if i < len(names) else None, got, v, bound)
                worst = max(worst, ratio)
    if measured is not None:
        measured[NAME] = worst
    return None


def oracle_ratios(case: Case, device: str | None = None) -> list[tuple[int, int, float]]:
    """(step, parameter index, ``bound_ratio``) of every gradient the matched-precision oracle
    computes for ``case`` (a correct computation of its program: its local gradients on
    ``device``'s kernels, else the CPU's), against the bound at the oracle's own parameters:
    how close a correct computation comes to the bound."""
    on = "cpu" if device is None else torch.device(device).type
    traj = train(case, device=None if on == "cpu" else device)
    starts = [traj.initial_params] + [s.params for s in traj.steps[:-1]]
    exact = exact_gradients(case, starts, [s.skipped for s in traj.steps], on)
    return [
        (k, i, bound_ratio(g, v, b))
        for k, (s, ex) in enumerate(zip(traj.steps, exact))
        for i, (g, v, b) in enumerate(zip(s.grads, ex.grads, ex.bounds))
        if v is not None and g is not None
    ]


def bound_ratio(got: torch.Tensor, v: torch.Tensor, bound: torch.Tensor) -> float:
    """The largest |got - v| / bound over the judged elements (those of finite bound: Note
    [Overflow is not judged]); inf where a judged element of ``got`` is not finite; 0.0 where
    none is judged. Above ``SLACK``: outside the bound."""
    judged = torch.isfinite(bound)
    if not bool(judged.any()):
        return 0.0
    g = got.detach().to(torch.float64).cpu()[judged]
    diff = (g - v[judged]).abs()
    if not bool(torch.isfinite(diff).all()):
        return float("inf")
    return (diff / bound[judged].clamp_min(1e-300)).max().item()


def _outside(k: int, r: int, i: int, name, got, v, bound) -> Divergence:
    """The Divergence of a gradient ``bound_ratio`` put outside its bound: its worst element."""
    g = got.detach().to(torch.float64).cpu()
    diff = (g - v).abs()
    allowed = bound * SLACK
    # A non-finite bound is an element that may have overflowed (Note [Overflow is not judged]):
    # not judged. Elsewhere a nan or infinite gradient is outside.
    bad = torch.isfinite(allowed) & ~(diff <= allowed)
    over = torch.where(bad, diff - allowed, torch.zeros_like(diff))
    over = torch.where(torch.isnan(over), torch.full_like(over, float("inf")), over)
    j = int(over.flatten().argmax())
    ratio = (diff / allowed.clamp_min(1e-300)).flatten()[j].item()
    pair = two_numbers(g.flatten()[j].item(), v.flatten()[j].item())
    beyond = two_numbers(diff.flatten()[j].item(), allowed.flatten()[j].item(), least=4)
    return Divergence(
        k,
        NAME,
        r,
        i,
        name,
        diff.flatten()[j].item(),
        allowed.flatten()[j].item(),
        f"element {j}: got {pair[0]}, the float64 gradient at the same "
        f"parameters is {pair[1]}, |difference| {beyond[0]} "
        f"where rounding in this precision allows at most {beyond[1]} "
        f"({int(bad.sum())} of {g.numel()} elements outside)",
        ratio,
    )
