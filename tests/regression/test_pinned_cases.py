"""Pinned cases: one bug per test, literal input (the guide's "pin a found case" workflow, docs/guide.md).

A failure report prints the shrunk case as JSON; paste it here with the target that failed and
assert what must hold. These run first and fast, and keep a fixed bug fixed.
"""

import json
import os

import pytest

from paracheck.cases import Case
from paracheck.check.report import case_report
from paracheck.check.run import run_case
from paracheck.check.targets import resolve_target

# Found by `paracheck selftest` against ddp-no-divide (gradients summed, not averaged).
NO_DIVIDE_CASE = Case.from_json("""
{"model": {"kind": "toy", "tied": false}, "world_size": 2, "batch_sizes": [1, 1], "steps": 1,
 "accumulation": 1, "no_sync": false,
 "optimizer": {"name": "adam", "groups": [{"params": [0, 1, 2, 3, 4], "lr": 0.001, "weight_decay": 0.0,
   "momentum": 0.0, "betas": [0.9, 0.999], "add_at_step": null}], "lr_decay": 1.0, "as_generator": false},
 "bucket_size_mb": 9.5367431640625e-07, "seed": 0, "rank_dependent_init": false, "set_to_none": false,
 "dtype": "float64"}
""")


def test_no_divide_case_fails_the_mutant(world):
    """The pinned no-divide case still exposes the mutant, on the averaged gradient of fc1."""
    result = run_case(world, resolve_target("paracheck.mutants.ddp:NoDivideDDP"), NO_DIVIDE_CASE)
    assert result.divergence is not None and result.divergence.what == "grad"


def test_no_divide_case_passes_flat(world):
    """The same literal case passes the correct FlatDDP."""
    assert run_case(world, resolve_target("flat"), NO_DIVIDE_CASE).ok


def test_case_json_round_trips():
    """A case printed by a report parses back to the identical value."""
    assert Case.from_json(NO_DIVIDE_CASE.to_json(indent=2)) == NO_DIVIDE_CASE


# A float32 layer in a float64 model (``MLPSpec.float32_layer``), checked with hand-made cases at
# world size 3, where the rank sum's order can differ: every correct design below once failed them.
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def _pinned(name: str) -> Case:
    with open(os.path.join(HERE, "cases", f"{name}.json")) as f:
        return Case.from_dict(json.load(f))


def _corpus(path: str) -> str:
    return os.path.join(ROOT, "corpus", path)


@pytest.mark.parametrize(
    "path", ["zero1_owner_rs.py:OwnerZeRO1", "zero1_sync_in_step.py:SyncInStepZeRO1"]
)
def test_a_float32_layers_state_is_judged_at_float32(world, path):
    """A correct ZeRO-1 reduce-scattering a float32 layer's gradients in another order than the
    oracle's sum passes: that layer's optimizer state is judged at float32's rounding (it was
    judged at float64's: 7.5e-9 against 6.2e-11 allowed, at step 0)."""
    result = run_case(
        world, resolve_target(_corpus(path), "zero"), _pinned("float32_layer_zero1_state")
    )
    assert result.ok, result.describe()


@pytest.mark.parametrize(
    "path, prop",
    [
        ("zero1_sum.py:SumZeRO1", "optimizer-state"),
        ("zero1_keeps_accumulated.py:KeepsAccumulatedZeRO1", "optimizer-state"),
    ],
)
def test_the_float32_layer_case_still_fails_a_broken_zero1(world, path, prop):
    """The same case still fails the ZeRO-1s with one planted bug."""
    result = run_case(
        world, resolve_target(_corpus(path), "zero"), _pinned("float32_layer_zero1_state")
    )
    assert prop in result.failed_properties, result.describe()


@pytest.mark.parametrize("target", ["sharded", _corpus("sharded_plain.py:PlainShardedOptimizer")])
def test_a_clip_across_two_dtypes_is_judged_at_the_coarser(world, target):
    """A correct sharded optimizer clipping the global norm of float32 and float64 gradients
    passes: the coefficient carries float32 rounding into every clipped gradient (Note [Clipping
    across dtypes]; a float64 gradient was judged at float64's bound: 2.9e-11 against 1.8e-16)."""
    result = run_case(
        world, resolve_target(target, "sharded"), _pinned("float32_layer_clip_sharded")
    )
    assert result.ok, result.describe()


@pytest.mark.parametrize(
    "target",
    [
        "paracheck.mutants.sharding:ClipLocalNorm",
        _corpus("sharded_clip_local.py:LocalClipShardedOptimizer"),
    ],
)
def test_the_clip_case_still_fails_a_local_norm(world, target):
    """The same case fails the sharded optimizers that clip by their own shard's norm."""
    result = run_case(
        world, resolve_target(target, "sharded"), _pinned("float32_layer_clip_sharded")
    )
    assert "gradients" in result.failed_properties, result.describe()


@pytest.mark.parametrize("target", ["zero1", "torch-zero"])
def test_a_one_dtype_builtin_skips_two_dtypes(world, target):
    """The built-in ZeRO-1 (one flat buffer) and torch's ZeroRedundancyOptimizer take one dtype:
    a case with a float32 layer is skipped with their declared reason, never reported as the
    target raising; a given case says so (``case_report``)."""
    result = run_case(world, resolve_target(target), _pinned("float32_layer_zero1_state"))
    assert result.ok and "float32_layer" in result.extra.get("skipped", ""), result.describe()
    notes = case_report(resolve_target(target), result).notes
    assert notes and notes[0].startswith("not supported"), notes
