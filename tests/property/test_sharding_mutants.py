"""Every planted sharding bug in paracheck.mutants.sharding is killed by the default check."""

import pytest

from paracheck.check.property import check_target
from paracheck.check.targets import Target
from paracheck.mutants import MUTANTS

SHARDING = [m for m in MUTANTS.values() if m.path.startswith("paracheck.mutants.sharding:")]

# The bugs that train correctly: only the named property can see them.
ONLY_SEEN_BY = {"sharded-count-partition": "balance", "sharded-no-shard": "memory"}


def test_sharding_catalogue_has_at_least_six_bugs():
    """The issue asks for at least six realistic sharding bugs."""
    assert len(SHARDING) >= 6


@pytest.mark.parametrize("mutant", SHARDING, ids=lambda m: m.name)
def test_sharding_mutant_is_killed(world, paracheck_world_sizes, mutant):
    """The default check (generated cases, every property) fails on the mutant."""
    report = check_target(Target(mutant.name, mutant.path, mutant.kind), world, world_sizes=paracheck_world_sizes,
                          max_examples=40, seed=0)
    assert not report.passed, f"{mutant.name} survived {report.examples} cases: {mutant.bug}"
    if mutant.name in ONLY_SEEN_BY:
        assert report.failure.divergence is not None, report.failure.describe()
        assert report.failure.divergence.what == ONLY_SEEN_BY[mutant.name], report.failure.describe()
