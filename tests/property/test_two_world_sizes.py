"""A two-GPU CI's world sizes (1, 2), one search over the contract in float32 (the pytest plugin's
way and the NCCL suite's): the mutants that survived it, each killed now. They met no case of
their bug: two ranks were drawn in 15 of 40 (Note [Worlds that communicate first]), the sharding
clip followed seed // 7, which sent Hypothesis's favourite seeds to no clip (Note [Clip from the
seed]), and no_sync() came with one micro-step, where it is the plain protocol."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from paracheck.check.property import check_target
from paracheck.mutants import MUTANTS
from paracheck.selftest import mutant_target, selftest_settings
from paracheck.strategies import cases, sharding_cases
from paracheck.strategies._core import world_size_draws

SURVIVED_AT_ONE_AND_TWO = (
    "ddp-bucket-cap-ignored",
    "fsdp-gradients-in-low-precision",
    "fsdp-reduce-in-no-sync",
    "zero1-clip-local-norm",
)


@pytest.mark.parametrize("name", SURVIVED_AT_ONE_AND_TWO)
def test_killed_at_world_sizes_one_and_two(world, name):
    m = MUTANTS[name]
    settings = selftest_settings((1, 2), max_examples=40, timeout=20.0, dtype="float32")
    report = check_target(mutant_target(m), world, settings.replace(precision=m.precision))
    assert not report.passed, f"{name} survived {report.examples} cases at world sizes 1, 2"
    assert report.failure.case.world_size == 2


def test_two_world_sizes_draw_the_one_that_communicates_three_times_in_four():
    """With one size above 1 it is listed three times against 1's once; more sizes keep their
    order (every derandomised sequence of the default sizes is the one it was)."""
    assert list(world_size_draws((1, 2)).elements) == [2, 2, 2, 1]
    assert list(world_size_draws((2, 1, 3, 4)).elements) == [2, 3, 4, 1]
    assert list(world_size_draws((3,)).elements) == [3]


def test_an_accumulation_protocol_comes_with_two_micro_steps():
    """no_sync() and finish-once are drawn only with at least two micro-steps (with one they are
    the plain protocol), unless the caller allows one micro-step only."""
    drawn = []

    @settings(max_examples=200, database=None, suppress_health_check=list(HealthCheck))
    @given(st.one_of(cases(world_sizes=(1, 2)), sharding_cases(world_sizes=(1, 2))))
    def check(case):
        drawn.append(case.no_sync or case.finish_once)
        assert not ((case.no_sync or case.finish_once) and case.accumulation < 2), case

    check()
    assert any(drawn)

    @settings(max_examples=30, database=None, suppress_health_check=list(HealthCheck))
    @given(cases(world_sizes=(1, 2), max_accumulation=1))
    def bounded(case):
        assert case.accumulation == 1

    bounded()
