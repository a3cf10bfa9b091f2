"""The runner's reading of the ranks' collective statuses: a collective given tensors of
different sizes (Note [Definite deadlock] in ``paracheck.world._watch``)."""

from paracheck.world._watch import (
    describe_death,
    describe_disagreement,
    kinds_differ,
    sizes_differ,
)


def status(state="running", inside="all_reduce", sized=("all_reduce", 2, 5, 4, "float32")):
    world_total = sized[2] if sized else 5
    return {
        "job": 1,
        "state": state,
        "inside": inside,
        "inside_index": sized[1] if sized else 1,
        "sized": list(sized) if sized else None,
        "total": world_total,
        "world_total": world_total,
        "counts": {"all_reduce": 2},
    }


def test_sizes_differ_only_for_the_same_collective():
    a = status()
    b = status(sized=("all_reduce", 2, 5, 5, "float32"))
    assert sizes_differ([a, b])
    assert not sizes_differ([a, status()])  # same size: a slow rank, not a mismatch
    assert sizes_differ([a, status(sized=("all_reduce", 2, 5, 4, "float64"))])  # dtype
    # Another collective (another count, another kind): the counts tell that story.
    assert not sizes_differ([a, status(sized=("all_reduce", 3, 6, 5, "float32"))])
    assert not sizes_differ([a, status(sized=("broadcast", 2, 5, 5, "float32"))])
    # A rank that left it: a mismatch, but only a death or a returned rank can say so.
    left = status(state="returned", inside=None, sized=("all_reduce", 2, 5, 5, "float32"))
    assert not sizes_differ([a, left]) and sizes_differ([a, left], inside=False)
    # No sized collective recorded (all_gather, a subgroup, no tensor): nothing is claimed.
    assert not sizes_differ([a, status(sized=None)], inside=False)
    assert not sizes_differ([a, None], inside=False)


def test_kinds_differ_only_inside_the_same_count_of_default_group_collectives():
    """Ranks inside their n-th default-group collective, a broadcast on one and an all_reduce on
    another: no correct program does that (Note [Definite deadlock])."""
    a = status()
    b = status(inside="broadcast", sized=("broadcast", 1, 5, 1, "float64"))
    assert kinds_differ([a, b])
    assert not kinds_differ([a, status()])  # the same collective: sizes_differ's to judge
    # Another count: a rank behind the other, which the counts alone do not prove stuck.
    assert not kinds_differ(
        [a, status(inside="broadcast", sized=("broadcast", 1, 6, 1, "float64"))]
    )
    # A rank outside it, or without a sized record (a subgroup, all_gather): nothing is claimed.
    assert not kinds_differ([a, status(inside=None, sized=("broadcast", 1, 5, 1, "float64"))])
    assert not kinds_differ([a, status(sized=None)]) and not kinds_differ([a, None])
    assert not kinds_differ([b])


def test_the_sentences_name_each_ranks_size():
    a, b = status(), status(state="raised", inside=None, sized=("all_reduce", 2, 5, 5, "float32"))
    assert describe_death({0: a, 1: b}, [0]) == (
        "their 2nd all_reduce got tensors of different sizes: rank 0 (died) 4 float32 elements, "
        "rank 1 (raised) 5 float32 elements"
    )
    assert describe_death({0: a, 1: status()}, [0]) == ""
    one = status(sized=("all_reduce", 2, 5, 1, "float32"))
    assert describe_disagreement({0: one, 1: status()}, [0, 1], []) == (
        "their 2nd all_reduce got tensors of different sizes: rank 0 (still in it) 1 float32 "
        "element, rank 1 (still in it) 4 float32 elements"
    )
    # Sizes that agree: the sentence of counts, each size named.
    assert describe_disagreement({0: status(), 1: status()}, [0, 1], []) == (
        "rank 0 is in its 2nd all_reduce of 4 float32 elements (5 collectives in all); "
        "rank 1 is in its 2nd all_reduce of 4 float32 elements (5 collectives in all)"
    )


def test_ranks_outside_any_collective_are_not_said_to_disagree():
    """Every rank busy in its own code (a loop that never ends, a lock): nothing to disagree on."""
    outside = {
        "job": 1,
        "state": "running",
        "inside": None,
        "inside_index": 0,
        "sized": None,
        "total": 3,
        "world_total": 3,
        "counts": {"broadcast": 3},
    }
    assert describe_disagreement({0: outside, 1: dict(outside)}, [0, 1], []) == (
        "no rank is inside a collective: rank 0 after 3, rank 1 after 3 collective(s); each is "
        "busy or blocked in its own code (its stack says where)"
    )


def test_a_broadcast_names_its_source_where_ranks_wait():
    """Two ranks in the same broadcast with the same tensor but each naming the other as the
    source wait for each other: the sentence shows each rank's source (sizes equal, so no size
    mismatch is claimed)."""
    a = status(inside="broadcast", sized=("broadcast", 6, 6, 4, "float64", 1))
    b = status(inside="broadcast", sized=("broadcast", 6, 6, 4, "float64", 0))
    a["counts"] = b["counts"] = {"broadcast": 6}
    assert not sizes_differ([a, b])
    said = describe_disagreement({0: a, 1: b}, [0, 1], [])
    assert "rank 0 is in its 6th broadcast of 4 float64 elements from rank 1" in said
    assert "rank 1 is in its 6th broadcast of 4 float64 elements from rank 0" in said


def test_the_recorded_root_of_a_broadcast_and_a_reduce():
    import torch

    from paracheck.world._collectives import _size

    t = torch.zeros(3)
    assert _size("broadcast", (t, 2), {}) == [3, "float32", 2]
    assert _size("broadcast", (t,), {"src": 1}) == [3, "float32", 1]
    assert _size("reduce", (t,), {"dst": 0}) == [3, "float32", 0]
    assert _size("all_reduce", (t,), {}) == [3, "float32"]
