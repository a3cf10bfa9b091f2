"""The gate's rule as pure functions (Note [The gate rule] in ``paracheck.gate``), and the rows
it reports."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from paracheck.accounting.schedule import SCHEDULE_QUANTITIES

__all__ = [
    "CUDA_QUANTITIES",
    "EXACT_QUANTITIES",
    "GateRow",
    "PassTiming",
    "exact_verdict",
    "format_rows",
    "false_alarm_bound",
    "noise_threshold",
    "timing_verdict",
]

# Note [Thresholds from measured noise]
#     One fixed threshold is too loose for a variant whose step is steady (a 10% slowdown of it
#     goes through about half the time) and can be too tight for one that is noisy. ``paracheck
#     gate --calibrate N`` measures the noise instead, on the machine the gate will run on and
#     with the settings it will use: N times, the gate's two passes on one commit against itself
#     (A/A), each pass with fresh workers as in a real run (R rounds, then the confirming
#     pass's rounds). Per variant that gives N first-pass median ratios a_i and N second-pass
#     ones b_i, pure noise since the code is the same.
#
#     The gate fails a timing only when both passes read above 1 + t. For a threshold t let
#     k1(t) = #{i: a_i > 1 + t} and k2(t) = #{i: b_i > 1 + t}. A later A/A first pass and the N
#     calibration first passes are exchangeable draws of one distribution, so the later one
#     exceeds 1 + t with probability at most (k1 + 1)/(N + 1) (it would have to be among the
#     k1 + 1 largest of N + 1); the same for the second pass with k2. The two passes of a run
#     use different processes at different times; taking them as independent, a variant raises
#     a false alarm with probability at most
#
#         p(t) = (k1(t) + 1)(k2(t) + 1) / (N + 1)^2,
#
#     and V variants with at most V p(t). The variant's threshold is the smallest t >= floor
#     with V p(t) <= the wanted false-alarm rate (``--alarm-rate``, default 1 in 30 gate runs).
#     Where no t reaches it (N too small: the least p is 1/(N + 1)^2), the threshold is the
#     largest deviation seen and the calibration says so. No model of the noise is assumed:
#     shared machines have heavy tails (an A/A pass 17% off on 2-core slices of a loaded host)
#     that a standard deviation understates. Only slowdowns count ("faster" never fails).
#     ``floor`` (default 2%) keeps a variant measured as very steady from failing on changes too
#     small to matter.
#
#     What it costs: a slowdown is caught about half the time when it equals the variant's
#     threshold; the calibration prints each threshold, so what the gate can see on this
#     machine is known. The thresholds hold for the machine and the settings they were measured
#     with: a file whose device, world size, timing, rounds, steps, model or bucket size differ
#     from the gate's is refused.

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
    # Note [Communication schedule of a step] in paracheck.accounting.schedule.
    *SCHEDULE_QUANTITIES,
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


def false_alarm_bound(first, second, t: float) -> float:
    """p(t) of Note [Thresholds from measured noise]: the bound on one variant's false-alarm
    probability at threshold ``t``, from its A/A first- and second-pass median ratios."""
    n = len(first)
    k1 = sum(r > 1 + t for r in first)
    k2 = sum(r > 1 + t for r in second)
    return (k1 + 1) * (k2 + 1) / (n + 1) ** 2


def noise_threshold(
    first, second, *, variants: int = 1, alarm_rate: float = 1 / 30, floor: float = 0.02
) -> tuple[float, bool]:
    """A variant's threshold from its A/A passes (Note [Thresholds from measured noise]): the
    smallest t >= ``floor`` with ``variants`` * p(t) <= ``alarm_rate``. Returns (t, reached):
    ``reached`` False where N passes cannot show that rate and t is the largest deviation."""
    first, second = [float(r) for r in first], [float(r) for r in second]
    if not first or len(first) != len(second):
        raise ValueError(
            f"first ({len(first)}) and second ({len(second)}) must hold one ratio per A/A run, "
            f"at least one"
        )
    if min(first + second) <= 0:
        raise ValueError(f"median ratios must be > 0: {first}, {second}")
    if not floor > 0 or not 0 < alarm_rate < 1 or variants < 1:
        raise ValueError(
            f"floor={floor!r} must be > 0, alarm_rate={alarm_rate!r} in (0, 1), "
            f"variants={variants!r} >= 1"
        )
    # p(t) only changes where t crosses a ratio: the candidates are the floor and each ratio.
    candidates = sorted({floor} | {r - 1 for r in first + second if r - 1 > floor})
    for t in candidates:
        if variants * false_alarm_bound(first, second, t) <= alarm_rate:
            return t, True
    return candidates[-1], False


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
