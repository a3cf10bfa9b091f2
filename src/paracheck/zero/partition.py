"""Pure partitioning for optimizer-state sharding: who owns which parameter, or which elements.

No torch here: plans are computed from sizes alone, identically on every rank, and tested without
processes. Two plans, one per design:

* ``ParamPartition`` (``partition_by_size``): whole parameters to ranks, for the owner-broadcast
  ``ShardedOptimizer``. Greedy largest-first, see Note [Balance bound].
* ``FlatLayout`` (``flat_layout``): parameters packed into flat buckets, every bucket split into
  ``world_size`` equal chunks by element, for ``Zero1``. See Note [Flat layout].

Note [Balance bound]
    ``partition_by_size`` hands each parameter (largest first, ties by index) to the rank with the
    smallest load so far (ties to the lowest rank). Whatever order the parameters arrive in, and
    however many calls extend an earlier partition (one per ``add_param_group``), the largest
    load obeys

        max_r load_r  <=  total / W + (W - 1) / W * largest        (so also <= mean + largest)

    Proof: let p be the last parameter given to the most loaded rank R. When p arrived, R had the
    smallest load, at most the mean of the loads so far, which is <= (total - size_p) / W; R gets
    nothing after p, so load_R <= (total - size_p) / W + size_p = total / W + (W - 1) / W * size_p.
    Sorting largest-first within a call only tightens it in practice (LPT is within 4/3 of
    optimal). A partition by *count* (round-robin, a common CS336 choice) has no such bound:
    CS336's toy model on two ranks puts 750 of 850 trainable elements on rank 0 (bound 675). The
    check states the bound in integers: ``W * max_r load_r <= total + (W - 1) * largest``.

Note [Flat layout]
    Trainable parameters are packed in *reverse* registration order (the order backward produces
    their gradients) into buckets of at most ``bucket_numel`` elements; a parameter larger than the
    cap gets a bucket of its own, parameters are never split across buckets. Each bucket is padded
    with zeros to a multiple of ``W`` and rank r owns elements ``[r*s, (r+1)*s)`` of it, ``s =
    padded / W``: that is exactly the chunk ``reduce_scatter_tensor`` delivers to rank r and the
    chunk rank r contributes to ``all_gather_into_tensor``. A rank's share of one parameter is a
    ``Piece``: a contiguous run of the parameter's flattened elements. Per bucket a rank owns at
    most ceil(n_b / W) real elements, so ``max_r load_r <= sum_b ceil(n_b / W)``; chunks past the
    real elements hold only padding, so with many tiny buckets the low ranks own more (stated, not
    hidden: the bound depends on the bucket count).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Bucket", "FlatLayout", "ParamPartition", "Piece", "flat_layout", "partition_by_size"]


def _check_world_size(world_size) -> int:
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise ValueError(f"world_size={world_size!r} must be an int >= 1")
    return world_size


def _check_sizes(name: str, sizes: Sequence[int]) -> tuple[int, ...]:
    out = tuple(sizes)
    for i, s in enumerate(out):
        if not isinstance(s, int) or isinstance(s, bool) or s < 0:
            raise ValueError(f"{name}[{i}]={s!r} must be an int >= 0")
    return out


@dataclass(frozen=True)
class ParamPartition:
    """Owner rank of every parameter, with each parameter's size (its weight in the balance).

    ``sizes[i]`` is what parameter i costs its owner (``ShardedOptimizer`` uses the bytes of a
    trainable parameter and 0 for a frozen one, which never has optimizer state).
    """

    world_size: int
    sizes: tuple[int, ...]
    owners: tuple[int, ...]

    def __post_init__(self):
        _check_world_size(self.world_size)
        object.__setattr__(self, "sizes", _check_sizes("sizes", self.sizes))
        object.__setattr__(self, "owners", tuple(self.owners))
        if len(self.owners) != len(self.sizes):
            raise ValueError(
                f"owners has {len(self.owners)} entries, sizes has {len(self.sizes)}: they must match"
            )
        for i, o in enumerate(self.owners):
            if not isinstance(o, int) or not 0 <= o < self.world_size:
                raise ValueError(f"owners[{i}]={o!r} must be a rank in 0..{self.world_size - 1}")

    def shard(self, rank: int) -> tuple[int, ...]:
        """Indices of the parameters ``rank`` owns, in parameter order."""
        return tuple(i for i, o in enumerate(self.owners) if o == rank)

    @property
    def loads(self) -> tuple[int, ...]:
        out = [0] * self.world_size
        for s, o in zip(self.sizes, self.owners):
            out[o] += s
        return tuple(out)

    @property
    def total(self) -> int:
        return sum(self.sizes)

    @property
    def largest(self) -> int:
        return max(self.sizes, default=0)

    def within_bound(self) -> bool:
        """Note [Balance bound], in integers: ``W * max load <= total + (W - 1) * largest``."""
        return (
            self.world_size * max(self.loads) <= self.total + (self.world_size - 1) * self.largest
        )


def partition_by_size(
    sizes: Sequence[int], world_size: int, *, previous: ParamPartition | None = None
) -> ParamPartition:
    """Partition ``sizes`` greedily, largest first, onto the least loaded rank (Note [Balance bound]).

    With ``previous``, the new parameters extend it (their indices follow ``previous``'s) and the
    earlier owners never move, so a wrapped optimizer keeps its state across ``add_param_group``.
    Deterministic: ties go to the lower index and the lower rank.
    """
    _check_world_size(world_size)
    new = _check_sizes("sizes", sizes)
    if previous is not None and previous.world_size != world_size:
        raise ValueError(
            f"previous.world_size={previous.world_size} must equal world_size={world_size}"
        )
    loads = list(previous.loads) if previous is not None else [0] * world_size
    owners = [0] * len(new)
    for i in sorted(range(len(new)), key=lambda j: (-new[j], j)):
        rank = min(range(world_size), key=lambda r: (loads[r], r))
        owners[i] = rank
        loads[rank] += new[i]
    before = previous if previous is not None else ParamPartition(world_size, (), ())
    return ParamPartition(world_size, before.sizes + new, before.owners + tuple(owners))


@dataclass(frozen=True)
class Piece:
    """A contiguous run of one parameter's flattened elements, owned by one rank.

    Elements ``[start, start + length)`` of parameter ``param`` live at ``[offset, offset +
    length)`` of bucket ``bucket``'s flat buffer.
    """

    param: int
    start: int
    length: int
    bucket: int
    offset: int


@dataclass(frozen=True)
class Bucket:
    """Parameters packed in one flat buffer: ``params[k]`` starts at ``offsets[k]``."""

    params: tuple[int, ...]
    offsets: tuple[int, ...]
    numel: int  # real elements
    padded: int  # numel rounded up to a multiple of the world size


@dataclass(frozen=True)
class FlatLayout:
    """Buckets of a flat, element-partitioned parameter layout (Note [Flat layout])."""

    world_size: int
    numels: tuple[int, ...]
    buckets: tuple[Bucket, ...]

    def shard_numel(self, bucket: int) -> int:
        return self.buckets[bucket].padded // self.world_size

    def where(self, param: int) -> tuple[int, int]:
        """(bucket, offset) of parameter ``param``."""
        for b, bucket in enumerate(self.buckets):
            if param in bucket.params:
                return b, bucket.offsets[bucket.params.index(param)]
        raise KeyError(f"param={param!r} is not in the layout")

    def pieces(self, rank: int) -> tuple[Piece, ...]:
        """What ``rank`` owns, bucket by bucket, in buffer order."""
        if not isinstance(rank, int) or not 0 <= rank < self.world_size:
            raise ValueError(f"rank={rank!r} must be in 0..{self.world_size - 1}")
        out = []
        for b, bucket in enumerate(self.buckets):
            s = bucket.padded // self.world_size
            lo, hi = rank * s, (rank + 1) * s
            for i, off in zip(bucket.params, bucket.offsets):
                a, z = max(lo, off), min(hi, off + self.numels[i])
                if a < z:
                    out.append(Piece(param=i, start=a - off, length=z - a, bucket=b, offset=a))
        return tuple(out)

    @property
    def loads(self) -> tuple[int, ...]:
        """Real (non-padding) elements owned by each rank."""
        return tuple(sum(p.length for p in self.pieces(r)) for r in range(self.world_size))

    @property
    def bound(self) -> int:
        """Note [Flat layout]: no rank owns more than ``sum_b ceil(n_b / W)`` elements."""
        return sum(-(-b.numel // self.world_size) for b in self.buckets)

    @property
    def padded_numel(self) -> int:
        return sum(b.padded for b in self.buckets)


def flat_layout(numels: Sequence[int], world_size: int, *, bucket_numel: int) -> FlatLayout:
    """Pack parameters of ``numels`` elements into buckets of at most ``bucket_numel`` elements,
    in reverse index order, each padded to a multiple of ``world_size`` (Note [Flat layout])."""
    _check_world_size(world_size)
    sizes = _check_sizes("numels", numels)
    if not isinstance(bucket_numel, int) or isinstance(bucket_numel, bool) or bucket_numel < 1:
        raise ValueError(f"bucket_numel={bucket_numel!r} must be an int >= 1")
    for i, n in enumerate(sizes):
        if n == 0:
            raise ValueError(
                f"numels[{i}]=0: a parameter without elements has no place in a flat layout"
            )
    buckets, current, offsets, filled = [], [], [], 0

    def close():
        padded = -(-filled // world_size) * world_size
        buckets.append(Bucket(tuple(current), tuple(offsets), filled, padded))

    for i in reversed(range(len(sizes))):
        if current and filled + sizes[i] > bucket_numel:
            close()
            current, offsets, filled = [], [], 0
        current.append(i)
        offsets.append(filled)
        filled += sizes[i]
    if current:
        close()
    return FlatLayout(world_size, sizes, tuple(buckets))
