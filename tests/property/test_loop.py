"""The loop kind: a whole training step, train_step(model, optimizer, micro_batches), against the
oracle under the loss semantics it declares (Note [Loss semantics]); every loop mutant killed.

Models: the small language models loop_cases draws (vocabulary 7 or 16, 2-5 tokens, 1-2 layers)."""

from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from paracheck.cases import (
    IGNORE_INDEX,
    Case,
    GroupSpec,
    OptimizerSpec,
    batch_for,
    build_case_model,
    micro_batches,
)
from paracheck.check.property import check_target
from paracheck.check.targets import TargetError, _loop_target, resolve_target
from paracheck.mutants import MUTANTS
from paracheck.oracle.train import train
from paracheck.workloads.lm import LMSpec

LOOPS = Path(__file__).with_name("_loops.py")
SIZES = (1, 2, 3)
LOOP_MUTANTS = sorted(n for n, m in MUTANTS.items() if m.kind == "loop")

CASE = Case(
    model=LMSpec(vocab_size=7, context_length=4, d_model=8, d_ff=8, num_layers=1, num_heads=2),
    world_size=3,
    batch_sizes=(1, 3, 2),
    steps=2,
    accumulation=3,
    optimizer=OptimizerSpec("sgd", (GroupSpec(params=(), lr=0.1),)),
    seed=5,
    loss="token-mean",
    padded=True,
    empty_micro=True,
    last_window=2,
)


def _check(world, target, n=12):
    return check_target(target, world, world_sizes=SIZES, max_examples=n, labels=False)


@pytest.mark.parametrize(
    "name",
    [
        "loop",
        "loop-batch-mean",
        f"{LOOPS}:clipped_step",
        f"{LOOPS}:BatchMeanStep",
        "paracheck.loop:train_step_fp16",
        f"{LOOPS}:fp16_clipped_step",
    ],
)
def test_correct_loops_pass(world, name):
    """Each correct loop passes a drawn search, eagerly here (drawing compiled cases took these
    searches from about 7 s to 26 s): the compiled loops pass in tests/property/test_compiled.py."""
    target = resolve_target(name, "loop" if name.endswith("Step") else None)
    report = check_target(
        target, world, world_sizes=SIZES, max_examples=12, labels=False, features="-compile"
    )
    assert report.passed, report.failure.describe() if report.failure else report
    assert report.examples >= 10


@pytest.mark.parametrize("name", LOOP_MUTANTS)
def test_loop_mutant_is_killed(world, name):
    target = replace(resolve_target(MUTANTS[name].path, "loop"), name=name)
    report = _check(world, target)
    assert not report.passed, f"{name} survived"
    # Caught in the gradients, or for a bug of the step alone in the parameters (Note [Comparing
    # an update]), at least ten times outside the (float32) tolerance: not by luck.
    d = report.failure.divergence
    wanted = "parameters" if name == "loop-decay-applied-twice" else "gradients"
    assert d.property == wanted and d.max_abs_diff >= 10 * d.tolerance, d.describe()


def test_the_token_mean_oracle_is_one_process_cross_entropy_over_every_valid_token():
    """Step 0's gradient equals that of one cross-entropy over the valid tokens of every rank's
    every micro-batch, computed in one call: the semantics, not its implementation."""
    ref = train(CASE)
    model = build_case_model(CASE, 0)  # rank 0's initial model, as the oracle's
    batches = [batch_for(CASE, 0, m, r) for r in range(3) for m in range(3)]
    logits = torch.cat([model(x).flatten(0, 1) for x, _ in batches])
    targets = torch.cat([y.flatten() for _, y in batches])
    assert (targets == IGNORE_INDEX).any() and (targets != IGNORE_INDEX).any()
    F.cross_entropy(logits, targets, ignore_index=IGNORE_INDEX).backward()
    for p, g in zip(model.parameters(), ref.steps[0].grads):
        torch.testing.assert_close(g, p.grad, rtol=1e-12, atol=1e-15)


def test_padding_leaves_a_prefix_and_the_empty_micro_batch_is_empty():
    for r in range(3):
        for m in range(3):
            y = batch_for(CASE, 0, m, r)[1]
            valid = y != IGNORE_INDEX
            # A valid prefix per row: once padding starts it does not stop.
            assert torch.equal(valid, valid.cummin(dim=1).values)
            assert valid.any() == (not (m == 0 and r == 2))


def test_the_last_window_is_partial():
    assert [micro_batches(CASE, k) for k in range(2)] == [3, 2]


@pytest.mark.parametrize(
    "changes, word",
    [
        (dict(loss="mean"), "loss="),
        (dict(model=Case().model), "language model"),
        (dict(loss="batch-mean"), "empty_micro"),
        (dict(last_window=3), "last_window=3"),
    ],
)
def test_bad_loop_cases_are_refused(changes, word):
    with pytest.raises(ValueError, match=word):
        replace(CASE, **changes)


