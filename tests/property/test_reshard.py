"""The reshard property: correct sharded designs saved at one world size and resumed at another
equal the oracle, each resharding mutant is killed by it, a per-rank state dict is not judged,
and a fully sharded wrapper's row is not supported (Note [Resuming at another world size])."""

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from paracheck.cases import Case, GroupSpec, OptimizerSpec, batch_for
from paracheck.check.features import optional_features
from paracheck.check.interfaces import RESHARD_PER_RANK, unsupported
from paracheck.check.properties.reshard import (
    NOT_JUDGED,
    check_reshard,
    reshard_cases,
    reshardable,
)
from paracheck.check.run import run_case
from paracheck.check.targets import Target, resolve_target
from paracheck.mutants import MUTANTS
from paracheck.strategies._core import from_seed, precision_settings
from paracheck.strategies._reshard import reshard_draws, resumed_by_seed
from paracheck.workloads import MLPSpec

# MLP 3 -> 4 -> 4 -> 2 with biases (six parameters, 46 elements) under Adam, buckets of 12
# float64 elements (several buckets, pieces past the first), a second group with its own lr and
# weight decay added after the save, StepLR; saved after step 1 of 3.
BASE = Case(
    model=MLPSpec(in_features=3, widths=(4, 4, 2), bias=True),
    world_size=2,
    batch_sizes=(2, 2),
    steps=3,
    optimizer=OptimizerSpec(
        "adam",
        (
            GroupSpec(params=(0, 1, 2, 3), lr=1e-2),
            GroupSpec(params=(4, 5), lr=3e-2, weight_decay=0.05, add_at_step=2),
        ),
        scheduler="step",
    ),
    bucket_size_mb=12 * 8 / 2**20,
    seed=7,
    reshard_at_step=1,
    reshard_world_size=3,
)
# Every (W, W') in 1..4 with W' != W.
EVERY_PAIR = tuple((w, w2) for w in range(1, 5) for w2 in range(1, 5) if w2 != w)
# BASE in bfloat16 with float32 masters: what a master-weight variant saves beside its state.
BF16_MASTERS = replace(BASE, dtype="bfloat16", master_weights=True)
# Every built-in that resumes at another world size, with the case it is resumed on.
RESUMING = {
    "sharded": BASE,
    "sharded-master": BF16_MASTERS,
    "zero1": BASE,
    "zero1-master": BF16_MASTERS,
    "zero2": BASE,
    "torch-zero": BASE,
    "torch-fsdp": BASE,
}
RESHARDING = [m for m in MUTANTS.values() if m.path.startswith("paracheck.mutants.resharding:")]


def _at(w: int, w2: int, case: Case = BASE) -> Case:
    return replace(case.with_world_size(w), reshard_world_size=w2)


def _mutant(name: str) -> Target:
    m = MUTANTS[name]
    return Target(m.name, m.path, m.kind)


@pytest.mark.parametrize("pair", EVERY_PAIR, ids=lambda p: f"{p[0]}to{p[1]}")
@pytest.mark.parametrize("name", RESUMING)
def test_every_builtin_resumes_at_every_other_world_size(world, name, pair):
    """Every built-in that resumes (torch-fsdp through DCP), saved after step 1 at W and resumed
    at each W' != W in 1..4, equals the oracle of the same global batches, the resume judged (not
    skipped, not per-rank), and passes every other property of the case."""
    result = run_case(world, resolve_target(name), _at(*pair, RESUMING[name]))
    assert result.ok, result.describe()
    assert "skipped" not in result.extra, result.extra
    assert "reshard not judged" not in result.extra.get("unjudged", ""), result.extra


def _assert_killed_resuming(result, mutant) -> None:
    """``result`` fails on ``reshard``, or by a rank raising in the resumed world."""
    assert not result.ok, f"{mutant.name} survived: {mutant.bug}"
    if result.error is not None:
        assert "run_resumed" in result.error.report(), result.describe()
    else:
        assert result.failed_properties == ["reshard"], result.describe()


def _pinned(mutant) -> Case:
    """The pinned resumed case of ``mutant``: BASE, in bfloat16 with masters for a bug of them."""
    return BF16_MASTERS if mutant.precision == "bf16" else BASE


@pytest.mark.parametrize("mutant", RESHARDING, ids=lambda m: m.name)
def test_resharding_mutant_is_killed_by_the_reshard_row(world, mutant):
    """Each resharding mutant fails the pinned resumed case: on ``reshard``, or raising while it
    resumes; the same case without the resume passes (the bug is in its checkpoint alone)."""
    target = _mutant(mutant.name)
    _assert_killed_resuming(run_case(world, target, _at(2, 3, _pinned(mutant))), mutant)
    assert run_case(world, target, replace(_at(2, 3, _pinned(mutant)), reshard_at_step=None)).ok


# The mutants whose bug a resume to some world size cannot show: (W, W') where each passes, (W,
# W') where it fails. Why W' is drawn another than W wherever the check draws another, 1 included.
LATENT = {
    "sharded-reshard-state-dropped": ((2, 2), (2, 1)),
    "zero1-master-reshard-masters-from-parameters": ((3, 3), (3, 2)),
    "zero2-reshard-loaded-on-rank-0": ((2, 1), (1, 2)),
}


