"""The exact communication schedule of a step (Note [Communication schedule of a step] in
paracheck.accounting.schedule) of each DDP design at W = 2 on gloo, pinned; and the gate's
comparison failing on a design that launches after backward or adds a device sync."""

import pytest

from paracheck.accounting.schedule import StepSchedule, schedule_changes
from paracheck.bench.step import StepSpec, account_step
from paracheck.gate.rule import EXACT_QUANTITIES, exact_verdict
from paracheck.workloads.lm import LMSpec, lm_parameter_count

# 10 parameters: 2 embeddings, 6 per block, final norm, head.
TINY = LMSpec(vocab_size=16, context_length=4, d_model=8, d_ff=16, num_layers=1, num_heads=2)
N = lm_parameter_count(TINY)
PARAMS = 10
BUCKET_MB = 0.001  # 1048 bytes: the 3296 gradient bytes in several buckets


def _schedule(world, variant):
    a = account_step(world, StepSpec(variant, TINY, world_size=2, batch=2, bucket_mb=BUCKET_MB))
    return a, StepSchedule.from_dict(a.schedule)


@pytest.fixture(scope="module")
def bucketed(world):
    return _schedule(world, "bucketed")


def test_naive_launches_every_all_reduce_after_backward(world):
    """NaiveDDP: the presence all-reduce and one synchronous all-reduce per parameter, all in
    finish_gradient_synchronization, each waited for at once; nothing overlaps backward."""
    a, s = _schedule(world, "naive")
    assert [e.phase for e in s.collectives] == ["after_backward"] * (PARAMS + 1)
    assert a.launches_after_backward == PARAMS + 1
    assert a.bytes_after_backward == 4 * (N + PARAMS) and a.bytes_before_backward_end == 0
    assert sum(e.what == "wait" for e in s.events) == PARAMS + 1 and a.waits_in_backward == 0
    assert a.exposed_comm_pct_balanced == pytest.approx(100.0, abs=1e-7)
    assert s.grad_bytes == 4 * N


def test_flat_launches_one_all_reduce_after_backward(world):
    """FlatDDP: one all-reduce of every gradient and flag, after backward; its two host syncs are
    the flags' copy to the device and their read back."""
    a, s = _schedule(world, "flat")
    assert [(e.kind, e.phase, e.payload_bytes) for e in s.collectives] == [
        ("all_reduce", "after_backward", 4 * (N + PARAMS))
    ]
    assert [(e.kind, e.where) for e in s.events if e.what == "sync"] == [
        ("to_device", "DDPBase._presence"),
        ("tolist", "DDPBase._scatter_back"),
    ]


def test_overlapped_launches_one_all_reduce_per_parameter_during_backward(world):
    """OverlappedDDP: one all-reduce per parameter, each launched in backward once its gradient
    exists (shares strictly increasing, the first before 20% of gradient bytes), then the flags
    at the end of backward; nothing after backward, no wait inside it, and no device sync (the
    flags are made on the device, not copied from the host)."""
    a, s = _schedule(world, "overlapped")
    grads = s.collectives[:PARAMS]
    assert [e.phase for e in s.collectives] == ["backward"] * (PARAMS + 1)
    shares = [s.share(e) for e in grads]
    assert 0 < shares[0] < 0.2 and shares == sorted(set(shares)) and shares[-1] == 1.0
    assert s.collectives[-1].payload_bytes == 4 * PARAMS  # the presence flags, last
    assert a.launches_after_backward == 0 and a.waits_in_backward == 0
    assert [e for e in s.events if e.what == "sync"] == []


def test_bucketed_launches_its_first_bucket_before_half_the_gradient_bytes(bucketed):
    """BucketedDDP: every bucket launched during backward, the first before 50% of the gradient
    bytes; no launch after backward, no wait inside it, no device sync."""
    a, s = bucketed
    assert len(s.collectives) > 2 and all(e.phase == "backward" for e in s.collectives)
    assert s.share(s.collectives[0]) < 0.5
    assert a.launches_after_backward == 0 and a.bytes_after_backward == 0
    assert a.waits_in_backward == 0 and a.device_syncs == 0
    assert [e.where for e in s.events if e.what == "wait"] == ["BucketedDDP._wait"] * len(
        s.collectives
    )
    assert 0 < a.exposed_comm_pct_balanced < 100
    assert a.host_calls > a.world_calls > 0  # the World wraps every collective and wait


def _gate(base, head, quantity):
    return exact_verdict([getattr(base, quantity)] * 2, [getattr(head, quantity)] * 2)


def test_gate_fails_a_bucketed_ddp_that_launches_after_backward(world, bucketed):
    """LateBucketedDDP (hooks launch nothing): launches and bytes after backward and the exposed
    communication rise, and the gate's detail says which all-reduce moved."""
    base, sb = bucketed
    late, sl = _schedule(world, "paracheck.bench._planted:LateBucketedDDP")
    for q in ("launches_after_backward", "bytes_after_backward", "exposed_comm_pct_balanced"):
        assert q in EXACT_QUANTITIES and _gate(base, late, q) == "REGRESSION", q
    lines = schedule_changes("bucketed", sb, sl)
    assert lines[0].startswith("bucketed: all-reduce #1 launched after backward (was at ")
    assert len([line for line in lines if "launched after backward" in line]) == len(sb.collectives)


def test_gate_fails_a_bucketed_ddp_that_syncs_per_bucket(world, bucketed):
    """SyncingBucketedDDP (reads one value per bucket): one device sync more per bucket, named
    where it happens; the launches do not move."""
    base, sb = bucketed
    syncing, ss = _schedule(world, "paracheck.bench._planted:SyncingBucketedDDP")
    assert syncing.device_syncs == base.device_syncs + len(sb.collectives)
    assert _gate(base, syncing, "device_syncs") == "REGRESSION"
    assert _gate(base, syncing, "launches_after_backward") == "ok"
    assert schedule_changes("bucketed", sb, ss)[0] == (
        f"bucketed: {len(sb.collectives)} syncs added in SyncingBucketedDDP._wait (backward)"
    )
