"""Where a case resumes at another world size (Note [Resuming at another world size] in
``paracheck.check.properties.reshard``): the step it is saved after and the world it resumes in."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import strategies as st

__all__ = ["reshard_draws", "resumed_sometimes"]


@st.composite
def reshard_draws(
    draw, case, *, world_sizes=None, min_world_size: int = 1, max_world_size: int = 6
) -> dict:
    """``{"reshard_at_step": k, "reshard_world_size": W'}`` for ``case`` (at least two steps): k in
    1..steps-1, shrinking to 1; W' among the world sizes the check draws, another than the case's
    own wherever there is one, shrinking toward the smallest (1 included)."""
    if case.steps < 2:
        raise ValueError(f"case.steps={case.steps} must be >= 2 to be saved and resumed")
    sizes = (
        sorted(set(world_sizes))
        if world_sizes is not None
        else list(range(min_world_size, max_world_size + 1))
    )
    others = [w for w in sizes if w != case.world_size] or [case.world_size]
    return {
        "reshard_at_step": draw(st.integers(1, case.steps - 1)),
        "reshard_world_size": draw(st.sampled_from(others)),
    }


@st.composite
def resumed_sometimes(draw, case, **sizes):
    """``case`` as it is, or (a boolean that shrinks to "as it is", with two steps or more) resumed
    at another world size (``reshard_draws``; ``sizes``: its world-size keywords)."""
    if case.steps >= 2 and draw(st.booleans()):
        return replace(case, **draw(reshard_draws(case, **sizes)))
    return case
