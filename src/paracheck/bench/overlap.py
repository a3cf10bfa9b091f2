"""The share of communication kernel time hidden under compute, from the CUDA profiler.

Per rank, ``steps`` training steps (after warm-up) run under ``torch.profiler`` with CUDA
activity. Communication kernels are those whose name contains ``nccl``; every other kernel is
compute. ``hidden`` is the total length of the communication kernels' intervals that lies under
the union of the compute kernels' intervals, ``share = hidden / communication``. Within a step
the optimizer's kernels start only after ``finish_gradient_synchronization()`` has waited for the
last reduction, so whatever compute hides communication is forward/backward compute. CUDA only:
gloo runs its collectives on CPU threads, with no kernel timeline to intersect.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass

__all__ = ["OverlapResult", "overlap_share", "hidden_time", "rank_overlap"]


def _union(intervals):
    merged = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return merged


def hidden_time(comm, compute) -> float:
    """Total length of the ``comm`` intervals ``(start, end)`` covered by the union of ``compute``."""
    cover = _union(compute)
    hidden = 0.0
    import bisect

    starts = [a for a, _ in cover]
    for a, b in comm:
        i = max(bisect.bisect_right(starts, a) - 1, 0)
        while i < len(cover) and cover[i][0] < b:
            lo, hi = max(a, cover[i][0]), min(b, cover[i][1])
            if hi > lo:
                hidden += hi - lo
            i += 1
    return hidden


@dataclass(frozen=True)
class OverlapResult:
    variant: str
    share: float  # mean over ranks
    comm_ms_per_step: float  # mean over ranks
    hidden_ms_per_step: float

    def to_dict(self) -> dict:
        return asdict(self)


def rank_overlap(payload: dict) -> dict:
    """World job (NCCL): profile ``payload['profile_steps']`` steps of ``payload['spec']``."""
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    from paracheck.bench._step_rank import (
        build_model,
        configure,
        rank_batch,
        rank_device,
        train_step,
    )
    from paracheck.bench._step_spec import StepSpec
    from paracheck.bench.variants import build_setup

    if dist.get_backend() != "nccl":
        raise NotImplementedError(
            "the overlap share is measured from CUDA kernel timelines: it needs NCCL"
        )
    spec = StepSpec.from_dict(payload["spec"])
    device = rank_device()
    configure(spec, device)
    model = build_model(spec, device)
    setup = build_setup(
        spec.variant, model, bucket_mb=spec.bucket_mb, device=device, fused=spec.fused
    )
    x, y = rank_batch(spec, device, dist.get_rank())
    for _ in range(spec.warmup):
        train_step(setup, x, y)
    torch.cuda.synchronize(device)
    n = payload["profile_steps"]
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            train_step(setup, x, y)
        torch.cuda.synchronize(device)
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    finally:
        os.unlink(path)
    comm, compute = [], []
    for e in events:
        if e.get("ph") != "X" or e.get("cat", "").lower() != "kernel":
            continue
        span = (float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)))
        (comm if "nccl" in e.get("name", "").lower() else compute).append(span)
    total = sum(b - a for a, b in comm)
    hidden = hidden_time(comm, compute)
    del setup, model
    torch.cuda.empty_cache()
    return {"comm_us": total / n, "hidden_us": hidden / n}


def overlap_share(
    world, spec, *, profile_steps: int = 3, timeout: float | None = None
) -> OverlapResult:
    """Profile ``spec`` (a ``StepSpec``) on ``spec.world_size`` NCCL ranks of ``world``."""
    if world.backend != "nccl":
        raise NotImplementedError(
            "the overlap share is measured from CUDA kernel timelines: it needs NCCL"
        )
    per_rank = world.run(
        "paracheck.bench.overlap:rank_overlap",
        {"spec": spec.to_dict(), "profile_steps": profile_steps},
        world_size=spec.world_size,
        timeout=timeout,
    )
    comm = sum(r["comm_us"] for r in per_rank) / len(per_rank)
    hidden = sum(r["hidden_us"] for r in per_rank) / len(per_rank)
    return OverlapResult(spec.variant, hidden / comm if comm else 0.0, comm / 1e3, hidden / 1e3)
