"""The exact quantities behind the merge gate (paracheck.accounting.record) equal what the code
does, to the byte, and move when a planted regression moves them."""

import pytest

from paracheck.bench.step import StepSpec, account_step
from paracheck.workloads.lm import LMSpec, lm_parameter_count

# 10 parameters: 2 embeddings, 6 per block, final norm, head.
TINY = LMSpec(vocab_size=16, context_length=4, d_model=8, d_ff=16, num_layers=1, num_heads=2)
N = lm_parameter_count(TINY)
PARAMS = 10


def _account(world, variant, **kw):
    return account_step(
        world, StepSpec(variant, TINY, world_size=kw.pop("world_size", 2), batch=2, **kw)
    )


def test_flat_traffic_is_one_all_reduce_of_gradients_and_flags(world):
    """FlatDDP: one all-reduce per step carrying every float32 gradient element and one flag per parameter."""
    a = _account(world, "flat")
    assert a.collectives == 1 and a.collectives_by_kind == {"all_reduce": 1}
    assert a.payload_bytes == 4 * (N + PARAMS)
    assert a.bus_bytes == 4 * (N + PARAMS)  # 2(W-1)/W = 1 at W = 2


def test_naive_traffic_is_one_all_reduce_per_parameter_plus_flags(world):
    """NaiveDDP: a presence all-reduce, then one all-reduce per parameter."""
    a = _account(world, "naive")
    assert a.collectives == PARAMS + 1
    assert a.payload_bytes == 4 * (N + PARAMS)


def test_bus_bytes_follow_the_ring_factor_at_world_size_three(world):
    """At W = 3 an all-reduce sends 2(W-1)/W = 4/3 of its payload per rank."""
    a = _account(world, "flat", world_size=3)
    assert a.bus_bytes == pytest.approx(4 * (N + PARAMS) * 4 / 3, rel=1e-12)


def test_adamw_state_is_two_moments_and_a_step_per_parameter(world):
    """AdamW keeps exp_avg and exp_avg_sq (4 bytes per element each) and a float32 step per parameter."""
    a = _account(world, "flat")
    assert a.optimizer_state_bytes == 8 * N + 4 * PARAMS
    assert a.param_bytes == 4 * N and a.grad_bytes == 4 * N


def test_extra_gradient_buffer_raises_every_peak_by_its_size(world):
    """A planted full-size gradient buffer (FatFlatDDP) adds exactly 4 N bytes at every memory point and nothing else."""
    base = _account(world, "flat")
    fat = _account(world, "paracheck.bench._planted:FatFlatDDP")
    assert fat.peak_init_bytes - base.peak_init_bytes == 4 * N
    assert fat.peak_before_step_bytes - base.peak_before_step_bytes == 4 * N
    assert fat.peak_step_bytes - base.peak_step_bytes == 4 * N
    assert (fat.collectives, fat.payload_bytes, fat.optimizer_state_bytes) == (
        base.collectives,
        base.payload_bytes,
        base.optimizer_state_bytes,
    )


def test_redundant_collective_is_counted(world):
    """A planted extra all-reduce of the flags (ChattyFlatDDP) shows as one collective and 4 x PARAMS bytes more."""
    base = _account(world, "flat")
    chatty = _account(world, "paracheck.bench._planted:ChattyFlatDDP")
    assert chatty.collectives == base.collectives + 1
    assert chatty.payload_bytes == base.payload_bytes + 4 * PARAMS


def test_accounting_is_reproducible(world):
    """Two accountings of the same step agree on every exact quantity (the gate fails on any increase)."""
    a, b = (
        _account(world, "bucketed", bucket_mb=0.001),
        _account(world, "bucketed", bucket_mb=0.001),
    )
    assert a.to_dict() == b.to_dict()


def test_host_cost_is_reproducible_and_nonzero(world):
    """Operators, launches, allocations and hook calls per step are the same in two accountings
    of the same step (Note [Host cost per step]); a step does work, so none of the first three is 0."""
    for variant in ("flat", "bucketed", "torch-ddp", "zero1"):
        a, b = _account(world, variant, bucket_mb=0.001), _account(world, variant, bucket_mb=0.001)
        got = [(x.operators, x.launches, x.allocations, x.hooks) for x in (a, b)]
        assert got[0] == got[1], (variant, got)
        assert a.operators > a.launches > 0 and a.allocations > 0, (variant, got[0])


def test_hooks_counted_per_parameter_and_backward(world):
    """FlatDDP registers no Python hooks; the bucketed and overlapped designs call one per
    trainable parameter per backward (after accumulation) plus one engine callback per backward,
    and none before accumulation (a hook there cost the overlapped DDP a quarter of its step on two
    GPUs: Note [Several backward passes in one window]); torch DDP's hooks are C++ and not
    counted."""
    assert _account(world, "flat").hooks == 0
    assert _account(world, "torch-ddp").hooks == 0
    assert _account(world, "bucketed", bucket_mb=0.001).hooks == PARAMS + 1
    assert _account(world, "overlapped").hooks == PARAMS + 1


def test_planted_launch_is_one_operator_and_one_launch_more(world):
    """A redundant in-place multiply (RelaunchingFlatDDP) is exactly one operator and one launch
    more per step, with no allocation, hook or collective more."""
    base = _account(world, "flat")
    more = _account(world, "paracheck.bench._planted:RelaunchingFlatDDP")
    assert (more.operators - base.operators, more.launches - base.launches) == (1, 1)
    assert (more.allocations, more.hooks, more.collectives) == (
        base.allocations,
        base.hooks,
        base.collectives,
    )


def test_planted_hooks_are_one_call_per_parameter_more(world):
    """A do-nothing hook on every parameter (HookedFlatDDP) adds PARAMS hook calls per step and
    no operator."""
    base = _account(world, "flat")
    hooked = _account(world, "paracheck.bench._planted:HookedFlatDDP")
    assert hooked.hooks - base.hooks == PARAMS
    assert (hooked.operators, hooked.launches) == (base.operators, base.launches)


def test_gate_fails_on_one_launch_more():
    """The rule the gate applies to an exact quantity: one launch more is a regression."""
    from paracheck.gate.rule import EXACT_QUANTITIES, exact_verdict

    assert {"operators", "launches", "allocations", "hooks"} <= set(EXACT_QUANTITIES)
    assert exact_verdict([412, 412], [413, 413]) == "REGRESSION"
    assert exact_verdict([412, 412], [412, 412]) == "ok"
