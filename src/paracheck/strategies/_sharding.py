"""Cases for optimizer-state sharding: ``cases()`` with the corners sharding bugs live in.

Composes ``paracheck.strategies.cases`` and moves each late parameter group to a drawn step
``k in 1..steps-1`` (``add_param_group`` after step k, not only after the first), with up to
``max_steps`` steps so that state built before the late group keeps being stepped after it.
Everything else (SGD with/without momentum, Adam, AdamW, groups with their own lr / weight
decay / betas, lr schedules, frozen, tied, unused parameters, one-parameter models on up to six
ranks) comes from ``cases``; shrinking still goes toward one rank, one layer, one step.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import strategies as st

from paracheck.strategies._core import cases

__all__ = ["sharding_cases"]


@st.composite
def sharding_cases(draw, *, min_world_size: int = 1, max_world_size: int = 6, max_steps: int = 4,
                   dtype: str = "float64"):
    """Cases whose late groups join after a drawn step ``k`` (1 <= k < steps)."""
    if not isinstance(max_steps, int) or max_steps < 2:
        raise ValueError(f"max_steps={max_steps!r} must be an int >= 2 (a late group needs a step before it)")
    case = draw(cases(min_world_size=min_world_size, max_world_size=max_world_size, max_steps=max_steps, dtype=dtype))
    groups = case.optimizer.groups
    if not any(g.add_at_step is not None for g in groups):
        return case
    steps = max(case.steps, 2)
    moved = tuple(g if g.add_at_step is None else replace(g, add_at_step=draw(st.integers(1, steps - 1)))
                  for g in groups)
    return replace(case, steps=steps, optimizer=replace(case.optimizer, groups=moved))
