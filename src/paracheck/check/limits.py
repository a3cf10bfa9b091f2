"""How many gloo ranks this machine can run, and the refusal of world sizes above it.

Note [Gloo rank limit]
  Every gloo rank is a process of its own that imports torch: on the 2-core development machine
  one costs about 220 MiB of memory of its own (USS; 363 MiB RSS, the rest shared) and seconds
  of CPU to start, and the ranks of a case take turns on the cores. Measured there under load
  (docs/measurements.md, "What a gloo rank costs"): 8 ranks started in 55 s, 16 did not start
  within the World's 120 s start timeout; a small case at 8 ranks took at most 1.6 s, well
  inside the 5 s a hang timeout is at least. So a world size is refused, before any rank
  starts, above the smaller of

  * ``RANKS_PER_CORE`` (4) ranks per core: 8 on 2 cores, which keeps the default world sizes
    1,2,3,4 and the test suite's 1,2,3,4,6 and starts in under half the start timeout;
  * the ranks whose ``RANK_MIB`` (256 MiB, the measured 220 rounded up for a case's tensors)
    fit in half of the machine's memory (the driver, the oracle and everything else keep the
    other half).

  Cores are those this process may run on (its affinity, a cgroup CPU quota); memory is the
  machine's total or its cgroup's limit, whichever is smaller, not what is free at the moment,
  so the limit of a machine does not change from one run to the next. ``--allow-large-world``
  (``--paracheck-allow-large-world``) lifts it. NCCL worlds are bounded by the GPUs present
  instead.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

__all__ = [
    "RANKS_PER_CORE",
    "RANK_MIB",
    "RankLimit",
    "gloo_rank_limit",
    "rank_limit",
    "world_size_error",
    "world_size_rule",
]

RANKS_PER_CORE = 4
RANK_MIB = 256


@dataclass(frozen=True)
class RankLimit:
    """The most gloo ranks a machine of ``cores`` cores and ``memory_mib`` MiB runs (Note [Gloo
    rank limit]): ``ranks``, the smaller of ``by_cores`` and ``by_memory`` (None: memory unknown,
    not a bound)."""

    cores: int
    memory_mib: int | None
    by_cores: int
    by_memory: int | None

    @property
    def ranks(self) -> int:
        return self.by_cores if self.by_memory is None else min(self.by_cores, self.by_memory)

    def reason(self) -> str:
        """Why the limit is what it is, in one clause."""
        cores = (
            f"{self.cores} core{'s' if self.cores != 1 else ''} x {RANKS_PER_CORE} ranks per core "
            f"= {self.by_cores}"
        )
        if self.by_memory is None:
            return cores
        memory = (
            f"half of {self.memory_mib / 1024:.1f} GiB of memory at {RANK_MIB} MiB per rank = "
            f"{self.by_memory}"
        )
        return f"{cores}; {memory}"


def rank_limit(cores: int, memory_mib: int | None) -> RankLimit:
    """The limit of a machine of ``cores`` cores and ``memory_mib`` MiB (None: unknown). Pure."""
    if cores < 1:
        raise ValueError(f"cores={cores!r} must be >= 1")
    by_memory = None if memory_mib is None else max(1, memory_mib // 2 // RANK_MIB)
    return RankLimit(cores, memory_mib, RANKS_PER_CORE * cores, by_memory)


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _cores() -> int:
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    quota = _read("/sys/fs/cgroup/cpu.max")  # cgroup v2: "max 100000" or "200000 100000"
    if quota is not None and not quota.startswith("max"):
        try:
            allowed, period = (int(x) for x in quota.split()[:2])
            cores = min(cores, max(1, math.ceil(allowed / period)))
        except ValueError:
            pass
    return max(1, cores)


def _memory_mib() -> int | None:
    total = None
    meminfo = _read("/proc/meminfo") or ""
    for line in meminfo.splitlines():
        if line.startswith("MemTotal:"):
            total = int(line.split()[1]) // 1024
    if total is None:
        try:
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
        except (AttributeError, ValueError, OSError):
            return None
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        limit = _read(path)
        if limit is not None and limit.isdigit():
            total = min(total, int(limit) // 2**20)
    return total


def gloo_rank_limit() -> RankLimit:
    """This machine's limit (Note [Gloo rank limit])."""
    return rank_limit(_cores(), _memory_mib())


def world_size_rule(sizes, override: str | None) -> str | None:
    """Why gloo world sizes ``sizes`` are refused on this machine, naming the flag ``override``
    that lifts the limit (None: nothing does); None when they fit (Note [Gloo rank limit])."""
    limit = gloo_rank_limit()
    if max(sizes) <= limit.ranks:
        return None
    return (
        f"world size {max(sizes)} is more gloo ranks than this machine runs "
        f"(at most {limit.ranks}: {limit.reason()}); every rank is a process of its own that "
        f"takes about {RANK_MIB} MiB and seconds of CPU to start, and a world that large "
        f"outlasts the start timeout or makes correct cases time out as hangs"
        + (f". Pass {override} to run it anyway" if override else "")
    )


def world_size_error(option: str, value: str, sizes, override: str | None) -> str | None:
    """The usage error for gloo world sizes ``sizes`` above this machine's limit, naming
    ``option``, its ``value`` and the flag ``override`` that lifts it (None: nothing does); None
    when they fit."""
    rule = world_size_rule(sizes, override)
    return None if rule is None else f"{option}={value}: {rule}"
