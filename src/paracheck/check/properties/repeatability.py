"""The ``repeatability`` property (every kind, opt-in; needs no oracle): the same case run twice
gives bitwise the same result on every rank: the parameters after construction, and the
parameters, synchronised gradients and optimizer state (``state_dict()``, where the kind records
it) after every step.

Equivalence allows rounding: a reduction whose order changes from run to run (contributions
added in the order they arrive, atomics, a race between a communication thread and the
optimizer) stays within the tolerance and passes it, yet no two runs of such a design agree and
a run cannot be reproduced. This property reports that on its own. "Bitwise" is literal: the
bytes of every tensor, so -0.0 differs from 0.0 and a NaN equals a NaN of the same payload.

The second run is a new job on the same World, with nothing carried over but what the target
keeps in module globals (a design whose result depends on how many times it ran fails here).
"""

from __future__ import annotations

import torch

from paracheck.cases import Case
from paracheck.check.properties._case import param_names
from paracheck.check.properties._divergence import Divergence
from paracheck.check.ranks.record import RankRecord
from paracheck.world import World

__all__ = ["NAME", "check_repeatability", "first_difference", "same_bits"]

NAME = "repeatability"

_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def same_bits(x, y) -> bool:
    """Whether ``x`` and ``y`` are the same bytes: tensors of one dtype and shape whose elements
    are bitwise equal (NaN included), numbers and other values by ``==`` (a NaN float by its bits),
    containers element by element. None equals only None."""
    if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
        if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)):
            return False
        if x.dtype != y.dtype or x.shape != y.shape:
            return False
        x, y = x.detach().cpu().contiguous(), y.detach().cpu().contiguous()
        if x.is_complex():
            x, y = torch.view_as_real(x), torch.view_as_real(y)
        if x.is_floating_point():
            as_int = _INT_OF_SIZE[x.element_size()]
            return torch.equal(x.view(as_int), y.view(as_int))
        return torch.equal(x, y)
    if isinstance(x, dict) and isinstance(y, dict):
        return x.keys() == y.keys() and all(same_bits(x[k], y[k]) for k in x)
    if isinstance(x, list | tuple) and isinstance(y, list | tuple):
        return len(x) == len(y) and all(same_bits(a, b) for a, b in zip(x, y))
    if isinstance(x, float) and isinstance(y, float):
        return (
            torch.tensor(x, dtype=torch.float64).view(torch.int64).item()
            == torch.tensor(y, dtype=torch.float64).view(torch.int64).item()
        )
    return type(x) is type(y) and x == y


def _largest_difference(x, y) -> float:
    """max |x - y| over two tensors of one shape (inf where they are not comparable)."""
    if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)) or x.shape != y.shape:
        return float("inf")
    d = (x.detach().cpu().to(torch.float64) - y.detach().cpu().to(torch.float64)).abs()
    return d.max().item() if d.numel() else 0.0


def first_difference(a: list[RankRecord], b: list[RankRecord]):
    """The first (step, what, rank, index, max |difference|) at which the two runs' records
    differ (step -1: after construction), or None where every rank's record is bitwise equal."""
    for rank, (ra, rb) in enumerate(zip(a, b)):
        for i, (x, y) in enumerate(zip(ra.initial_params, rb.initial_params)):
            if not same_bits(x, y):
                return -1, "param", rank, i, _largest_difference(x, y)
        if len(ra.steps) != len(rb.steps):
            return min(len(ra.steps), len(rb.steps)), "steps", rank, None, float("inf")
    for k in range(len(a[0].steps)):
        for rank, (ra, rb) in enumerate(zip(a, b)):
            sa, sb = ra.steps[k], rb.steps[k]
            for what in ("grads", "params"):
                xs, ys = getattr(sa, what), getattr(sb, what)
                if (xs is None) != (ys is None):
                    return k, what[:-1], rank, None, float("inf")
                for i, (x, y) in enumerate(zip(xs or (), ys or ())):
                    if not same_bits(x, y):
                        return k, what[:-1], rank, i, _largest_difference(x, y)
            if not same_bits(sa.state, sb.state):
                index = None
                if isinstance(sa.state, dict) and isinstance(sb.state, dict):
                    index = next(
                        (
                            i
                            for i in sorted(set(sa.state) | set(sb.state), key=str)
                            if not same_bits(sa.state.get(i), sb.state.get(i))
                        ),
                        None,
                    )
                return k, "state", rank, index, float("nan")
    return None


def check_repeatability(
    world: World, target, case: Case, ranks: list[RankRecord], *, timeout=None
) -> Divergence | None:
    """Run ``case`` once more (``ranks``: its first run) and compare every rank's record bitwise."""
    again = world.run(target.rank_fn, target.job(case), world_size=case.world_size, timeout=timeout)
    if ranks[0].skipped is not None or again[0].skipped is not None:
        return None
    found = first_difference(ranks, again)
    if found is None:
        return None
    step, what, rank, index, diff = found
    names = param_names(case)
    name = names[index] if isinstance(index, int) and index < len(names) else None
    return Divergence(
        step,
        NAME,
        rank,
        index if isinstance(index, int) else None,
        name,
        diff,
        0.0,
        f"the {what} differ bitwise between two runs of the same case",
    )
