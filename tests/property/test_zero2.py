"""The zero2 kind: a ZeRO-2 wrapper holds its gradients as shards once they are synchronised
(Note [Gradients kept as shards]): the reference Zero2 passes, Zero1 (whose full buffers live as
long as it does) fails as a ZeRO-2, and the bound on held gradients admits every correct
placement and refuses replicated gradients."""

from dataclasses import replace
from types import SimpleNamespace

from paracheck.cases import Case
from paracheck.check.properties._case import case_params
from paracheck.check.properties.placement import check_grads_sharded, held_gradient_bound
from paracheck.check.property import check_target
from paracheck.check.ranks.record import RankRecord, RankStep
from paracheck.check.targets import Target, resolve_target
from paracheck.workloads import MLPSpec

SIZES = (1, 2, 3, 4)


def test_zero2_passes_grads_sharded_alone(world):
    """The reference ZeRO-2 under its kind's new property alone (the defaults run in
    test_sharding.py)."""
    target = replace(resolve_target("zero2"), properties=frozenset({"grads-sharded"}))
    assert target.kind == "zero2"
    report = check_target(target, world, world_sizes=SIZES, max_examples=30, seed=0)
    assert report.passed, report.failure.describe()


def test_zero1_is_not_a_zero2(world):
    """Zero1 keeps every bucket's full gradient buffer: correct as ZeRO-1 (kind zero), refused as
    ZeRO-2 by the reduced-buffer rule, on the first case with two ranks."""
    target = Target("zero1-as-zero2", "paracheck.zero:Zero1", "zero2")
    report = check_target(target, world, world_sizes=(2,), max_examples=5, seed=0)
    assert not report.passed
    d = report.failure.divergence
    assert d is not None and d.what == "grads-sharded", report.failure.describe()
    assert "reduce-scatters read whole" in d.detail, d.detail


def _records(held: list[int], steps: int) -> list[RankRecord]:
    return [
        RankRecord(
            steps=tuple(RankStep([], scattered=(0, 0), held_grad_elements=h) for _ in range(steps))
        )
        for h in held
    ]


def test_bound_admits_every_correct_placement_and_refuses_replicas():
    """On one case's parameters at W = 3: per-parameter ownership (each gradient whole on its
    owner), flat shards with a bucket padded to a multiple of W, and dimension-0 shards with
    padding rows all pass; one rank keeping every gradient whole besides its shards fails."""
    case = Case(
        model=MLPSpec(in_features=6, widths=(5, 7, 2)), world_size=3, batch_sizes=(2, 2, 2), steps=1
    )
    params = case_params(case)
    trainable = [i for i, p in enumerate(params) if p.requires_grad]
    traj = SimpleNamespace(steps=[None])  # the property reads only how many steps there were
    W, P = 3, sum(params[i].numel() for i in trainable)
    bound = held_gradient_bound(params, trainable, W)
    owner = [0] * W
    for i in trainable:  # owners by greedy size
        owner[min(range(W), key=owner.__getitem__)] += params[i].numel()
    flat = [-(-P // W)] * W  # one bucket, padded
    rows = [0] * W  # dimension 0, ceil(rows / W) rows per rank
    for i in trainable:
        p = params[i]
        row = p.numel() // p.shape[0]
        for r in range(W):
            rows[r] += -(-p.shape[0] // W) * row
    for placement in (owner, flat, rows):
        assert sum(placement) <= bound, (placement, bound)
        assert check_grads_sharded(case, traj, _records(placement, 1), "zero2") is None
    replicated = [flat[0] + P] + flat[1:]
    d = check_grads_sharded(case, traj, _records(replicated, 1), "zero2")
    assert d is not None and d.what == "grads-sharded" and d.rank == 0, d


def test_parameter_bound_admits_shards_and_replicated_vectors_and_refuses_whole_matrices():
    """At W = 4 on one case's parameters: matrices sharded flat (padded) or along dimension 0,
    vectors and a frozen matrix replicated, pass; every trainable matrix kept whole on every
    rank (a shard that is a view of the whole parameter) fails."""
    from paracheck.check.properties.placement import (
        check_params_sharded,
        held_parameter_bound,
    )

    case = Case(
        model=MLPSpec(in_features=6, widths=(5, 7, 2), frozen=("layers.1.weight",)),
        world_size=4,
        batch_sizes=(1, 1, 1, 1),
        steps=1,
    )
    params = case_params(case)
    trainable = {i for i, p in enumerate(params) if p.requires_grad}
    W = 4
    bound = held_parameter_bound(params, trainable, W)

    def sharded(i):
        return i in trainable and params[i].dim() >= 2

    flat = sum(
        -(-params[i].numel() // W) if sharded(i) else params[i].numel() for i in range(len(params))
    )
    dim0 = sum(
        -(-params[i].shape[0] // W) * (params[i].numel() // params[i].shape[0])
        if sharded(i)
        else params[i].numel()
        for i in range(len(params))
    )
    whole = sum(p.numel() for p in params)
    traj = SimpleNamespace(steps=[None])

    def records(per_rank):
        return [RankRecord(steps=(RankStep([], held_param_elements=per_rank),)) for _ in range(W)]

    for per_rank in (flat, dim0):
        assert W * per_rank <= bound
        assert check_params_sharded(case, traj, records(per_rank), "fsdp") is None
    d = check_params_sharded(case, traj, records(whole), "fsdp")
    assert d is not None and d.what == "params-sharded", d
