"""Exact optimizer-state bytes per rank and payload bytes per collective, pinned on literal cases.

Model for all: MLP 3 -> 5 -> 2 with biases, float64: parameters w0 (15 elements, 120 bytes),
b0 (5, 40), w1 (10, 80), b1 (2, 16). Adam keeps 2 values per element plus a 4-byte float32 ``step``
per tensor. The expected numbers below are worked out by hand in the comments, then compared with
what the ranks hold and send and with ``paracheck.accounting``.
"""

import warnings

import torch
import torch.distributed as dist

from paracheck.accounting import (
    StepTraffic,
    bus_bytes,
    flat_state_bytes,
    owner_broadcast_traffic,
    record_collectives,
    sharded_state_bytes,
    state_model,
    zero1_traffic,
)
from paracheck.cases import Case, GroupSpec, OptimizerSpec
from paracheck.check.ranks import RankJob
from paracheck.check.run import run_case
from paracheck.check.targets import resolve_target
from paracheck.workloads import MLPSpec
from paracheck.zero import flat_layout, partition_by_size

MODEL = MLPSpec(in_features=3, widths=(5, 2), bias=True)
NUMELS = [15, 5, 10, 2]
ADAM = OptimizerSpec("adam", (GroupSpec(params=(), lr=1e-2),))


def _run(world, name, case):
    target = resolve_target(name)
    assert run_case(world, target, case).ok
    return world.run(
        target.rank_fn,
        RankJob(case=case, path=target.path, kind=target.kind),
        world_size=case.world_size,
    )


def test_sharded_state_bytes_and_broadcasts_are_exact(world):
    """Two ranks: largest first, w0 (120 B) -> rank 0, w1 (80) -> 1, b0 (40) -> 1 (80 < 120), b1 (16) -> 0
    (tie 120/120, lowest rank). Adam state: rank 0 = (2*120+4) + (2*16+4) = 280 B, rank 1 = (2*80+4) +
    (2*40+4) = 248 B. Each step broadcasts the four parameters: 4 calls, 256 B."""
    case = Case(model=MODEL, world_size=2, batch_sizes=(2, 1), steps=2, optimizer=ADAM)
    ranks = _run(world, "sharded", case)
    for rec, state_bytes in zip(ranks, (280, 248)):
        for step in rec.steps:
            assert step.owners == (0, 1, 1, 0)
            assert step.state_bytes == state_bytes
            assert StepTraffic(step.traffic).as_dict() == {"broadcast": (4, 256)}
    models = [state_model("adam")] * 4
    part = partition_by_size([n * 8 for n in NUMELS], 2)
    assert part.owners == (0, 1, 1, 0)
    assert [
        sharded_state_bytes(
            part.owners, r, numels=NUMELS, element_sizes=[8] * 4, models=models, stateful=range(4)
        )
        for r in (0, 1)
    ] == [280, 248]
    assert owner_broadcast_traffic([120, 40, 80, 16], 2).as_dict() == {"broadcast": (4, 256)}


def test_sharded_frozen_parameter_is_neither_weighed_nor_sent(world):
    """w0 frozen: weights (0, 40, 80, 16): w1 -> 0, b0 -> 1, b1 -> 1 (40 < 80), w0 -> 1 (56 < 80).
    SGD momentum keeps one value per element: rank 0 = 80 B, rank 1 = 40 + 16 = 56 B; each step
    broadcasts the three trainable parameters, 136 B."""
    case = Case(
        model=MLPSpec(in_features=3, widths=(5, 2), bias=True, frozen=("layers.0.weight",)),
        world_size=2,
        batch_sizes=(1, 1),
        steps=2,
        optimizer=OptimizerSpec("sgd", (GroupSpec(params=(), lr=0.1, momentum=0.9),)),
    )
    ranks = _run(world, "sharded", case)
    for rec, state_bytes in zip(ranks, (80, 56)):
        for step in rec.steps:
            assert step.owners == (1, 1, 0, 1)
            assert step.state_bytes == state_bytes
            assert StepTraffic(step.traffic).as_dict() == {"broadcast": (3, 136)}


