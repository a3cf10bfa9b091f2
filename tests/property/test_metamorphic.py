"""Oracle-free properties: a target agrees with itself across world sizes and bucket sizes."""

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from paracheck.check.properties.bucket_size_independence import bucket_size_independence
from paracheck.check.properties.world_size_relation import world_size_relation
from paracheck.check.targets import resolve_target
from paracheck.strategies import cases, mlp_specs

_SETTINGS = settings(
    max_examples=15, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck)
)


def _relation_cases():
    # Equal local batch sizes and no data-dependent branch: the preconditions of the relation. One
    # dtype: a float32 layer computes differently on a merged batch, and the relation compares
    # whole trajectories at the model's tolerance.
    models = mlp_specs(mixed_dtypes=False).filter(lambda m: m.unused != "data")
    return st.tuples(
        cases(min_world_size=2, max_world_size=4, models=models), st.integers(1, 3)
    ).map(lambda t: t[0].__class__(**{**t[0].__dict__, "batch_sizes": (t[1],) * t[0].world_size}))


@pytest.mark.parametrize("name", ["naive", "flat"])
def test_world_size_relation_holds(world, name):
    """W ranks with equal batches equal one rank fed their concatenation (no oracle involved)."""
    target = resolve_target(name)

    @_SETTINGS
    @given(_relation_cases())
    def prop(case):
        d = world_size_relation(world, target, case)
        assert d is None, d.describe()

    prop()


def test_world_size_relation_kills_no_divide(world):
    """The relation alone catches gradients summed but not averaged (found, not shrunk: each
    shrink step runs the target twice)."""
    target = resolve_target("paracheck.mutants.ddp:NoDivideDDP")
    found = []

    @settings(_SETTINGS, phases=[Phase.explicit, Phase.reuse, Phase.generate])
    @given(_relation_cases())
    def prop(case):
        d = world_size_relation(world, target, case)
        if d is not None:
            found.append(d)
        assert d is None

    with pytest.raises(AssertionError):
        prop()
    assert found


def test_bucket_size_independence(world):
    """BucketedDDP's result does not depend on its bucket size (tiny buckets vs one big bucket)."""
    target = resolve_target("bucketed")

    @_SETTINGS
    # A cap against one big bucket, in one dtype (float32 sums grouped by other buckets round
    # differently, beyond the float64 tolerance the relation compares at).
    @given(cases(min_world_size=1, max_world_size=4, mixed_dtypes=False, unbounded_buckets=False))
    def prop(case):
        d = bucket_size_independence(world, target, case, other_bucket_mb=1000.0)
        assert d is None, d.describe()

    prop()