def test_a_step_function_is_read_as_a_loop_and_its_options_are_checked():
    assert resolve_target(f"{LOOPS}:clipped_step").kind == "loop"
    assert resolve_target(f"{LOOPS}:clipped_step").clip_norm == 0.01
    assert resolve_target("loop-batch-mean").loss == "batch-mean"
    assert resolve_target("loop", loss="batch-mean").loss == "batch-mean"
    with pytest.raises(TargetError, match="loss='mean'"):
        resolve_target("loop", loss="mean")
    with pytest.raises(TargetError, match="clip_norm=-1"):
        resolve_target(f"{LOOPS}:clipped_step", clip_norm=-1)
    with pytest.raises(TargetError, match="for loop targets"):
        resolve_target("paracheck.ddp:FlatDDP", loss="token-mean")


def test_the_update_is_applied_to_the_gradients_the_loop_stepped_with():
    """Note [Anchored steps]: with target_gradients, the oracle's parameters are its update of the
    loop's own gradients (SGD here: p - lr * g_loop), while its recorded gradients stay its own."""
    free = train(CASE)
    doubled = [(s.params, [2 * g for g in s.grads]) for s in free.steps]
    anchored = train(CASE, anchors=doubled, target_gradients=True)
    initial = free.initial_params
    for p0, g, p1, mine in zip(
        initial, free.steps[0].grads, anchored.steps[0].params, anchored.steps[0].grads
    ):
        torch.testing.assert_close(p1, p0 - 0.1 * (2 * g), rtol=0, atol=1e-15)
        assert torch.equal(mine, g)


def test_a_loop_declares_its_own_autocast_and_scaler():
    """Note [A loop's own precision]: the declaration, not --precision, fixes a loop's casts; a
    step with a scaler parameter is a float16 step; declarations that cannot hold are refused."""
    from paracheck.strategies._loop import loop_precision

    amp = resolve_target(f"{LOOPS}:fp16_clipped_step")
    assert (amp.autocast, amp.scaler, amp.clip_norm) == ("float16", True, 0.01)
    assert (resolve_target("loop").autocast, resolve_target("loop").scaler) == (None, False)
    assert loop_precision(None, "float16") == loop_precision("fp32", "float16") == "fp16"
    with pytest.raises(ValueError, match="precision='bf16'.*autocast='float16'"):
        loop_precision("bf16", "float16")
    with pytest.raises(ValueError, match="precision='fp16'.*paracheck_autocast"):
        loop_precision("fp16", None)

    def bad(model, optimizer, micro_batches, scaler):
        pass

    bad.paracheck_autocast = "bfloat16"
    with pytest.raises(TargetError, match="paracheck_autocast='bfloat16' with a scaler"):
        _loop_target("bad", "m:bad", bad, None)
    bad.paracheck_autocast = "float8"
    with pytest.raises(TargetError, match="paracheck_autocast='float8' must be one of"):
        _loop_target("bad", "m:bad", bad, None)


def test_fp16_loop_cases_scale_the_loss_with_and_without_an_overflowing_first_backward():
    """Every case of a scaler loop scales its loss, and both scales are drawn: a skipped first
    step on every rank, and none."""
    from hypothesis import given, settings

    from paracheck.strategies._loop import loop_cases

    seen, optimizers = set(), set()

    @settings(max_examples=30, derandomize=True, database=None)
    @given(loop_cases(world_sizes=SIZES, autocast="float16", scaler=True))
    def draw(case):
        assert (case.dtype, case.autocast) == ("float32", "float16")
        seen.add(case.loss_scale)
        optimizers.add(case.optimizer.name)

    draw()
    assert seen == {2.0**40, 2.0**8}
    # A loop's step is judged on its own gradients: Adam is drawn below float32 too.
    assert "sgd" in optimizers and optimizers & {"adam", "adamw"}


def test_a_loop_under_autocast_is_judged_at_its_compute_dtype_from_step_0():
    """A loop computes its loss its own way: its bfloat16 roundings differ from the oracle's from
    step 0 (a correct bf16 loop failed 7x past float32's tolerance on a GPU), so its tensors are
    judged at the compute dtype's tolerance on every device (Note [Autocast])."""
    from paracheck.check.properties.equivalence import by_the_oracles_operations
    from paracheck.oracle.tolerance import tensor_tolerance, tolerance_for

    assert by_the_oracles_operations(None, derived=True)
    assert by_the_oracles_operations("cpu", derived=True)
    assert not by_the_oracles_operations("cuda", derived=True)
    assert not by_the_oracles_operations(None, derived=False)
    case = Case(world_size=1, batch_sizes=(1,), steps=1, autocast="bfloat16", dtype="float32")
    loop = tensor_tolerance(case, 0, "float32", ["float32"], same_operations=False)
    ddp = tensor_tolerance(case, 0, "float32", ["float32"], same_operations=True)
    assert (
        loop.grads == tolerance_for("bfloat16").grads > ddp.grads == tolerance_for("float32").grads
    )