@pytest.mark.parametrize("name", LATENT)
def test_a_latent_resharding_mutant_shows_only_at_another_world_size(world, name):
    """State dropped or masters rebuilt when the number of ranks changes survive a resume at the
    same world size, and state loaded on rank 0 only survives a resume to one rank: each fails
    the other pinned pair (on ``reshard``, or raising in the resumed world: rank 0's and a fresh
    rank's pieces of one parameter disagree on Adam's step)."""
    target, mutant = _mutant(name), MUTANTS[name]
    passing, failing = LATENT[name]
    assert run_case(world, target, _at(*passing, _pinned(mutant))).ok
    _assert_killed_resuming(run_case(world, target, _at(*failing, _pinned(mutant))), mutant)


# A selftest search per mutant, 37-92 s each on the 2-core machine (the seven took 6 min of the
# second tier's time): run with -m slow; the second tier kills each on its pinned case above.
@pytest.mark.slow(reason="a selftest search per resharding mutant: run with -m slow")
@pytest.mark.parametrize("mutant", RESHARDING, ids=lambda m: m.name)
def test_resharding_mutant_is_killed_by_the_selftest(world, mutant):
    """Each resharding mutant is killed by the default check, as ``paracheck selftest --only``
    runs it (40 derandomised cases at world sizes 1..4, its own precision), on ``reshard`` or by
    a rank raising while it resumes."""
    from paracheck.selftest import selftest_rows

    (row,) = selftest_rows(only=[mutant.name], world_sizes=(1, 2, 3, 4), world=world)
    assert row["ok"], f"{mutant.name} {row['verdict']} after {row['examples']} cases: {mutant.bug}"
    assert row["properties"][0] in ("reshard", "raised"), row["detail"]


# An FSDP2 case drawn by the check (float32 under bfloat16 autocast, a tied weight, W 3 -> 1) on
# which the oracle's own step-0 gradients at W' (other rows than the ranks' at W) moved its
# parameters past their tolerance: past the save, updates are judged on the target's gradients.
AUTOCAST_FSDP = replace(
    Case(
        model=MLPSpec(in_features=5, widths=(5, 2), bias=True, tied=True),
        world_size=3,
        batch_sizes=(2, 1, 1),
        steps=4,
        optimizer=OptimizerSpec("sgd", (GroupSpec(params=(0, 1, 2, 3, 4), lr=0.05),)),
        set_to_none=False,
        dtype="float32",
        autocast="bfloat16",
        autocast_cache=False,
    ),
    reshard_at_step=1,
    reshard_world_size=1,
)


# A branch no rank uses: its parameters have no optimizer state in the checkpoint, while torch's
# get_state_dict builds state for every parameter of the fresh optimizer it loads into.
UNUSED_FSDP = replace(
    BASE, model=MLPSpec(in_features=3, widths=(4, 2), bias=True, unused="always"), steps=3
)


def test_fsdp_resumes_with_parameters_no_step_reached(world):
    """FSDP2 with a never-used branch resumes through DCP (loading raised "Missing key in
    checkpoint state_dict" for the branch's state before the load allowed it missing)."""
    case = replace(UNUSED_FSDP, optimizer=OptimizerSpec("adam", (GroupSpec(params=()),)))
    assert check_reshard(world, resolve_target("torch-fsdp"), case, None) is None


def test_fsdp_resumes_where_one_group_keeps_no_optimizer_state(world):
    """FSDP2 under SGD with momentum in one group only: the other group's parameters have no
    state in the checkpoint (torch's strict load raised "Missing optimizer state" for them)."""
    groups = (GroupSpec(params=(0, 1, 2, 3), lr=0.05), GroupSpec(params=(4, 5), momentum=0.9))
    case = replace(BASE, optimizer=OptimizerSpec("sgd", groups))
    assert check_reshard(world, resolve_target("torch-fsdp"), case, None) is None


def test_an_autocast_fsdp_resumes_within_its_tolerance(world):
    """The pinned autocast FSDP2 case resumes at world size 1 within the tolerances."""
    assert check_reshard(world, resolve_target("torch-fsdp"), AUTOCAST_FSDP, None) is None


def test_a_per_rank_state_dict_is_not_judged(world):
    """A sharded optimizer whose state_dict() is its own shard cannot be loaded at another world
    size: the property does not judge it (no failure), says why, and the rest of the case
    passes; the case's result carries the reason, so the report never shows a bare pass."""
    path = f"{Path(__file__).with_name('_per_rank_state.py')}:PerRankShardedOptimizer"
    target = Target("per-rank", path, "sharded")
    measured: dict = {}
    assert check_reshard(world, target, _at(2, 3), None, measured=measured) is None
    assert "per-rank shards" in measured[NOT_JUDGED]
    result = run_case(world, target, _at(2, 3))
    assert result.ok and "reshard not judged" in result.extra["unjudged"]


