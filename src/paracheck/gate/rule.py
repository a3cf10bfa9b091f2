"""The gate's rule as pure functions (Note [The gate rule] in ``paracheck.gate``), and the rows
it reports."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

__all__ = [
    "CUDA_QUANTITIES",
    "EXACT_QUANTITIES",
    "GateRow",
    "PassTiming",
    "exact_verdict",
    "format_rows",
    "noise_threshold",
    "timing_verdict",
]

# Note [Thresholds from measured noise]
#     One fixed threshold is too loose for a variant whose step is steady (a 10% slowdown of it
#     goes through about half the time) and can be too tight for one that is noisy. ``paracheck
#     gate --calibrate N`` measures the noise instead: N first passes of the gate on one commit
#     against itself (A/A), each with fresh workers as a real gate run has, on the machine the
#     gate will run on, with the settings it will use. Each gives per variant one median ratio
#     r_i, which for identical code is pure noise. A variant's threshold is then
#
#         t = max(floor, max_i |log r_i|)
#
#     Why the largest deviation seen, and not a multiple of a spread: it needs no model of the
#     noise. The A/A passes and a later A/A pass of the gate are exchangeable draws of the same
#     distribution, so the later pass is the largest of the N + 1 with probability at most
#     1/(N + 1): it exceeds t in one direction with probability at most 1/(N + 1). The gate fails
#     a timing only when its second pass, fresh workers and twice the rounds, is above t too.
#     If the two passes are independent, and the second (a median of more rounds) is no noisier
#     than the first, a variant raises a false alarm with probability at most 1/(N + 1)^2, and V
#     variants with at most V/(N + 1)^2: 1 in 120 for 8 variants and N = 30. Shared machines
#     have heavy tails (an A/A pass 17% off on 2-core slices of a loaded host) that a standard
#     deviation understates and the largest deviation keeps. ``floor`` (default 2%) keeps a
#     variant measured as very steady from failing on changes too small to matter.
#
#     What it costs: a slowdown is caught about half the time when it equals the variant's
#     threshold and nearly always at twice the noise of a pass above it; the calibration prints
#     each variant's threshold so that what the gate can see on this machine is known. The
#     thresholds hold for the machine and the settings they were measured with: a file whose
#     device, world size, timing, rounds, steps, model or bucket size differ from the gate's is
#     refused.

EXACT_QUANTITIES = (
    "collectives",
    "payload_bytes",
    "bus_bytes",
    "optimizer_state_bytes",
    "peak_init_bytes",
    "peak_before_step_bytes",
    "peak_step_bytes",
    # Note [Host cost per step] in paracheck.accounting.record.
    "operators",
    "launches",
    "allocations",
    "hooks",
)
CUDA_QUANTITIES = ("cuda_init", "cuda_before_step", "cuda_after_step", "cuda_peak")


@dataclass(frozen=True)
class PassTiming:
    """One pass's job readings of one variant (seconds, each a job's fastest step), paired by
    round: ``base[r]`` and ``head[r]`` ran back to back in round r."""

    base: tuple[float, ...]
    head: tuple[float, ...]

    def __post_init__(self):
        if not self.base or len(self.base) != len(self.head):
            raise ValueError(
                f"base ({len(self.base)} readings) and head ({len(self.head)}) must pair up, "
                f"at least one round"
            )
        if min(self.base) <= 0 or min(self.head) <= 0:
            raise ValueError(f"readings must be > 0: base {self.base}, head {self.head}")

    @property
    def ratios(self) -> list[float]:
        return [h / b for b, h in zip(self.base, self.head)]

    @property
    def median_ratio(self) -> float:
        """Median of the paired head/base ratios."""
        return statistics.median(self.ratios)

    @property
    def min_ratio(self) -> float:
        """Head's fastest job over base's fastest job: reported, not judged (Note [The gate
        rule])."""
        return min(self.head) / min(self.base)

    def says(self, threshold: float) -> str:
        """ "slower", "faster" or "same": see Note [The gate rule]."""
        m = self.median_ratio
        if m > 1 + threshold:
            return "slower"
        if m < 1 - threshold:
            return "faster"
        return "same"

    def to_dict(self) -> dict:
        return {
            "base_s": list(self.base),
            "head_s": list(self.head),
            "ratios": self.ratios,
            "median_ratio": self.median_ratio,
            "min_ratio": self.min_ratio,
        }


def noise_threshold(median_ratios, floor: float = 0.02) -> float:
    """A variant's threshold from the median ratios of its A/A first passes (Note [Thresholds
    from measured noise]): the largest relative deviation seen, in either direction, or
    ``floor``, whichever is larger."""
    import math

    ratios = [float(r) for r in median_ratios]
    if not ratios:
        raise ValueError("median_ratios must hold at least one A/A pass")
    if min(ratios) <= 0:
        raise ValueError(f"median ratios must be > 0: {ratios}")
    if not floor > 0:
        raise ValueError(f"floor={floor!r} must be > 0")
    return max(floor, max(math.expm1(abs(math.log(r))) for r in ratios))


def timing_verdict(first: PassTiming, second: PassTiming | None, threshold: float) -> str:
    """``first``/``second``: the two passes' readings (``second`` None when no second pass ran).
    Returns "ok", "faster" or "REGRESSION"; see Note [The gate rule]."""
    if not threshold > 0:
        raise ValueError(f"threshold={threshold!r} must be > 0")
    said = first.says(threshold)
    if said == "same":
        return "ok"
    if second is None:
        raise ValueError(
            f"the first pass says {said} (median ratio {first.median_ratio:.3f}, threshold "
            f"{threshold}): a second pass is required"
        )
    if second.says(threshold) != said:
        return "ok"
    return "REGRESSION" if said == "slower" else "faster"


def exact_verdict(base: list, head: list) -> str:
    """``base``/``head``: the readings of one exact quantity on each side. "ok", "better",
    "REGRESSION" (head above base by any amount) or "UNSTABLE" (a side disagrees with itself)."""
    if not base or not head:
        raise ValueError("base and head must each hold at least one reading")
    if len(set(base)) > 1 or len(set(head)) > 1:
        return "UNSTABLE"
    if head[0] > base[0]:
        return "REGRESSION"
    return "better" if head[0] < base[0] else "ok"


@dataclass
class GateRow:
    variant: str
    quantity: str
    base: float | None
    head: float | None
    verdict: str
    detail: str = ""

    @property
    def failed(self) -> bool:
        return self.verdict == "REGRESSION"


def _fmt(q: str, v) -> str:
    if v is None:
        return "-"
    if q.startswith("step "):
        return f"{v:.2f}"
    if isinstance(v, float) and not v.is_integer():
        return f"{v:,.1f}"
    return f"{int(v):,}"


def format_rows(rows: list[GateRow], *, verbose: bool = False) -> str:
    """A markdown table: every timing, every exact quantity that changed or is unstable (all
    exact quantities with ``verbose``)."""
    shown = [r for r in rows if verbose or r.quantity.startswith("step ") or r.verdict != "ok"]
    hidden = len(rows) - len(shown)
    lines = [
        "| variant | quantity | base | head | verdict | detail |",
        "| --- | --- | ---: | ---: | --- | --- |",
    ]
    for r in shown:
        lines.append(
            f"| {r.variant} | {r.quantity} | {_fmt(r.quantity, r.base)} | {_fmt(r.quantity, r.head)} "
            f"| {r.verdict} | {r.detail} |"
        )
    if hidden:
        lines.append(f"\n{hidden} exact quantities unchanged (--verbose shows them).")
    return "\n".join(lines)
