"""What one collective costs on the wire: the one cost model of the analytic models
(``paracheck.accounting.traffic``), the recorder's bus bytes (``paracheck.accounting.record``)
and the benchmarks.

Note [Bus bytes]
    The bus bytes of a collective of message size S (its payload: the buffer of an all-reduce or
    broadcast, the full gathered output of an all-gather, the full input of a reduce-scatter) on W
    ranks are ``bus_factor(kind, W) * S``: the bytes the busiest rank sends with bandwidth-optimal
    ring algorithms, nccl-tests' bus-bandwidth convention:

    * all-reduce 2(W-1)/W (a reduce-scatter then an all-gather);
    * all-gather, reduce-scatter, all-to-all, gather, scatter (W-1)/W;
    * broadcast, reduce, send, recv 1: in a pipelined chain every rank but the last forwards the
      whole message, so the busiest link carries S;
    * barrier 0, and every kind 0 at W = 1 (nothing leaves the rank).

    Why this convention: it is the one whose quotient by a measured bus bandwidth is a time. A
    bandwidth-bound collective takes (bytes on its busiest link) / (link bandwidth), and nccl-tests
    (whose "busbw" GPU people compare with the hardware's link bandwidth, and which
    ``paracheck.bench.comm`` reproduces for all-reduce) defines busbw = bus bytes / time with exactly
    these factors. So bus bytes / busbw predicts a step's communication time for every kind alike.

    The other common count for a broadcast, the bytes *received* per rank averaged over ranks
    ((W-1)/W S: each of the W-1 non-roots receives S once), measures the volume moved, not the
    time: a chain broadcast leaves the link into its root idle, so it takes as long as S on every
    link. Note [Owner broadcast versus ZeRO-1] in ``paracheck.accounting.traffic`` compares designs
    under both counts.
"""

from __future__ import annotations

import numbers

__all__ = ["bus_bytes", "bus_factor"]

_ALL_REDUCE = frozenset({"all_reduce"})
_SHARDED = frozenset({"all_gather", "reduce_scatter", "all_to_all", "gather", "scatter"})
_WHOLE = frozenset({"broadcast", "reduce", "send", "recv"})
_FREE = frozenset({"barrier"})
_KINDS = tuple(sorted(_ALL_REDUCE | _SHARDED | _WHOLE | _FREE))


def bus_factor(kind: str, world_size: int) -> float:
    """Bus bytes per byte of message of one ``kind`` collective on ``world_size`` ranks
    (Note [Bus bytes])."""
    if (
        isinstance(world_size, bool)
        or not isinstance(world_size, numbers.Integral)
        or world_size < 1
    ):
        raise ValueError(f"world_size={world_size!r} must be an int >= 1")
    w = int(world_size)
    if kind in _ALL_REDUCE:
        return 2 * (w - 1) / w
    if kind in _SHARDED:
        return (w - 1) / w
    if kind in _WHOLE:
        return 1.0 if w > 1 else 0.0
    if kind in _FREE:
        return 0.0
    raise ValueError(f"kind={kind!r} has no cost model; known: {', '.join(_KINDS)}")


def bus_bytes(kind: str, payload: int, world_size: int) -> float:
    """Bus bytes of one ``kind`` collective of ``payload`` bytes on ``world_size`` ranks
    (Note [Bus bytes])."""
    return bus_factor(kind, world_size) * payload
