"""Constructing a DDP target as its interface is read (Note [Readings of a DDP interface] in
``paracheck.check.interfaces``), once, for both sides that build one: the rank programs
(``paracheck.check.ranks._drive``) and the benchmarks (``paracheck.bench.variants``). A benchmark
then measures the wrapper a check judged, built with the same arguments. The process group, rank,
world size and device are given, never read from global state (importing this touches nothing
distributed)."""

from __future__ import annotations

from paracheck.check.interfaces import Construction, ddp_construction
from paracheck.check.loading import TargetError

__all__ = ["MB", "construct_ddp", "ddp_reading"]

MB = 2**20  # bytes in one MB of a bucket size (torch DDP's bucket_cap_mb)

# The reading of each constructor, by import path: read once per process.
_READINGS: dict[str, Construction | None] = {}


def ddp_reading(path: str, cls) -> Construction | None:
    """How ``cls`` (imported from ``path``) is called, or None where its signature cannot be
    read (then it is called positionally: ``cls(module[, bucket_mb])``)."""
    if path not in _READINGS:
        try:
            _READINGS[path] = ddp_construction(cls)
        except TargetError:
            _READINGS[path] = None
    return _READINGS[path]


def construct_ddp(
    cls,
    module,
    *,
    path: str,
    bucket_mb: float | None,
    takes_bucket: bool,
    rank: int,
    world_size: int,
    process_group,
    device,
):
    """``cls`` built around ``module``: each argument its reading names gets its value
    (``bucket_mb``: None for one unbounded bucket, passed as given; the bytes to an argument
    whose name says bytes); an unreadable signature gets ``module`` and, with ``takes_bucket``,
    ``bucket_mb``, by position."""
    reading = ddp_reading(path, cls)
    if reading is None:
        return cls(module, bucket_mb) if takes_bucket else cls(module)
    values = {
        "module": module,
        "bucket_mb": bucket_mb,
        "bucket_bytes": None if bucket_mb is None else int(bucket_mb * MB),
        "rank": rank,
        "world_size": world_size,
        "process_group": process_group,
        "device": device,
    }
    return cls(
        *(values[w] for w in reading.positional),
        **{name: values[w] for name, w in reading.keywords},
    )
