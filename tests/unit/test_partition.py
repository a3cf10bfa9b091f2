"""The pure partition plans: every parameter (element) owned exactly once, within the stated bounds."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paracheck.zero.partition import ParamPartition, flat_layout, partition_by_size

sizes_lists = st.lists(st.integers(0, 1000), min_size=0, max_size=12)


@settings(max_examples=300, deadline=None)
@given(st.lists(sizes_lists, min_size=1, max_size=4), st.integers(1, 8))
def test_partition_by_size_within_balance_bound(calls, world_size):
    """Greedy largest-first, extended call by call (add_param_group), keeps W*max <= total + (W-1)*largest."""
    part = None
    for sizes in calls:
        before = part
        part = partition_by_size(sizes, world_size, previous=before)
        assert part.within_bound(), (part.loads, part.sizes)
        if before is not None:
            # Earlier parameters never move: the wrapped optimizer keeps their state.
            assert part.owners[: len(before.owners)] == before.owners
    flat = [s for sizes in calls for s in sizes]
    assert part.sizes == tuple(flat)
    assert sum(part.loads) == sum(flat)
    assert sorted(i for r in range(world_size) for i in part.shard(r)) == list(range(len(flat)))


@settings(max_examples=200, deadline=None)
@given(sizes_lists.filter(bool), st.integers(2, 8))
def test_balance_bound_holds_for_any_greedy_order(sizes, world_size):
    """Note [Balance bound]'s proof needs no sorting: greedy in arrival order also stays within it."""
    loads = [0] * world_size
    for s in sizes:
        r = min(range(world_size), key=lambda q: (loads[q], q))
        loads[r] += s
    assert world_size * max(loads) <= sum(sizes) + (world_size - 1) * max(sizes)


def test_round_robin_breaks_the_balance_bound():
    """CS336's toy model (trainable sizes 0,100,500,0,250) dealt round-robin on two ranks exceeds the bound."""
    sizes = (0, 100, 500, 0, 250)
    robin = ParamPartition(2, sizes, tuple(i % 2 for i in range(5)))
    assert robin.loads == (750, 100) and not robin.within_bound()
    assert partition_by_size(sizes, 2).within_bound()


def test_partition_by_size_is_deterministic_on_ties():
    """Ties go to the lower index and the lower rank, so every rank computes the same owners."""
    assert partition_by_size([3, 3, 3, 3], 2).owners == (0, 1, 0, 1)
    assert partition_by_size([0, 0, 5], 3).owners == (1, 1, 0)  # zero-size ties: lowest rank


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(1, 50), min_size=1, max_size=12), st.integers(1, 7), st.integers(1, 120)
)
def test_flat_layout_pieces_tile_every_parameter(numels, world_size, bucket_numel):
    """Pieces of all ranks tile each parameter exactly once, inside the owner's chunk of its bucket."""
    layout = flat_layout(numels, world_size, bucket_numel=bucket_numel)
    runs = {i: [] for i in range(len(numels))}
    for r in range(world_size):
        for pc in layout.pieces(r):
            s = layout.shard_numel(pc.bucket)
            assert r * s <= pc.offset and pc.offset + pc.length <= (r + 1) * s
            b, off = layout.where(pc.param)
            assert b == pc.bucket and pc.offset == off + pc.start
            runs[pc.param].append((pc.start, pc.length))
    for i, n in enumerate(numels):
        pos = 0
        for start, length in sorted(runs[i]):
            assert start == pos
            pos += length
        assert pos == n
    assert max(layout.loads) <= layout.bound
    assert sum(layout.loads) == sum(numels)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(1, 50), min_size=1, max_size=12), st.integers(1, 7), st.integers(1, 120)
)
def test_flat_layout_buckets_follow_backward_order_and_cap(numels, world_size, bucket_numel):
    """Buckets hold consecutive parameters in reverse order, at most the cap unless one parameter
    exceeds it alone, each padded to the smallest multiple of the world size."""
    layout = flat_layout(numels, world_size, bucket_numel=bucket_numel)
    order = [i for b in layout.buckets for i in b.params]
    assert order == list(reversed(range(len(numels))))
    for b in layout.buckets:
        assert b.numel == sum(numels[i] for i in b.params)
        assert b.numel <= bucket_numel or len(b.params) == 1
        assert b.padded % world_size == 0 and 0 <= b.padded - b.numel < world_size
        assert list(b.offsets) == [
            sum(numels[j] for j in b.params[:k]) for k in range(len(b.params))
        ]


def test_flat_layout_literal():
    """Four parameters (15, 5, 10, 2 elements) in one bucket on three ranks: the documented pieces."""
    layout = flat_layout([15, 5, 10, 2], 3, bucket_numel=10**6)
    assert [(p.param, p.start, p.length) for p in layout.pieces(0)] == [(3, 0, 2), (2, 0, 9)]
    assert [(p.param, p.start, p.length) for p in layout.pieces(1)] == [
        (2, 9, 1),
        (1, 0, 5),
        (0, 0, 5),
    ]
    assert [(p.param, p.start, p.length) for p in layout.pieces(2)] == [(0, 5, 10)]
    assert layout.padded_numel == 33 and layout.loads == (11, 11, 10)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: partition_by_size([1], 0), "world_size=0 must be an int >= 1"),
        (lambda: partition_by_size([1, -2], 2), "sizes[1]=-2 must be an int >= 0"),
        (
            lambda: partition_by_size([1], 2, previous=partition_by_size([1], 3)),
            "previous.world_size=3",
        ),
        (lambda: flat_layout([3, 0], 2, bucket_numel=4), "numels[1]=0"),
        (lambda: flat_layout([3], 2, bucket_numel=0), "bucket_numel=0 must be an int >= 1"),
        (lambda: ParamPartition(2, (1, 1), (0, 2)), "owners[1]=2 must be a rank in 0..1"),
    ],
)
def test_partition_errors_name_argument_value_and_rule(call, message):
    """Invalid plans are refused with the argument, its value and the rule."""
    with pytest.raises(
        ValueError, match=message.replace("[", r"\[").replace("]", r"\]").replace(".", r"\.")
    ):
        call()
