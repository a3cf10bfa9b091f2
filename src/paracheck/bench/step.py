"""One training step of a variant on W ranks: its time, its memory, its communication.

Two jobs per ``StepSpec``, run on a ``paracheck.world.World``:

* ``time_step``: median step time (per step, the slowest rank; forward + backward +
  synchronisation + optimizer step, each step started together after a barrier), CUDA peak memory
  at the CS336 points, and each rank's peak RSS (noisy: other processes and the allocator move it);
* ``account_step``: the exact quantities of Note [Exact quantities] (``paracheck.accounting.record``)
  for one steady-state step (the third; see ``rank_account``), plus the
  memory breakdown (parameters, gradients, optimizer state, the rest) at the point just before
  ``optimizer.step()``, and after that step a checkpoint's bytes written and read per rank and
  the peak while it is loaded (Note [Checkpoint bytes] in ``paracheck.bench._checkpoint``).

Timing and accounting are separate jobs because the recorder costs Python work per operator.

The values are ``paracheck.bench._step_spec``; what runs on the ranks (Note [CUDA memory
points], Note [Measuring from a clean state]) is ``paracheck.bench._step_rank``, reached as
``paracheck.bench.step:rank_time`` and ``paracheck.bench.step:rank_account``.
"""

from __future__ import annotations

from paracheck.bench._step_rank import (
    live_tensor_bytes,
    rank_account,
    rank_time,
    release,
)
from paracheck.bench._step_spec import StepAccount, StepSpec, StepTiming

__all__ = [
    "StepSpec",
    "StepTiming",
    "StepAccount",
    "time_step",
    "account_step",
    "rank_time",
    "rank_account",
    "release",
    "live_tensor_bytes",
]


# -- on the driver ----------------------------------------------------------------------------
def _check_world(world, spec: StepSpec) -> None:
    if spec.world_size > world.size:
        raise ValueError(f"world_size={spec.world_size} exceeds the World's size {world.size}")


def time_step(
    world, spec: StepSpec, *, timeout: float | None = None, count: bool = False
) -> StepTiming:
    """Run ``rank_time`` on ``spec.world_size`` ranks of ``world``; see the module docstring.
    ``count``: count ``start_bytes`` and ``left_bytes`` on the CPU too (two scans of every live
    object, ~0.3 s each; on CUDA they are always counted, for free)."""
    _check_world(world, spec)
    per_rank = world.run(
        "paracheck.bench.step:rank_time",
        {**spec.to_dict(), "count": count},
        world_size=spec.world_size,
        timeout=timeout,
    )
    # A step is as slow as its slowest rank: they wait for each other in the next collective.
    times = tuple(max(r["times"][i] for r in per_rank) for i in range(spec.steps))
    cpu = tuple(max(r["cpu_times"][i] for r in per_rank) for i in range(spec.steps))
    memory = {k: max(r["cuda_memory"][k] for r in per_rank) for k in per_rank[0]["cuda_memory"]}
    return StepTiming(
        spec,
        times,
        cpu,
        memory,
        max(r["rss_peak"] for r in per_rank),
        start_bytes=max(r["start_bytes"] for r in per_rank),
        left_bytes=max(r["left_bytes"] for r in per_rank),
    )


def account_step(world, spec: StepSpec, *, timeout: float | None = None) -> StepAccount:
    """Run ``rank_account`` on ``spec.world_size`` ranks of ``world``; max over ranks."""
    _check_world(world, spec)
    per_rank = world.run(
        "paracheck.bench.step:rank_account",
        spec.to_dict(),
        world_size=spec.world_size,
        timeout=timeout,
    )
    by_kind: dict[str, int] = {}
    for r in per_rank:
        for k, n in r["collectives_by_kind"].items():
            by_kind[k] = max(by_kind.get(k, 0), n)
    fields = {
        k: max(r[k] for r in per_rank)
        for k in per_rank[0]
        if k not in ("collectives_by_kind", "schedule", "cuda_sync_messages")
    }
    return StepAccount(
        spec=spec,
        collectives_by_kind=dict(sorted(by_kind.items())),
        schedule=per_rank[0].get("schedule"),
        **fields,
    )