def test_zero1_state_bytes_and_collectives_are_exact_one_bucket(world):
    """Three ranks, one bucket of 32 elements padded to 33 (chunks of 11), packed b1, w1, b0, w0:
    rank 0 owns b1 + w1[0:9] (2 pieces), rank 1 w1[9:10] + b0 + w0[0:5] (3 pieces), rank 2 w0[5:15]
    (1 piece). Adam: 2*8*11 + 2*4 = 184, 2*8*11 + 3*4 = 188, 2*8*10 + 4 = 164 B. Each step: one
    reduce-scatter of 33*8 = 264 B, one all-reduce of 4 presence flags (32 B), one all-gather of 264 B."""
    case = Case(model=MODEL, world_size=3, batch_sizes=(1, 2, 1), steps=2, optimizer=ADAM)
    ranks = _run(world, "zero1", case)
    expected_pieces = [((3, 0, 2), (2, 0, 9)), ((2, 9, 1), (1, 0, 5), (0, 0, 5)), ((0, 5, 10),)]
    for rec, state_bytes, pieces in zip(ranks, (184, 188, 164), expected_pieces):
        assert rec.pieces == pieces and rec.bucket_numels == (32,)
        for step in rec.steps:
            assert step.state_bytes == state_bytes
            assert StepTraffic(step.traffic).as_dict() == {
                "reduce_scatter": (1, 264),
                "all_reduce": (1, 32),
                "all_gather": (1, 264),
            }
    layout = flat_layout(NUMELS, 3, bucket_numel=25 * 2**20 // 8)
    models = [state_model("adam")] * 4
    assert [
        flat_state_bytes(layout.pieces(r), element_size=8, models=models, stateful=range(4))
        for r in range(3)
    ] == [184, 188, 164]


def test_zero1_collectives_are_exact_with_small_buckets_and_accumulation(world):
    """A 100-byte cap (12 float64): buckets [b1, w1] (12, padded 12), [b0] (5 -> 6), [w0] (15); two
    synchronisations per step (accumulation 2 without no_sync): 6 reduce-scatters of 33*8 B in total,
    2 flag all-reduces of 32 B, 3 all-gathers of 264 B. Adam over 4 + 3 + 3 pieces:
    rank 0 owns 11 elements in 4 pieces (192 B), rank 1 11 in 3 (188 B), rank 2 10 in 3 (172 B)."""
    case = Case(
        model=MODEL,
        world_size=3,
        batch_sizes=(1, 1, 1),
        steps=1,
        accumulation=2,
        bucket_size_mb=100 / 2**20,
        optimizer=ADAM,
    )
    ranks = _run(world, "zero1", case)
    for rec, state_bytes in zip(ranks, (192, 188, 172)):
        assert rec.bucket_numels == (12, 5, 15)
        assert rec.steps[0].state_bytes == state_bytes
        assert StepTraffic(rec.steps[0].traffic).as_dict() == {
            "reduce_scatter": (6, 528),
            "all_reduce": (2, 64),
            "all_gather": (3, 264),
        }
    layout = flat_layout(NUMELS, 3, bucket_numel=12)
    assert zero1_traffic(layout, 8, syncs=2).as_dict() == {
        "reduce_scatter": (6, 528),
        "all_reduce": (2, 64),
        "all_gather": (3, 264),
    }


def test_world_size_one_communicates_nothing(world):
    """One rank: no collective in the step, the whole state on rank 0 (Adam: 2*8*32 + 4*4 = 528 B)."""
    case = Case(model=MODEL, world_size=1, batch_sizes=(2,), steps=1, optimizer=ADAM)
    for name, state_bytes in (("sharded", 528), ("zero1", 2 * 8 * 32 + 4 * 4)):
        (rec,) = _run(world, name, case)
        assert rec.steps[0].traffic == () and rec.steps[0].state_bytes == state_bytes


def test_bus_model_owner_broadcast_costs_more_than_zero1():
    """Note [Owner broadcast versus ZeRO-1]: per rank, all-reduce + broadcast = (3W-2)/W Psi bus
    bytes against reduce-scatter + all-gather = 2(W-1)/W Psi (Psi = 1 GiB, W = 4: 2.5 GiB against
    1.5 GiB, 5/3; W = 2: 2x); received per rank, (W-1)/W Psi of broadcasts, 1.5x at every W."""
    psi = 2**30
    for w, ratio in ((2, 2.0), (4, 5 / 3), (8, 11 / 7)):
        owner = bus_bytes("all_reduce", psi, w) + bus_bytes("broadcast", psi, w)
        zero1 = bus_bytes("reduce_scatter", psi, w) + bus_bytes("all_gather", psi, w)
        assert owner == (3 * w - 2) / w * psi and zero1 == 2 * (w - 1) / w * psi
        assert owner / zero1 >= 1.5 and abs(owner / zero1 - ratio) < 1e-12
        received = bus_bytes("all_reduce", psi, w) + (w - 1) / w * psi
        assert received / zero1 == 1.5
    assert bus_bytes("all_reduce", psi, 4) + bus_bytes("broadcast", psi, 4) == 2.5 * 2**30


def overlap_job(_):
    """Rank job: Zero1 with a 5-element bucket cap over three Linear(4, 4): every parameter alone in
    its bucket (6 buckets); count the reduce-scatters issued before backward() returns."""
    from paracheck.zero import Zero1

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(3)]).double()
    zero = Zero1(model, torch.optim.SGD, bucket_size_mb=40 / 2**20, lr=0.1)
    with record_collectives() as rec:
        zero(torch.ones(2, 4, dtype=torch.float64)).sum().backward()
        during = rec.traffic().as_dict().get("reduce_scatter", (0, 0))[0]
        zero.finish_gradient_synchronization()
    return during, len(zero.layout.buckets), rec.traffic().as_dict()["reduce_scatter"][0]


