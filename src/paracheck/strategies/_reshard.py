"""Where a case resumes at another world size (Note [Resuming at another world size] in
``paracheck.check.properties.reshard``): the step it is saved after and the world it resumes in."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import strategies as st

__all__ = ["reshard_draws", "resumed_by_seed", "resumed_sometimes"]


@st.composite
def reshard_draws(
    draw, case, *, world_sizes=None, min_world_size: int = 1, max_world_size: int = 6
) -> dict:
    """``{"reshard_at_step": k, "reshard_world_size": W'}`` for ``case`` (at least two steps): k in
    1..steps-1, shrinking to 1; W' among the world sizes the check draws, another than the case's
    own wherever there is one, shrinking toward the smallest (1 included)."""
    if case.steps < 2:
        raise ValueError(f"case.steps={case.steps} must be >= 2 to be saved and resumed")
    others = _other_world_sizes(case, world_sizes, min_world_size, max_world_size)
    return {
        "reshard_at_step": draw(st.integers(1, case.steps - 1)),
        "reshard_world_size": draw(st.sampled_from(others)),
    }


def _other_world_sizes(case, world_sizes, min_world_size: int, max_world_size: int) -> list[int]:
    """The world sizes a resume of ``case`` is drawn among: another than its own wherever there
    is one."""
    sizes = (
        sorted(set(world_sizes))
        if world_sizes is not None
        else list(range(min_world_size, max_world_size + 1))
    )
    return [w for w in sizes if w != case.world_size] or [case.world_size]


def resumed_by_seed(case, *, world_sizes=None, min_world_size: int = 1, max_world_size: int = 6):
    """``case``, resumed after step 1 at another world size where its seed says so (one seed in
    two, seed 0 never; the world size from the seed too), where it is saved by two ranks or more
    and has two steps; else as it is. No draw: the cases before and after it are those drawn
    without it."""
    if case.reshard_at_step is not None or case.steps < 2 or case.world_size < 2:
        return case
    # Another multiplier than the precision's and the clip's (paracheck.strategies._core), so
    # that which seeds resume does not follow which seeds are bfloat16 or clip.
    mixed = ((case.seed * 0x85EBCA6B) & 0xFFFFFFFF) >> 15
    if case.seed == 0 or mixed % 2 == 0:
        return case
    others = _other_world_sizes(case, world_sizes, min_world_size, max_world_size)
    return replace(case, reshard_at_step=1, reshard_world_size=others[(mixed >> 1) % len(others)])


@st.composite
def resumed_sometimes(draw, case, **sizes):
    """``case`` as it is, or (a boolean that shrinks to "as it is", with two steps or more) resumed
    at another world size (``reshard_draws``; ``sizes``: its world-size keywords)."""
    if case.steps >= 2 and draw(st.booleans()):
        return replace(case, **draw(reshard_draws(case, **sizes)))
    return case
