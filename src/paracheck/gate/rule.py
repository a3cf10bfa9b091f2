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
    "timing_verdict",
]

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
