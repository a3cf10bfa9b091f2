"""The fsdp kind: the reference FSDP (paracheck.fsdp) equals the oracle, holds only its shards,
frees every gathered parameter when its module's forward returns; every FSDP mutant is killed."""

import math

import pytest

from paracheck.check.property import check_target
from paracheck.check.targets import resolve_target
from paracheck.mutants import MUTANTS
from paracheck.selftest import mutant_target

JOBS = "tests.property._fsdp_jobs"
FSDP_MUTANTS = sorted(n for n, m in MUTANTS.items() if m.kind == "fsdp")


def test_fsdp_matches_oracle(world):
    report = check_target(resolve_target("fsdp"), world, world_sizes=(1, 2, 3, 4), max_examples=30)
    assert report.passed, report.failure.describe()
    assert report.examples >= 25


def test_fsdp_matches_oracle_in_mixed_precision(world):
    """bf16 and fp16 autocast (a tied weight cast at each use: Note [Cases an FSDP is checked
    on]), bfloat16 parameters and float32."""
    report = check_target(
        resolve_target("fsdp"), world, world_sizes=(1, 2, 3), max_examples=30, precision="mixed"
    )
    assert report.passed, report.failure.describe()


def test_fsdp_with_a_compute_dtype_matches_oracle(world):
    """bfloat16 cases give the reference FSDP ``compute_dtype=torch.bfloat16`` over the float32
    model (Note [Compute dtype of an FSDP]): masters, gathers in bfloat16, a float32 reduction."""
    target = resolve_target("fsdp")
    assert target.master_weights and target.reduce_dtype == "float32"
    assert {"gather-dtype", "reduce-dtype"} <= target.properties
    report = check_target(
        target, world, world_sizes=(1, 2, 3, 4), max_examples=30, precision="bf16"
    )
    assert report.passed, report.failure.describe()


def test_a_compute_dtype_gathers_in_it_and_reduces_in_float32(world):
    """Exact, one step at W = 3 through the reference with compute_dtype=torch.bfloat16: every
    all-gather in bfloat16, every reduction in float32, shards and their gradients float32."""
    for gathers, reductions, shards, grads, out in world.run(
        f"{JOBS}:compute_dtype_ledger", None, world_size=3
    ):
        assert gathers == {"bfloat16"} and reductions == {"float32"}
        assert shards == grads == {"float32"} and out == "bfloat16"


def test_a_wrapper_refusing_a_compute_dtype_is_skipped_not_failed(world):
    """A constructor that refuses compute_dtype by name gets no verdict in those cases."""
    from paracheck.cases import Case
    from paracheck.check.run import run_case

    target = resolve_target("tests.property._fsdp_jobs:RefusesComputeDtype")
    assert target.master_weights
    result = run_case(world, target, Case(dtype="bfloat16"))
    assert result.ok and result.case.masters_from_float32
    assert "the compute dtype is not checked" in result.extra["skipped"]


@pytest.mark.parametrize("depth", [0, 1, 2, 5])
def test_prefetch_gathers_depth_plus_one_modules_at_once(world, depth):
    """Exact: four layers, one matrix each, W = 2: min(depth + 1, 4) gathered at once, and the
    same gradients bit for bit as without prefetch."""
    for peak, same in world.run(f"{JOBS}:prefetch_peaks", depth, world_size=2):
        assert peak == min(depth + 1, 4) and same


def test_a_wrapper_gathering_each_bias_on_its_own_passes_with_prefetch(world):
    """Control: every parameter sharded and gathered on its own (two storages per layer with a
    bias) stays within gathered-layers' bound at every drawn depth."""
    target = resolve_target("tests.property._fsdp_jobs:ShardsEverything")
    assert "gathered-layers" in target.properties
    report = check_target(target, world, world_sizes=(2, 3), max_examples=15)
    assert report.passed, report.failure.describe()


@pytest.mark.parametrize("prefetch", [0, 1])
def test_the_reference_gathers_each_layer_once_per_pass_and_reduces_it_once(world, prefetch):
    """Exact ledger, W = 2, four bias-free layers of 25, 20, 12 and 6 elements (padded to 26, 20,
    12, 6): forward gathers each layer once, in order; backward gathers each layer whose input
    needs a gradient (not the first) just before its reduce-scatter, in reverse; the first
    layer's weight is only reduced; nothing is left for finish. Prefetch changes no call."""
    for passes, finish in world.run(f"{JOBS}:per_layer_ledger", prefetch, world_size=2):
        forward = [("all_gather", n) for n in (26, 20, 12, 6)]
        backward = [(kind, n) for n in (6, 12, 20) for kind in ("all_gather", "reduce_scatter")]
        assert passes == forward + backward + [("reduce_scatter", 26)]
        assert finish == []


def test_fsdp_catalogue_has_at_least_twenty_bugs():
    assert len(FSDP_MUTANTS) >= 20


# A collective that is never waited on is read while it runs: what the reader sees is whatever
# the buffer held, fresh garbage or, from a reused allocation, the previous step's gather, one
# optimizer update away (seen: 2.9x the tolerance). Their margin measures the allocator, not the
# check, so they are held to the kill alone.
RACES = {n for n in FSDP_MUTANTS if n.endswith("-not-waited")}


@pytest.mark.parametrize("name", FSDP_MUTANTS)
def test_fsdp_mutant_is_killed(world, name):
    m = MUTANTS[name]
    report = check_target(
        mutant_target(m),
        world,
        world_sizes=(1, 2, 3, 4),
        max_examples=40,
        shrink_seconds=2.0,
        precision=m.precision,
    )
    assert not report.passed, f"{name} survived 40 examples: {m.bug}"
    failure = report.failure
    if m.expect == "diverge":
        d = failure.divergence
        assert d is not None, failure.describe()
        if name in RACES:
            return  # caught outside the tolerance; how far is what the unwaited buffer held
        # Not by luck: far outside the tolerance (or not finite), or an exact rule.
        assert d.tolerance == 0 or not d.max_abs_diff < 10 * d.tolerance, d.describe()
    else:
        assert failure.error is not None and failure.error.kind == "raised", failure.describe()


