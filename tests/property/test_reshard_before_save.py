"""A resumed case that goes wrong before its save is the plain trajectory's failure, under the
property it breaks, not a resharding one (Note [A resumed case wrong before its save])."""

from dataclasses import replace

from paracheck.cases import Case, GroupSpec, OptimizerSpec
from paracheck.check.properties.reshard import NAME, check_reshard
from paracheck.check.targets import Target, resolve_target
from paracheck.mutants import MUTANTS
from paracheck.workloads import MLPSpec

# MLP 3 -> 4 -> 2 with biases under SGD with weight decay, saved after step 1 of 3 at world size
# 2, resumed at 1.
CASE = Case(
    model=MLPSpec(in_features=3, widths=(4, 2), bias=True),
    world_size=2,
    batch_sizes=(2, 2),
    steps=3,
    optimizer=OptimizerSpec("sgd", (GroupSpec(params=(0, 1, 2, 3), lr=1e-2, weight_decay=0.1),)),
    seed=3,
    reshard_at_step=2,
    reshard_world_size=1,
)


def test_a_wrong_update_before_the_save_is_reported_as_parameters(world):
    """A sharded optimizer that applies weight decay twice diverges at step 0, before anything is
    saved: the divergence is ``parameters`` at step 0, its detail saying so; the built-in passes."""
    m = MUTANTS["sharded-decay-applied-twice"]
    d = check_reshard(world, Target(m.name, m.path, m.kind), CASE, None)
    assert d is not None
    assert (d.property, d.step) == ("parameters", 0), d
    assert d.detail.startswith("before the save (saved after step 1 at world size 2"), d.detail
    assert check_reshard(world, resolve_target("sharded"), CASE, None) is None


def test_a_state_lost_at_the_load_is_still_a_resharding_failure(world):
    """A mutant right until the load and wrong after it still fails ``reshard``."""
    m = MUTANTS["sharded-reshard-state-dropped"]
    case = replace(
        CASE,
        optimizer=OptimizerSpec("adam", (GroupSpec(params=(0, 1, 2, 3), lr=1e-2),)),
    )
    d = check_reshard(world, Target(m.name, m.path, m.kind), case, None)
    assert d is not None and d.what == NAME and d.step >= 2, d
