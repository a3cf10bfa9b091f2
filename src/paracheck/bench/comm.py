"""All-reduce time and bus bandwidth over backend x size x world size.

Bus bandwidth follows nccl-tests: ``busbw = 2 (W-1)/W x bytes / t``, the rate each link carries
with a ring all-reduce, comparable across world sizes (``algbw = bytes / t`` is not). Each timed
all-reduce starts after a barrier (and, on CUDA, a device synchronisation); its time is the
slowest rank's; the result is the median over iterations. The tensor is float32 of ``size_mb``
MB (2**20 bytes each).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

import torch

from paracheck.accounting.cost import bus_bytes
from paracheck.bench.suites import MB

__all__ = ["AllReduceResult", "all_reduce_time", "bus_bandwidth", "rank_all_reduce"]


def bus_bandwidth(nbytes: int, seconds: float, world_size: int) -> float:
    """nccl-tests' bus bandwidth of an all-reduce, bytes per second."""
    if seconds <= 0:
        raise ValueError(f"seconds={seconds!r} must be > 0")
    if world_size < 1:
        raise ValueError(f"world_size={world_size!r} must be >= 1")
    return bus_bytes("all_reduce", nbytes, world_size) / seconds


@dataclass(frozen=True)
class AllReduceResult:
    backend: str
    world_size: int
    size_mb: float
    times: tuple[float, ...]  # per iteration, slowest rank, seconds

    @property
    def nbytes(self) -> int:
        return int(self.size_mb * MB) // 4 * 4

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def busbw(self) -> float:
        """Bytes per second; see the module docstring."""
        return bus_bandwidth(self.nbytes, self.median, self.world_size)

    @property
    def algbw(self) -> float:
        return self.nbytes / self.median

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(nbytes=self.nbytes, median=self.median, busbw=self.busbw, algbw=self.algbw)
        return d


def rank_all_reduce(payload: dict) -> list[float]:
    """World job: ``payload['iters']`` timed all-reduces of ``payload['nbytes']`` bytes."""
    import torch.distributed as dist

    cuda = dist.get_backend() == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    x = torch.ones(payload["nbytes"] // 4, dtype=torch.float32, device=device)
    times = []
    for _ in range(payload["warmup"] + payload["iters"]):
        dist.barrier()
        if cuda:
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        dist.all_reduce(x)
        if cuda:
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
    del x
    if cuda:
        torch.cuda.empty_cache()
    return times[payload["warmup"] :]


def default_iters(size_mb: float, *, cuda: bool) -> int:
    """Enough iterations for a stable median without letting 100 MB on gloo take a minute."""
    if cuda:
        return 20 if size_mb < 100 else 10
    return 20 if size_mb <= 1 else 8 if size_mb <= 10 else 3


def all_reduce_time(
    world,
    size_mb: float,
    world_size: int,
    *,
    iters: int | None = None,
    warmup: int = 1,
    timeout: float | None = None,
) -> AllReduceResult:
    """Time an all-reduce of ``size_mb`` MB on ``world_size`` ranks of ``world``."""
    if not size_mb > 0:
        raise ValueError(f"size_mb={size_mb!r} must be > 0")
    if not 1 <= world_size <= world.size:
        raise ValueError(f"world_size={world_size} must be in 1..{world.size} (the World's size)")
    cuda = world.backend == "nccl"
    n = iters if iters is not None else default_iters(size_mb, cuda=cuda)
    payload = {"nbytes": int(size_mb * MB) // 4 * 4, "iters": n, "warmup": warmup}
    per_rank = world.run(
        "paracheck.bench.comm:rank_all_reduce", payload, world_size=world_size, timeout=timeout
    )
    times = tuple(max(r[i] for r in per_rank) for i in range(n))
    return AllReduceResult(world.backend, world_size, float(size_mb), times)
