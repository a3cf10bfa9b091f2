"""The values of ``paracheck.bench.step``: what one measured step is (``StepSpec``) and what the
two jobs return (``StepTiming``, ``StepAccount``)."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field, replace

import torch

from paracheck.workloads.lm import LMSpec

__all__ = ["StepAccount", "StepSpec", "StepTiming"]


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64}


@dataclass(frozen=True)
class StepSpec:
    """What to measure: ``variant`` training the LM ``model`` on ``world_size`` ranks, local batch
    ``batch`` of ``model.context_length`` tokens, ``warmup`` untimed then ``steps`` timed steps."""

    variant: str
    model: LMSpec = field(default_factory=LMSpec)
    world_size: int = 2
    batch: int = 4
    dtype: str = "float32"
    bucket_mb: float = 25.0
    warmup: int = 2
    steps: int = 8
    tf32: bool = True
    fused: bool = True  # fused AdamW where the device has it (CUDA)
    seed: int = 0

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype={self.dtype!r} must be one of {sorted(DTYPES)}")
        if not isinstance(self.world_size, int) or self.world_size < 1:
            raise ValueError(f"world_size={self.world_size!r} must be an int >= 1")
        if self.variant == "local" and self.world_size != 1:
            raise ValueError(
                f"variant='local' runs on one rank; world_size={self.world_size} must be 1"
            )
        if self.batch < 1 or self.steps < 1 or self.warmup < 0:
            raise ValueError(
                f"batch={self.batch}, steps={self.steps} must be >= 1 and warmup={self.warmup} >= 0"
            )
        if not self.bucket_mb > 0:
            raise ValueError(f"bucket_mb={self.bucket_mb!r} must be > 0")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["model"] = asdict(self.model)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> StepSpec:
        d = dict(d)
        d["model"] = LMSpec(**d["model"])
        return cls(**d)

    def with_(self, **changes) -> StepSpec:
        return replace(self, **changes)


@dataclass(frozen=True)
class StepTiming:
    """Per timed step, the slowest rank's wall time (``step_times``) and CPU time (``cpu_times``,
    the rank process's CPU time over all its threads, gloo's included: the work done, which other
    processes on a loaded machine barely move, while they move wall time by tens of percent)."""

    spec: StepSpec
    step_times: tuple[float, ...]  # seconds
    cpu_times: tuple[float, ...]  # seconds
    cuda_memory: dict  # Note [CUDA memory points], bytes, max over ranks; {} on CPU
    rss_peak: int  # max over ranks of the peak resident set during the job (bytes); noisy
    # Bytes held when the job started and when it ended (max over ranks; Note [Measuring from
    # a clean state]): 0 and 0 when no job leaks.
    start_bytes: int = 0
    left_bytes: int = 0

    @property
    def median(self) -> float:
        """Median wall time per step (the CS336 convention)."""
        return statistics.median(self.step_times)

    @property
    def cpu_min(self) -> float:
        """Least CPU time of a step: the estimate least disturbed by other processes."""
        return min(self.cpu_times)

    def to_dict(self) -> dict:
        return {
            "spec": self.spec.to_dict(),
            "step_times": list(self.step_times),
            "cpu_times": list(self.cpu_times),
            "median": self.median,
            "min": min(self.step_times),
            "cpu_min": self.cpu_min,
            "cuda_memory": dict(self.cuda_memory),
            "rss_peak": self.rss_peak,
            "start_bytes": self.start_bytes,
            "left_bytes": self.left_bytes,
        }


@dataclass(frozen=True)
class StepAccount:
    """Exact per-rank quantities (max over ranks) of one steady-state step; see
    Note [Exact quantities]."""

    spec: StepSpec
    collectives: int
    collectives_by_kind: dict
    payload_bytes: int
    bus_bytes: float
    init_collectives: int
    optimizer_state_bytes: int
    param_bytes: int
    grad_bytes: int
    peak_init_bytes: int
    peak_before_step_bytes: int
    peak_step_bytes: int
    # Note [Host cost per step] in paracheck.accounting.record (0 where not measured).
    operators: int = 0
    launches: int = 0
    allocations: int = 0
    hooks: int = 0
    # Note [Communication schedule of a step] in paracheck.accounting.schedule: the schedule of
    # rank 0 (StepSchedule.to_dict(); None where not measured) and its derived quantities
    # (max over ranks), all lower-is-better.
    schedule: dict | None = None
    device_syncs: int = 0
    waits_in_backward: int = 0
    launches_after_backward: int = 0
    bytes_after_backward: int = 0
    bytes_before_backward_end: int = 0
    exposed_comm_pct_balanced: float = 0.0
    exposed_comm_us_nvlink_h100: float = 0.0
    exposed_comm_us_pcie4: float = 0.0
    exposed_comm_us_ethernet_100g: float = 0.0
    host_calls: int = 0
    world_calls: int = 0
    cuda_sync_warnings: int = -1  # set_sync_debug_mode's count on CUDA, -1 elsewhere
    # Note [Checkpoint bytes] in paracheck.bench._checkpoint (0 where not measured).
    checkpoint_save_bytes: int = 0
    checkpoint_load_bytes: int = 0
    peak_load_bytes: int = 0

    @property
    def peak_bytes(self) -> int:
        return max(self.peak_init_bytes, self.peak_before_step_bytes, self.peak_step_bytes)

    def to_dict(self) -> dict:
        d = {k: v for k, v in asdict(self).items() if k != "spec"}
        d["spec"] = self.spec.to_dict()
        d["peak_bytes"] = self.peak_bytes
        return d
