"""Naive and flat DDP equal the single-process oracle; the planted no-divide bug is caught."""

from paracheck.check.property import check_target
from paracheck.check.targets import resolve_target


def test_naive_matches_oracle(paracheck_check):
    """NaiveDDP equals the oracle on generated cases (world sizes 1..6, float64, gloo)."""
    paracheck_check("naive")


def test_flat_matches_oracle(paracheck_check):
    """FlatDDP equals the oracle on generated cases."""
    paracheck_check("flat")


def test_no_divide_mutant_is_killed(world, paracheck_world_sizes):
    """Summing gradients without dividing by the world size fails the default check."""
    report = check_target(
        resolve_target("paracheck.mutants.ddp:NoDivideDDP"),
        world,
        world_sizes=paracheck_world_sizes,
        max_examples=40,
        seed=0,
    )
    assert not report.passed
    assert report.failure.divergence is not None and report.failure.divergence.what == "grad"
    assert report.failure.case.world_size >= 2
