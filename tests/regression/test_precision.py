"""Precision of a case (Note [Precision of a case]): autocast and float16 loss scaling, applied
alike by the oracle and the ranks; a step the GradScaler skips on every rank; the precision
families the strategies draw; and a DDP that reduces in bfloat16 caught far outside tolerance.

Model: MLP 5 -> 6 -> 4 -> 3 with biases, float32 parameters, SGD with momentum."""

import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings

from paracheck.cases import Case, GroupSpec, OptimizerSpec
from paracheck.check.features import case_features, without
from paracheck.check.properties.closeness import close
from paracheck.check.run import run_case
from paracheck.check.targets import Target, resolve_target
from paracheck.mutants import MUTANTS
from paracheck.oracle.tolerance import step0_grad_rtol
from paracheck.oracle.train import train
from paracheck.strategies import cases, sharding_cases
from paracheck.strategies._core import PRECISIONS, precision_settings
from paracheck.workloads import MLPSpec

BASE = Case(
    model=MLPSpec(in_features=5, widths=(6, 4, 3), bias=True),
    world_size=3,
    batch_sizes=(2, 1, 3),
    steps=3,
    accumulation=2,
    dtype="float32",
    optimizer=OptimizerSpec("sgd", (GroupSpec(params=(), lr=0.05, momentum=0.9),)),
    bucket_size_mb=1e-4,
    seed=11,
)
BF16 = replace(BASE, autocast="bfloat16")
FP16_SKIP = replace(BASE, autocast="float16", loss_scale=2.0**40)
FP16 = replace(BASE, autocast="float16", loss_scale=2.0**8)


def test_a_loss_scale_of_2_40_skips_the_first_step_only():
    steps = train(FP16_SKIP).steps
    assert [s.skipped for s in steps] == [True, False, False]
    initial = train(replace(FP16_SKIP, steps=1)).initial_params
    for p, p0 in zip(steps[0].params, initial):
        assert torch.equal(p, p0)  # the skipped step changed nothing
    assert not any(s.skipped for s in train(FP16).steps)


def test_unscaled_gradients_equal_the_unscaled_run():
    """The GradScaler's scale is a power of two: scaling the loss and unscaling the gradients
    changes no bit where nothing overflows or underflows."""
    scaled = train(FP16).steps[0].grads
    plain = train(replace(FP16, loss_scale=None)).steps[0].grads
    for a, b in zip(scaled, plain):
        assert torch.equal(a, b)


def test_autocast_changes_the_forward():
    a = train(BF16).steps[0].grads[0]
    b = train(replace(BF16, autocast=None)).steps[0].grads[0]
    assert not torch.equal(a, b)


@pytest.mark.parametrize("name", ["naive", "bucketed", "torch-ddp", "sharded", "torch-zero"])
@pytest.mark.parametrize("case", [BF16, FP16_SKIP], ids=["bf16-autocast", "fp16-skip"])
def test_correct_designs_pass(world, name, case):
    result = run_case(world, resolve_target(name), case)
    assert result.ok and "skipped" not in result.extra, result.describe()


def test_a_zero_wrapper_skips_loss_scaled_cases_and_passes_autocast(world):
    target = resolve_target("zero1")
    skipped = run_case(world, target, FP16_SKIP)
    assert "GradScaler" in skipped.extra.get("skipped", ""), skipped.describe()
    result = run_case(world, target, BF16)
    assert result.ok and "skipped" not in result.extra, result.describe()


def test_reducing_in_bfloat16_is_caught_far_outside_tolerance(world):
    """Under autocast the gradients are float32 and compared at float32's tolerance at step 0
    (Note [Step 0: a derived bound]); rounding them to bfloat16 for the all-reduce is 100x beyond
    it (measured: 383x)."""
    mutant = MUTANTS["ddp-reduced-in-bf16"]
    result = run_case(world, Target(mutant.name, mutant.path, mutant.kind), BF16)
    div = result.divergence
    assert div is not None and div.step == 0, result.describe()
    assert div.what == "grad" and div.max_abs_diff >= 10 * div.tolerance, result.describe()
    assert div.worst_ratio >= 100 * step0_grad_rtol(BF16, "float32", 0), result.describe()


def test_non_finite_elements_are_compared_by_position():
    ref = torch.tensor([1.0, float("inf"), 2.0])
    assert close(torch.tensor([1.0, float("nan"), 2.0]), ref, 1e-6)[0]
    assert not close(torch.tensor([1.0, 3.0, 2.0]), ref, 1e-6)[0]
    assert not close(torch.tensor([1.0, float("inf"), 2.5]), ref, 1e-6)[0]
    assert not close(torch.tensor([float("inf"), 1.0, 2.0]), torch.tensor([1.0, 1.0, 2.0]), 1)[0]


@pytest.mark.parametrize(
    "changes, word",
    [
        (dict(autocast="float8"), "autocast"),
        (dict(autocast="bfloat16", dtype="float64"), "autocast"),
        (dict(autocast="bfloat16", loss_scale=2.0**8), "loss_scale"),
        (dict(autocast="float16", loss_scale=3.0), "power of two"),
        (dict(autocast="float16", loss_scale=2.0**8, closure=True), "closure"),
    ],
)
def test_bad_precision_settings_are_refused(changes, word):
    with pytest.raises(ValueError, match=word):
        replace(BASE, **changes)


def test_cases_from_before_precision_still_load():
    d = BASE.to_dict()
    del d["autocast"], d["loss_scale"]
    assert Case.from_dict(d) == BASE