@pytest.mark.parametrize("w", [1, 2, 3, 4])
def test_each_rank_holds_its_shards_and_the_replicated_parameters_only(world, w):
    """Exact: a weight of n elements costs ceil(n / W) elements on every rank; biases whole."""
    from tests.property._fsdp_jobs import WIDTHS

    weights = [a * b for a, b in zip(WIDTHS[:-1], WIDTHS[1:])]
    biases = list(WIDTHS[1:])
    expected = []
    for n, b in zip(weights, biases):
        expected += [math.ceil(n / w), b]
    for held_bytes, numels in world.run(f"{JOBS}:held", None, world_size=w):
        assert numels == expected
        assert held_bytes == 8 * sum(expected)


def test_gathered_parameters_live_only_during_their_modules_forward(world):
    """Every gathered weight is dead once the forward returns (backward gathers it again), and
    no other module's gathered weight is alive when a module gathers its own."""
    for gathered, alive, live_at_gather, all_grads in world.run(
        f"{JOBS}:lifetimes", None, world_size=3
    ):
        assert gathered == 3 and alive == 0
        assert live_at_gather == [0, 0, 0]
        assert all_grads


def test_an_fsdp_class_is_read_as_the_fsdp_kind_and_bad_arguments_are_named():
    import torch

    from paracheck.fsdp import FSDP

    assert resolve_target("paracheck.mutants.fsdp:NoDivideFSDP").kind == "fsdp"
    for bad in (torch.int32, "bfloat16"):
        with pytest.raises(ValueError, match=f"compute_dtype={bad!r} must be None or a floating"):
            FSDP(torch.nn.Linear(2, 2), compute_dtype=bad)


def test_torch_fully_shard_matches_oracle(world):
    """torch's FSDP2 behind the CS336 interface (target torch-fsdp) passes what the reference
    passes."""
    report = check_target(
        resolve_target("torch-fsdp"), world, world_sizes=(1, 2, 3), max_examples=15
    )
    assert report.passed, report.failure.describe()
    assert report.examples >= 12
    # With a compute dtype: MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32).
    report = check_target(
        resolve_target("torch-fsdp"), world, world_sizes=(2, 3), max_examples=8, precision="bf16"
    )
    assert report.passed, report.failure.describe()


@pytest.mark.parametrize("gather", ["materialize", "tests.property._fsdp_jobs:gather_all"])
def test_a_declared_gather_reads_a_wrapper_with_its_own_names(world, gather):
    target = resolve_target("tests.property._fsdp_jobs:OwnNames", gather=gather)
    assert target.kind == "fsdp" and target.gather == gather
    assert f"--gather {gather}" in target.cli_options()
    report = check_target(target, world, world_sizes=(1, 3), max_examples=6)
    assert report.passed, report.failure.describe()


def test_a_bad_gather_is_named():
    from paracheck.check.targets import TargetError

    with pytest.raises(TargetError, match="gather='full'.*materialize"):
        resolve_target("tests.property._fsdp_jobs:OwnNames", gather="full")
    with pytest.raises(TargetError, match="gather='materialize' is for fsdp targets"):
        resolve_target("naive", gather="materialize")
    # The CS336 constructor without a known reader: named, with the method it has.
    with pytest.raises(TargetError, match="looks like a fully sharded.*materialize.*--gather"):
        resolve_target("tests.property._fsdp_jobs:MyFSDP")
    assert resolve_target("tests.property._fsdp_jobs:MyFSDP", gather="materialize").kind == "fsdp"


def test_torch_fully_shard_reduces_a_module_called_twice_twice_after_no_sync(world):
    """Pinned finding (docs/findings-torch-fsdp.md): in the backward after a no_sync() micro-batch
    FSDP2 reduce-scatters a module called twice per forward twice; without no_sync() once."""
    for plain, after_no_sync in world.run(f"{JOBS}:torch_fsdp_reductions", None, world_size=2):
        assert plain == [("reduce_scatter", 64), ("reduce_scatter", 128)]
        assert after_no_sync == [("reduce_scatter", 64), ("reduce_scatter", 128)] + [
            ("reduce_scatter", 128)
        ]


def test_the_fsdp_reference_reduces_a_tied_weight_once(world):
    """The same model through paracheck's FSDP: one reduce-scatter per weight either way."""
    for plain, after_no_sync in world.run(
        f"{JOBS}:torch_fsdp_reductions", "paracheck.fsdp:FSDP", world_size=2
    ):
        assert plain == after_no_sync == [("reduce_scatter", 64), ("reduce_scatter", 128)]


def test_torch_fully_shard_raises_in_no_sync_for_an_unused_group_with_a_float32_reduction(world):
    """Pinned finding (docs/findings-torch-fsdp.md): with reduce_dtype=float32 under a bfloat16
    param_dtype, FSDP2's backward inside set_requires_gradient_sync(False) raises for a group
    whose forward never ran; with the default reduce_dtype it does not."""
    for raised in world.run(f"{JOBS}:torch_fsdp_unused_group_in_no_sync", "float32", world_size=2):
        assert raised is not None and "_unsharded_param" in raised, raised
    for raised in world.run(f"{JOBS}:torch_fsdp_unused_group_in_no_sync", None, world_size=2):
        assert raised is None
