"""ZeRO-2's memory against ZeRO-1's, to the byte, as the analytic model derives it; and each
benchmark job measured from a clean state (Note [Measuring from a clean state])."""

import pytest
import torch

from paracheck.accounting import state_model, training_memory, zero_construction_bytes
from paracheck.bench.step import StepSpec, account_step, time_step
from paracheck.workloads.lm import LMSpec, TransformerLM

# Parameters outweigh activations (context 2, batch 1), so the peak before the step falls inside
# backward, where ZeRO-2 also holds the full buffers of the buckets it is reducing. 106944
# parameters (P' = P at W = 2) in 15 buckets of at most 4096 elements (16 KiB); a d_ff matrix
# (16384) is a bucket of its own.
LM = LMSpec(vocab_size=64, context_length=2, d_model=64, d_ff=256, num_layers=2, num_heads=2)
BUCKET_MB = 16384 / 2**20
BATCH = 1
W = 2


def _numels() -> list[int]:
    return [p.numel() for p in TransformerLM(LM).parameters() if p.requires_grad]


def _account(world, variant):
    spec = StepSpec(variant, LM, world_size=W, batch=BATCH, bucket_mb=BUCKET_MB, fused=False)
    return account_step(world, spec)


def test_zero2_memory_is_zero1_less_the_gradients_it_does_not_keep(world):
    """Two gloo ranks, float32 AdamW, exact bytes per rank.

    During the optimizer step ZeRO-1 holds the padded buckets' full gradients (4 P'), ZeRO-2 only
    its shards (4 P'/W): the peaks differ by exactly 4 (P' - P'/W) (``training_memory``). At
    every point of forward and backward ZeRO-2 holds the same less that, plus the full buffers
    of the buckets it is reducing: the one launched last and the one being filled, at most two
    of the largest, so its peak before the step is at most ZeRO-1's - 4 (P' - P'/W) + 4 x 2 x
    16384 (measured: 124928 above ZeRO-1's less the gradients). Construction differs by what
    ``zero_construction_bytes`` derives, the batch allocated before it."""
    from paracheck.zero.partition import flat_layout

    numels, e = _numels(), 4
    bucket_numel = int(BUCKET_MB * 2**20) // e
    layout = flat_layout(numels, W, bucket_numel=bucket_numel)
    padded, largest = layout.padded_numel, max(b.padded for b in layout.buckets)
    assert (len(layout.buckets), padded, largest) == (15, 106944, 16384)

    one, two = _account(world, "zero1"), _account(world, "zero2")
    grads = {
        d: training_memory(
            d, numels, e, W, rank=0, model=state_model("adamw"), bucket_numel=bucket_numel
        ).grads
        for d in ("zero1", "zero2")
    }
    kept = grads["zero1"] - grads["zero2"]
    assert kept == 4 * (padded - padded // W) == 213888
    assert one.peak_step_bytes - two.peak_step_bytes == kept
    without_grads = one.peak_before_step_bytes - kept
    assert two.peak_before_step_bytes - without_grads == 124928 <= 4 * 2 * largest < kept
    # Inputs and targets, int64, allocated before the constructor (the schedule's watch tracks
    # them from the start), so they lie under the constructor's whole peak.
    batch = 2 * BATCH * LM.context_length * 8
    init = {}
    for d in ("zero1", "zero2"):
        most, _held = zero_construction_bytes(d, numels, e, W, bucket_numel=bucket_numel)
        init[d] = most + batch
    assert (
        one.peak_init_bytes - two.peak_init_bytes == init["zero1"] - init["zero2"] == 197888
    )  # no presence flags at construction
    assert (one.param_bytes, one.optimizer_state_bytes, one.collectives_by_kind) == (
        two.param_bytes,
        two.optimizer_state_bytes,
        two.collectives_by_kind,
    )


@pytest.mark.slow
def test_zero2_waiting_at_the_end_of_backward_peaks_above_zero1(world):
    """LateZero2 waits for every reduce-scatter at the end of backward: every bucket's full
    buffer is alive there beside the shards, so its peak before the step passes ZeRO-1's, while
    Zero2's stays below it (the regression the bound above guards against)."""
    one = _account(world, "zero1").peak_before_step_bytes
    late = _account(world, "paracheck.bench._planted:LateZero2").peak_before_step_bytes
    assert late > one > _account(world, "zero2").peak_before_step_bytes


@pytest.fixture(scope="module")
def own_world():
    """Two ranks of this module's own: the session's World is shared with other test files,
    whose jobs may keep tensors in the ranks (a job that holds one on purpose), and a job here
    must start from nothing."""
    from paracheck.world import World

    with World(W, timeout=60.0) as world:
        yield world


def _time(world, variant, world_size=W):
    spec = StepSpec(variant, LM, world_size=world_size, batch=BATCH, steps=1, warmup=0)
    return time_step(world, spec, count=True)


@pytest.mark.slow
def test_a_leaked_wrapper_is_counted_as_left_behind_and_not_as_the_next_jobs_memory(own_world):
    """LeakyFlatDDP's hooks close over it: after its job its module (parameters and last
    gradients, 2 x 4 x 106944 bytes, and the rotary tables) is still held; the next job starts
    with exactly those bytes held and leaves no more. ZeRO-1, ZeRO-2 and FSDP leave nothing."""
    world = own_world
    try:
        leaky = _time(world, "paracheck.bench._planted:LeakyFlatDDP")
        after = _time(world, "zero1")
    finally:
        world.run("paracheck.bench._planted:free_leaks", None, world_size=W)
    assert leaky.start_bytes == 0
    buffers = sum(b.numel() * b.element_size() for b in TransformerLM(LM).buffers())
    assert leaky.left_bytes == 2 * 4 * sum(_numels()) + buffers
    assert (after.start_bytes, after.left_bytes) == (leaky.left_bytes, leaky.left_bytes)
    assert _time(world, "zero1").start_bytes == 0  # freed once the cycle is broken


@pytest.mark.parametrize(
    "variant",
    [
        "zero2",
        pytest.param("zero1", marks=pytest.mark.slow),
        pytest.param("fsdp", marks=pytest.mark.slow),
    ],
)
def test_builtin_wrappers_leave_nothing_behind(own_world, variant):
    """A job of a built-in wrapper starts from nothing and ends holding no tensor (its hooks hold
    it weakly)."""
    t = _time(own_world, variant)
    assert (t.start_bytes, t.left_bytes) == (0, 0), variant


def test_release_counts_the_tensors_still_referenced():
    """``release`` on the CPU counts every reachable tensor storage once: a view adds nothing,
    a dropped tensor nothing."""
    from paracheck.bench.step import release

    base = release(torch.device("cpu"))
    kept = torch.zeros(1000)
    view = kept[10:20]  # noqa: F841 - the same storage
    dropped = torch.zeros(500)
    del dropped
    assert release(torch.device("cpu")) - base == 4000