@settings(max_examples=12, deadline=None, derandomize=True)
@given(data=st.data())
def test_correct_designs_resume_on_drawn_cases(world, data):
    """Drawn sharding cases with a resume (bucket sizes, groups, late groups, frozen and unused
    parameters, schedulers, SGD and Adam, W and W' in 1..4) pass on the sharded built-ins."""
    from paracheck.strategies._sharding import sharding_cases

    strategy = sharding_cases(world_sizes=(1, 2, 3, 4)).filter(
        lambda c: c.reshard_at_step is not None
    )
    case = data.draw(strategy)
    for name in ("sharded", "zero1"):
        result = run_case(world, resolve_target(name), case)
        assert result.divergence_of("reshard") is None, f"{name}: {result.describe('reshard')}"


# -- without processes ------------------------------------------------------------------------


@pytest.mark.parametrize("pair", EVERY_PAIR + ((3, 3),), ids=lambda p: f"{p[0]}to{p[1]}")
def test_both_halves_train_on_the_same_global_batch(pair):
    """At W and at W' the ranks' batches, concatenated in rank order, are the same rows: the
    oracle's global batch does not change with the world size."""
    at_w, at_w2 = reshard_cases(_at(*pair))
    for step in range(BASE.steps):
        rows = [
            torch.cat([batch_for(c, step, 0, r)[0] for r in range(c.world_size)])
            for c in (at_w, at_w2)
        ]
        assert torch.equal(rows[0], rows[1])


def test_a_bfloat16_case_is_resumed_by_its_seed_in_one_case_in_two():
    """One seed in two (seed 0 never) resumes a case after step 1 at another of the check's world
    sizes, without a draw, and as often among the seeds a bf16 check runs in bfloat16 (where the
    masters are saved): the seeds that resume do not follow the seeds' precision."""
    sizes = (1, 2, 3, 4)
    bf16 = [s for s in range(1, 2001) if from_seed(s, precision_settings("bf16"))[0] == "bfloat16"]
    resumed = [
        c
        for c in (
            resumed_by_seed(replace(BASE, seed=s, reshard_at_step=None), world_sizes=sizes)
            for s in bf16
        )
        if c.reshard_at_step is not None
    ]
    assert 0.4 < len(resumed) / len(bf16) < 0.6
    assert {c.reshard_at_step for c in resumed} == {1}
    assert {c.reshard_world_size for c in resumed} == {1, 3, 4}
    unresumed = replace(BASE, seed=0, reshard_at_step=None)
    assert resumed_by_seed(unresumed, world_sizes=sizes) == unresumed
    one_rank = replace(BASE.with_world_size(1), seed=resumed[0].seed, reshard_at_step=None)
    assert resumed_by_seed(one_rank, world_sizes=sizes).reshard_at_step is None


def test_per_rank_shards_are_told_from_consolidated_dicts():
    """Dicts every rank returns alike (consolidated, empty, a target's own format) are
    reshardable; per-rank shards, even keyed alike, are not."""
    full = {"state": {0: {"step": torch.tensor(1.0)}}, "param_groups": [{"lr": 0.1}]}
    assert reshardable([full, {**full}])
    assert reshardable([{"state": {}, "param_groups": []}] * 2)
    assert reshardable([["own", "format"], ["own", "format"]])
    assert not reshardable([{"state": {0: {"step": 1}}}, {"state": {1: {"step": 1}}}])
    other = {"state": {0: {"step": torch.tensor(2.0)}}, "param_groups": [{"lr": 0.1}]}
    assert not reshardable([full, other])


def test_reshard_is_a_row_an_fsdp_does_not_support():
    """``reshard`` is an optional feature (a row of the verdict table); a fully sharded wrapper's
    row is "not supported" (its state is per-rank by contract) unless it declares DCP checkpoints
    (torch's FSDP2), a sharded optimizer's is not."""
    assert "reshard" in optional_features()
    assert unsupported(resolve_target("fsdp"), "reshard") == RESHARD_PER_RANK
    assert unsupported(resolve_target("torch-fsdp"), "reshard") is None  # DTensors, through DCP
    assert unsupported(resolve_target("zero1"), "reshard") is None
    lacking = Target("d", "collections:OrderedDict", "sharded")
    assert unsupported(lacking, "reshard") == "OrderedDict has no state_dict()"


@settings(max_examples=30, deadline=None, derandomize=True)
@given(data=st.data(), sizes=st.sets(st.integers(1, 6), min_size=1))
def test_the_resumed_world_differs_wherever_it_can(data, sizes):
    """W' is one of the check's world sizes, another than W wherever there is another."""
    w = data.draw(st.sampled_from(sorted(sizes)))
    drawn = data.draw(reshard_draws(BASE.with_world_size(w), world_sizes=sorted(sizes)))
    assert drawn["reshard_world_size"] in sizes
    assert (drawn["reshard_world_size"] != w) == (len(sizes) > 1)
    assert 1 <= drawn["reshard_at_step"] < BASE.steps
