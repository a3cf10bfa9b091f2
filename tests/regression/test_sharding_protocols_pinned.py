"""One literal case per protocol of the sharding check, each killing the one mutant that needs it
while ShardedOptimizer and torch's ZeroRedundancyOptimizer pass it.

Model for all: MLP 3 -> 4 -> 2 with biases (four parameters), two ranks, float64."""

from dataclasses import replace

import pytest

from paracheck.cases import Case, GroupSpec, OptimizerSpec
from paracheck.check.run import run_case
from paracheck.check.targets import Target, resolve_target
from paracheck.mutants import MUTANTS
from paracheck.workloads import MLPSpec

BASE = Case(
    model=MLPSpec(in_features=3, widths=(4, 2), bias=True),
    world_size=2,
    batch_sizes=(2, 1),
    steps=2,
    optimizer=OptimizerSpec("adam", (GroupSpec(params=(), lr=1e-2),)),
)

PINNED = {
    # Step 1 starts from the gradients of step 0 on the parameters the rank does not own.
    "sharded-zero-grad-local-shard": (BASE, "grad"),
    # StepLR halves every lr after step 0: step 1 must use lr 5e-3.
    "sharded-lr-synced-backwards": (
        replace(BASE, optimizer=replace(BASE.optimizer, scheduler="step")),
        "param",
    ),
    # The only group is a dict of a generator: consumed before torch's constructor, nothing is trained.
    "sharded-group-generators-consumed": (
        replace(BASE, steps=1, optimizer=replace(BASE.optimizer, groups_as_generators=True)),
        "param",
    ),
    # One parameter, two ranks: rank 1 owns nothing.
    "sharded-empty-shard-raises": (
        replace(BASE, model=MLPSpec(in_features=3, widths=(1,), bias=False), steps=1),
        "raised",
    ),
    # The closure computes the gradients: ignored, step 0 has none.
    "sharded-closure-ignored": (replace(BASE, steps=1, closure=True), "grad"),
    # Reloaded before step 1 into a fresh instance: Adam's moments and step count must survive.
    "sharded-load-state-dict-skips-wrapped": (replace(BASE, reload_at_step=1), "param"),
}

CORRECT = ["sharded", "torch-zero"]


@pytest.mark.parametrize("name", sorted(PINNED))
def test_pinned_protocol_case_kills_its_mutant_only(world, name):
    """The pinned case passes on the correct optimizers and fails the mutant on the expected property."""
    case, what = PINNED[name]
    for correct in CORRECT:
        result = run_case(world, resolve_target(correct), case)
        assert result.ok, f"{correct}: {result.describe()}"
    mutant = MUTANTS[name]
    result = run_case(world, Target(mutant.name, mutant.path, mutant.kind), case)
    if what == "raised":
        assert (
            result.error is not None
            and "optimizer got an empty parameter list" in result.describe()
        )
    else:
        assert result.divergence is not None and result.divergence.what == what, result.describe()
