"""The checkpoint's exact quantities (Note [Checkpoint bytes] in paracheck.bench._checkpoint):
bytes written and read per rank equal what the saved tensors' sizes derive, to the byte, and the
gate holds them and the peak during the load as it holds the step's."""

import math

import pytest

from paracheck.bench.step import StepSpec, account_step
from paracheck.workloads.lm import LMSpec, TransformerLM, lm_parameter_count

# 10 parameters: 2 embeddings, 6 per block, final norm, head (float32 AdamW).
TINY = LMSpec(vocab_size=16, context_length=4, d_model=8, d_ff=16, num_layers=1, num_heads=2)
N = lm_parameter_count(TINY)
PARAMS = 10
W = 2


def _account(world, variant):
    return account_step(world, StepSpec(variant, TINY, world_size=W, batch=2, fused=False))


@pytest.mark.parametrize("variant", ["flat", "sharded", "torch-zero"])
def test_a_whole_checkpoint_is_the_parameters_two_moments_and_a_step_each(world, variant):
    """A DDP's AdamW, a sharded optimizer's consolidated state_dict() and torch's
    ZeroRedundancyOptimizer's (consolidated onto rank 0): rank 0 writes, and every rank reads, the float32 parameters, both moments of each and a float32 step per
    parameter: 12 N + 4 x 10 bytes, however the state was sharded."""
    a = _account(world, variant)
    assert a.checkpoint_save_bytes == a.checkpoint_load_bytes == 12 * N + 4 * PARAMS


def test_a_zero1_checkpoint_writes_its_padded_buckets(world):
    """Zero1's parameters are views of its flat buckets, padded to a multiple of W: the model's
    state_dict() holds those storages, which torch.save writes whole, beside the consolidated
    state (unpadded: each parameter's state is its own tensor)."""
    from paracheck.zero.partition import flat_layout

    numels = [p.numel() for p in TransformerLM(TINY).parameters()]
    padded = flat_layout(numels, W, bucket_numel=int(25 * 2**20) // 4).padded_numel
    a = _account(world, "zero1")
    assert a.checkpoint_save_bytes == a.checkpoint_load_bytes == 4 * padded + 8 * N + 4 * PARAMS


def test_an_fsdp2_rank_writes_and_reads_its_own_shards(world):
    """torch's FSDP2: every parameter and both moments are DTensors sharded on dim 0 (rank 0
    holding ceil(d0 / W) rows), the steps plain tensors that rank 0 writes: the largest rank's
    bytes are rank 0's shards, three times, and the steps."""
    rows = sum(math.ceil(p.shape[0] / W) * p[0].numel() for p in TransformerLM(TINY).parameters())
    a = _account(world, "torch-fsdp")
    assert a.checkpoint_save_bytes == a.checkpoint_load_bytes == 12 * rows + 4 * PARAMS


def test_the_load_peaks_above_the_model_its_state_and_the_read_checkpoint(world):
    """While a sharded optimizer's checkpoint is loaded, the model, the rank's state and the
    checkpoint read into new tensors are alive at once (that two accountings agree on the peak
    is test_bench_exact's test_accounting_is_reproducible)."""
    a = _account(world, "sharded")
    assert a.peak_load_bytes >= a.param_bytes + a.optimizer_state_bytes + a.checkpoint_load_bytes


def test_the_gate_holds_the_checkpoint_quantities_exactly():
    """The gate's exact quantities include the checkpoint's three: one byte more is a
    regression."""
    from paracheck.gate.rule import EXACT_QUANTITIES, exact_verdict

    assert {"checkpoint_save_bytes", "checkpoint_load_bytes", "peak_load_bytes"} <= set(
        EXACT_QUANTITIES
    )
    assert exact_verdict([51304, 51304], [51305, 51305]) == "REGRESSION"
