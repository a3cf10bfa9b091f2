"""The ``gather-dtype`` property (fsdp): a wrapper given a compute dtype casts its shards to it
before the all-gather, not after. Exact: read from the collectives each rank issued
(``Window.typed``), not from rounding.

Note [Gathering in the compute dtype]
    ``FSDP(module, compute_dtype=torch.bfloat16)`` computes with bfloat16 copies of float32
    shards (Note [Compute dtype of an FSDP] in ``paracheck.cases``). Cast before the gather, each
    all-gather moves half the bytes; gathered in float32 and cast after, the values are the same
    (rounding commutes with concatenation) and the traffic and the peak memory of the gathered
    layer double: "cast after communication", a bug no comparison of values can see. So, in
    every case with a compute dtype at world size >= 2, for every synchronisation window on every
    rank: no floating-point all-gather is in another dtype than the compute dtype. Integer and
    byte gathers (sizes, ``all_gather_object``) carry metadata and are not judged; neither are
    the reads of whole parameters the check itself asks for after the step (they are outside
    the windows, and are of the float32 masters). Cases without a compute dtype say nothing.
"""

from __future__ import annotations

from paracheck.cases import Case
from paracheck.check.properties._divergence import Divergence
from paracheck.check.properties.reduce_dtype import FLOATING
from paracheck.check.ranks.record import RankRecord

__all__ = ["NAME", "check_gather_dtype", "window_gathers_other"]

NAME = "gather-dtype"


def window_gathers_other(typed, compute: str) -> dict[str, int]:
    """The bytes a window's typed calls (name, dtype, bytes) all-gather in each floating-point
    dtype other than ``compute``."""
    other: dict[str, int] = {}
    for name, dtype, nbytes in typed:
        if name == "all_gather" and dtype in FLOATING and dtype != compute:
            other[dtype] = other.get(dtype, 0) + nbytes
    return other


def check_gather_dtype(case: Case, traj, ranks: list[RankRecord], kind: str) -> Divergence | None:
    """The first window on any rank that all-gathers floating-point data in another dtype than
    the case's compute dtype (Note [Gathering in the compute dtype]), or None."""
    if not case.masters_from_float32 or case.world_size < 2:
        return None
    compute = case.dtype
    for r, rec in enumerate(ranks):
        for k, step in enumerate(rec.steps):
            for window in step.windows:
                other = window_gathers_other(window.typed, compute)
                if other:
                    mine = sum(b for n, d, b in window.typed if n == "all_gather" and d == compute)
                    return Divergence(
                        k,
                        NAME,
                        r,
                        None,
                        None,
                        float(sum(other.values())),
                        0.0,
                        f"{sum(other.values())} bytes all-gathered in {', '.join(sorted(other))} "
                        f"and {mine} in the compute dtype {compute}: cast each shard to "
                        f"{compute} before the all-gather, not after",
                    )
    return None