def test_features_remove_precision_settings():
    assert {"low-precision", "autocast", "loss-scaling"} <= case_features(FP16)
    assert without(FP16, "loss-scaling") == replace(FP16, loss_scale=None)
    assert without(FP16, "autocast") == replace(BASE)
    assert without(FP16, "low-precision") == replace(BASE, dtype="float64")


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("strategy", [cases, sharding_cases])
def test_every_case_drawn_is_in_its_family(precision, strategy):
    seen, adam_below = set(), set()

    @settings(max_examples=60, derandomize=True, database=None)
    @given(strategy(world_sizes=(1, 2, 3), precision=precision))
    def check(case):
        setting = (case.dtype, case.autocast, case.loss_scale)
        assert setting in precision_settings(precision)  # a closure's None scale is one of them
        assert not (case.closure and case.loss_scale is not None)
        if case.dtype == "bfloat16" or case.autocast is not None:
            # A sharding target's step is judged on its own gradients: Adam is drawn there too
            # (Note [Precision from the seed]).
            if strategy is cases:
                assert case.optimizer.name == "sgd"
            else:
                adam_below.add(case.optimizer.name != "sgd")
        seen.add(setting)

    check()
    assert len(seen) >= min(2, len(precision_settings(precision))), seen
    if strategy is sharding_cases and precision in ("bf16", "fp16", "mixed"):
        assert adam_below == {True, False}, adam_below


def test_strategies_refuse_an_unknown_precision():
    with pytest.raises(ValueError, match="precision='fp8'"):
        cases(precision="fp8").example()


@pytest.mark.slow
def test_cli_refuses_disagreeing_dtype_and_precision():
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "paracheck.cli",
            "check",
            "naive",
            "--dtype",
            "float32",
            "--precision",
            "bf16",
        ],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2 and "disagree" in out.stderr, out.stderr


def test_loss_scales_are_powers_of_two():
    for precision in PRECISIONS:
        for _, _, scale in precision_settings(precision):
            assert scale is None or math.frexp(scale)[0] == 0.5


# -- Note [Anchored steps] ---------------------------------------------------------------------


def _records_of(traj):
    """A trajectory as a rank's record (every rank alike)."""
    from paracheck.check.ranks.record import RankRecord, RankStep

    steps = tuple(RankStep(s.params, s.grads) for s in traj.steps)
    return RankRecord(traj.initial_params, traj.initial_buffers, steps)


def test_anchoring_on_its_own_steps_changes_no_bit():
    free = train(FP16)
    again = train(FP16, anchors=[(s.params, s.grads) for s in free.steps])
    for a, b in zip(free.steps, again.steps):
        assert all(torch.equal(x, y) for x, y in zip(a.params + a.grads, b.params + b.grads))


def test_an_anchored_step_starts_from_the_targets_parameters():
    free = train(BF16)
    moved = [p + 1.0 for p in free.steps[0].params]
    anchored = train(BF16, anchors=[(moved, free.steps[0].grads)])
    assert not torch.equal(anchored.steps[1].params[0], free.steps[1].params[0])
    assert torch.equal(anchored.steps[0].params[0], free.steps[0].params[0])


def test_an_error_after_step_0_is_judged_at_step_0s_tolerance():
    """A parameter off by 2**-10 relative after step 1 (a quarter of bfloat16's unit roundoff) is
    inside the compute dtype's tolerance (2e-2) a free trajectory needs, and caught by the anchored
    comparison, which holds every step to float32's."""
    from paracheck.check.properties._case import param_names
    from paracheck.check.properties.equivalence import compare

    free = train(BF16)
    record = _records_of(free)
    bad = list(record.steps)
    bad[1] = replace(bad[1], params=[p * (1 + 2.0**-10) for p in bad[1].params])
    record = replace(record, steps=tuple(bad))
    ranks = [record] * BF16.world_size
    names = param_names(BF16)
    assert compare(free, ranks, names)[0] is None  # the free comparison's step-1 tolerance
    anchored = train(BF16, anchors=[(s.params, s.grads) for s in record.steps])
    div, _ = compare(anchored, ranks, names, anchored=True)
    assert div is not None and div.step == 1 and div.property == "parameters", div


# Found by scripts/nightly.py (precision mixed, seeds 5003, 5006, 5013) on correct designs: a
# result far smaller than its terms (Note [Terms of an update]) and a derived bound with too many
# terms for bfloat16 (an infinite rtol times a zero gradient was nan).
_CANCELLATION = Path(__file__).with_name("cases")


@pytest.mark.parametrize(
    "name, file",
    [
        ("bucketed", "bf16_cancellation_bucketed"),
        ("zero1", "bf16_cancellation_zero1"),
        ("sharded", "bf16_cancellation_sharded"),
        # Seed 9006: a step-0 momentum buffer is the gradient, judged at the gradient's bound.
        ("zero1", "bf16_momentum_step0_zero1"),
    ],
)
def test_bfloat16_results_smaller_than_their_terms_pass(world, name, file):
    case = Case.from_json((_CANCELLATION / f"{file}.json").read_text())
    result = run_case(world, resolve_target(name), case)
    assert result.ok, result.describe()


def test_update_terms_scale_a_result_near_zero():
    """A 1-element parameter that an update took from 5e-2 to 1e-3 is judged on the scale of
    5e-2: two bfloat16 ulps of the terms pass, a wrong update of the terms' size does not."""
    from paracheck.check.properties.closeness import update_terms

    before, ref = torch.tensor([5e-2]), torch.tensor([1e-3])
    rtol = 2e-2
    assert not close(ref + 4.9e-4, ref, rtol)[0]  # the result's own scale: a false failure
    assert close(ref + 4.9e-4, ref, rtol, update_terms(ref, before))[0]
    assert not close(ref + 5e-2, ref, rtol, update_terms(ref, before))[0]
    # An infinite bound allows everything, zeros included (not nan).
    assert close(torch.zeros(2), torch.zeros(2), float("inf"))[0]
