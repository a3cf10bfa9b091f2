"""Schedule perturbation (Note [Schedule perturbation]): a case may hold one rank back before
its all-gathers, its reduce-scatters or after each layer's forward; the rank held back sleeps
where the case says, the values do not change, and the delay is drawn and shrinks away."""

from dataclasses import replace

import pytest
from hypothesis import given, settings

from paracheck.cases import DELAY_POINTS, Case
from paracheck.check.features import without
from paracheck.check.property import check_target
from paracheck.check.targets import resolve_target
from paracheck.strategies._fsdp import fsdp_cases


def test_delay_fields_are_checked():
    with pytest.raises(ValueError, match="delay_at='late'"):
        Case(delay_at="late", delay_s=0.01)
    with pytest.raises(ValueError, match="delay_rank=2 must be a rank of world_size=2"):
        Case(delay_at="forward", delay_rank=2, delay_s=0.01)
    with pytest.raises(ValueError, match="delay_s=0.0"):
        Case(delay_at="all-gather")


def test_delay_round_trips_and_is_a_feature():
    case = Case(delay_at="reduce-scatter", delay_rank=1, delay_s=0.002)
    assert Case.from_json(case.to_json()) == case
    assert without(case, "delay") == Case()


@settings(max_examples=60, derandomize=True, database=None, deadline=None)
@given(fsdp_cases(world_sizes=(1, 2, 3, 4)))
def test_drawn_delays_name_a_rank_of_the_case(case):
    if case.delay_at is not None:
        assert case.delay_at in DELAY_POINTS and 0 <= case.delay_rank < case.world_size
        assert case.delay_s in (0.002, 0.01)


def test_every_point_is_drawn():
    seen = set()

    @settings(max_examples=200, derandomize=True, database=None, deadline=None)
    @given(fsdp_cases(world_sizes=(2,)))
    def collect(case):
        seen.add(case.delay_at)

    collect()
    assert seen == {None, *DELAY_POINTS}


@pytest.mark.parametrize("at, collectives", [("all-gather", 3), ("reduce-scatter", 3)])
def test_the_rank_held_back_sleeps_before_each_collective(world, at, collectives):
    """Three sharded weights at W = 2: rank 1 sleeps before each of its three all-gathers in
    forward (backward re-gathers too: at least three) or each of its three reduce-scatters;
    rank 0 never."""
    out = sorted(world.run("tests.property._fsdp_jobs:held_back", (at, 0.01), world_size=2))
    assert out[0][1] is None
    assert out[1][1] >= collectives if at == "all-gather" else out[1][1] == collectives
    assert out[1][2] >= collectives * 0.01


def test_the_rank_held_back_sleeps_after_each_layer(world):
    """Three Linear and two Tanh layers: five leaf forwards, 10 ms each, on rank 1 only; rank
    0 waits for it in the next collective, so both take at least the sum."""
    out = sorted(world.run("tests.property._fsdp_jobs:held_back", ("forward", 0.01), world_size=2))
    assert out[1][2] >= 0.05 and out[0][2] >= 0.04


@pytest.mark.parametrize("at", DELAY_POINTS)
def test_reference_fsdp_passes_with_a_rank_held_back(world, at):
    """The reference FSDP with every drawn case holding its last rank back at ``at``."""
    strategy = fsdp_cases(world_sizes=(2, 3)).map(
        lambda c: replace(c, delay_at=at, delay_rank=c.world_size - 1, delay_s=0.002)
    )
    report = check_target(
        resolve_target("fsdp"), world, world_sizes=(2, 3), max_examples=15, seed=0,
        strategy=strategy,
    )  # fmt: skip
    assert report.passed, report.failure.describe()