def test_zero1_reduce_scatters_start_during_backward(world):
    """Every bucket's reduce-scatter is issued from the backward hooks, before backward() returns."""
    for w in (2, 3):
        for during, buckets, total in world.run(f"{__name__}:overlap_job", None, world_size=w):
            assert buckets == 6 and during == total == 6


def collectives_job(_):
    """Rank job: one call of each public collective (and a deprecated alias) inside the recorder."""
    w = dist.get_world_size()
    x = torch.ones(6, dtype=torch.float64)
    warnings.simplefilter(
        "ignore", FutureWarning
    )  # reduce_scatter_tensor is deprecated in torch >= 2.13
    with record_collectives() as rec:
        dist.all_reduce(x)
        dist.broadcast(x, src=0)
        dist.reduce_scatter_tensor(
            torch.empty(6 // w), torch.ones(6)
        )  # forwards to its replacement
        dist.all_gather_into_tensor(torch.empty(6), torch.ones(6 // w))
    return rec.traffic().as_dict()


def test_recorder_counts_each_call_once_with_its_payload(world):
    """The recorder counts calls and payload bytes per collective, a forwarding alias once."""
    for w in (2, 3):
        for got in world.run(f"{__name__}:collectives_job", None, world_size=w):
            assert got == {
                "all_reduce": (1, 48),
                "broadcast": (1, 48),
                "reduce_scatter": (1, 24),
                "all_gather": (1, 24),
            }


# Bound when this module is imported, long before any recording starts.
from torch.distributed import all_reduce as _all_reduce_bound_early  # noqa: E402


def unpatched_calls_job(_):
    """Rank job: all-reduces the namespace never sees at call time (a function reference bound at
    import, async_op=True work, a view of a larger tensor, two calls coalesced into one message),
    a barrier, and torch DDP's reducer (C++) reducing one gradient bucket."""
    from torch.distributed.distributed_c10d import _coalescing_manager

    x = torch.ones(6, dtype=torch.float64)
    with record_collectives() as rec:
        _all_reduce_bound_early(x)
        dist.all_reduce(x, async_op=True).wait()
        dist.all_reduce(x[1:4])
        with _coalescing_manager(async_ops=True) as cm:
            dist.all_reduce(x[:2])
            dist.all_reduce(x[2:])
        cm.wait()
        dist.barrier()
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(3, 2).double())
    for _ in range(2):  # the buckets are rebuilt (two broadcasts) in the second step
        model(torch.ones(1, 3, dtype=torch.float64)).sum().backward()
    with record_collectives() as rec_ddp:
        model(torch.ones(1, 3, dtype=torch.float64)).sum().backward()
    return rec.calls, rec_ddp.calls


def test_recorder_sees_calls_that_bypass_the_namespace(world):
    """One dispatch-mode recorder sees an all-reduce through a function bound before recording,
    async and view calls with their own sizes, a coalesced pair as the one message it is (48 B),
    no barrier (no data), and torch DDP's C++ reducer (8 x (6 + 2) = 64 B)."""
    for w in (1, 2):
        for calls, ddp_calls in world.run(f"{__name__}:unpatched_calls_job", None, world_size=w):
            assert calls == [
                ("all_reduce", 48),
                ("all_reduce", 48),
                ("all_reduce", 24),
                ("all_reduce", 48),
            ]
            assert ddp_calls == [("all_reduce", 64)]


def functional_job(_):
    """Rank job: functional collectives (the ones torch.compile and DTensor issue), which are given
    a shard and a group size, not the full tensor."""
    import torch.distributed._functional_collectives as fc

    w = dist.get_world_size()
    with record_collectives() as rec:
        fc.all_gather_tensor(torch.ones(2, dtype=torch.float64), 0, dist.group.WORLD)
        fc.reduce_scatter_tensor(torch.ones(2 * w, dtype=torch.float64), "sum", 0, dist.group.WORLD)
        fc.all_reduce(torch.ones(3, dtype=torch.float64), "sum", dist.group.WORLD)
    return rec.calls


def test_recorder_sizes_functional_collectives_by_the_full_tensor(world):
    """A functional all-gather of 2 float64 per rank is a message of 16 W bytes, like its c10d
    form; a reduce-scatter of 2 W elements 16 W bytes; an all-reduce its 24-byte tensor."""
    for w in (1, 2):
        for calls in world.run(f"{__name__}:functional_job", None, world_size=w):
            assert calls == [("all_gather", 16 * w), ("reduce_scatter", 16 * w), ("all_reduce", 24)]


def group_filter_job(_):
    """Rank job: one all-reduce on a subgroup of every rank and one on the default group, recorded
    for the subgroup only and for every group."""
    sub = dist.new_group(list(range(dist.get_world_size())))
    x = torch.ones(3, dtype=torch.float64)
    with record_collectives() as every, record_collectives(group=sub) as only_sub:
        dist.all_reduce(x, group=sub)
        dist.all_reduce(x[:1])
    return every.calls, only_sub.calls


def test_recorder_restricted_to_a_group_sees_only_its_calls(world):
    """record_collectives(group=g) keeps the calls made on g (24 B), not those on the default group."""
    for every, only_sub in world.run(f"{__name__}:group_filter_job", None, world_size=2):
        assert every == [("all_reduce", 24), ("all_reduce", 8)]
        assert only_sub == [("all_reduce", 24)]


def gradient_memory_job(_):
    """Rank job: Zero1 over the MLP with a 100-byte cap (buckets padded to 12, 6, 15 at W = 3):
    the distinct gradient storage it holds, and the bytes kept aside during a second
    synchronisation in one step (measured just before it completes)."""
    from paracheck.accounting import state_model, training_memory
    from paracheck.workloads import MLP
    from paracheck.zero import Zero1

    torch.manual_seed(0)
    model = MLP(MODEL).double()
    zero = Zero1(model, torch.optim.Adam, bucket_size_mb=100 / 2**20, lr=1e-2)
    storages = {}
    for t in zero._grad_flat + zero._grad_shard:
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    x = torch.ones(2, 3, dtype=torch.float64)
    zero(x).sum().backward()
    zero.finish_gradient_synchronization()
    zero(x).sum().backward()
    saved = sum(t.numel() * t.element_size() for t in zero._saved if t is not None)
    zero.finish_gradient_synchronization()
    w, r = dist.get_world_size(), dist.get_rank()
    kw = {"rank": r, "model": state_model("adam"), "bucket_numel": 12}
    return (
        sum(storages.values()),
        saved,
        training_memory("zero1", NUMELS, 8, w, **kw).grads,
        training_memory("zero1", NUMELS, 8, w, syncs=2, **kw).grads,
    )


def test_zero1_gradient_memory_is_the_padded_buckets_exactly(world):
    """Three ranks, padded buckets 12 + 6 + 15 = 33 float64: the reduced chunks are views, so the
    gradient storage is 264 B, not 264 + 88; a second synchronisation keeps 11 elements (88 B) aside."""
    for held, saved, one_sync, two_syncs in world.run(
        f"{__name__}:gradient_memory_job", None, world_size=3
    ):
        assert (held, saved) == (264, 88)
        assert (one_sync, two_syncs) == (264, 264 + 88)
