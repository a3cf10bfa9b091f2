"""The gate's rule as pure functions (Note [The gate rule] in ``paracheck.gate``), and the rows
it reports."""

from __future__ import annotations

import functools
import math
import statistics
from dataclasses import dataclass

from paracheck.accounting.schedule import SCHEDULE_QUANTITIES

__all__ = [
    "CUDA_QUANTITIES",
    "EXACT_QUANTITIES",
    "DEFAULT_ROUNDS",
    "ERROR_RATE",
    "GateRow",
    "PassTiming",
    "RatioDecision",
    "SequentialPlan",
    "decide_ratio",
    "exact_verdict",
    "format_rows",
    "sequential_plan",
    "timing_row",
]

# Note [Sequential sign test]
#     A round gives one ratio head/base of two jobs run back to back (ABBA order); a variant's
#     rounds go on until the median of its per-round ratios is shown, with known error rates, to
#     lie above 1 + threshold (FAIL), below it (PASS), or the budget ends (INCONCLUSIVE).
#
#     The statistic is the count S_n of the first n rounds whose ratio exceeds 1 + t. If the
#     median ratio m is at most 1 + t, each round exceeds it with probability p <= 1/2, whatever
#     the distribution of the ratios (heavy tails, a few rounds hit by load, a skew): only the
#     rounds' independence is assumed, and ABBA order with fresh workers every few rounds is
#     what makes it plausible. The gate looks after every second round (n = 2, 4, ..., N) and
#     FAILs the first time S_n >= c_n. The probability of ever crossing is largest at p = 1/2
#     (crossing an upper boundary is monotone in p) and is computed *exactly* for p = 1/2 by a
#     dynamic program over the binomial walk with its boundaries (``sequential_plan``): no
#     approximation, no penalty for looking often beyond the exact one. Symmetrically, PASS
#     when the count below 1 + t reaches c_n, false with probability <= alpha when m >= 1 + t.
#     The boundaries c_n are those of one nominal per-look level, the largest whose exact
#     overall crossing probability is <= alpha.
#
#     The same boundaries are a confidence interval on the median ratio, valid at every look at
#     once: [c_n-th largest ratio, c_n-th smallest ratio] (order statistics) misses the median
#     with probability <= 2 alpha. FAIL is "the interval lies wholly above 1 + t", PASS "wholly
#     below"; an INCONCLUSIVE gate prints it with the spread of the ratios.
#
#     The rates: the targets are no false FAIL (identical commits) and no false PASS (a 40%
#     slowdown) in 30 gate runs, and at most 1 false FAIL in 30 on a quiet machine. alpha =
#     0.001 per direction and gate makes 30 error-free runs 97% likely even for a true median
#     exactly at the threshold, where the bound is attained; identical commits (m = 1) and a 40%
#     slowdown (m = 1.4) sit far from a 10% threshold, where the rates are far smaller
#     (tests/unit/test_gate_sequential.py simulates them from measured ratio spreads). With V
#     variants each gets alpha / V (a union bound over the gate's verdict).
#
#     What it cannot see: a process-long bias of one side (where the loader put things, which
#     cores its ranks share) makes rounds dependent; workers are restarted every
#     ``fresh_every`` rounds so that no one process decides alone. And the median is of the
#     ratios on the machine as loaded: a blocking slowdown (a sleep) is a smaller share of a
#     step that CPU load has stretched, so a loaded machine shows it smaller than a quiet one.

ERROR_RATE = 0.001
DEFAULT_ROUNDS = 60  # the budget of rounds; see "How long" in benchmarks/README.md


@dataclass(frozen=True)
class SequentialPlan:
    """The boundaries of Note [Sequential sign test]: at look ``n`` (even, <= ``max_rounds``)
    FAIL once ``need[n]`` ratios exceed 1 + t, PASS once ``need[n]`` are below it (``n + 1``:
    no decision possible yet). ``error`` is the exact probability, at a median on the
    threshold, of a wrong verdict in one direction."""

    max_rounds: int
    alpha: float
    need: tuple[int, ...]  # indexed by n; odd n and n = 0 are never looks
    error: float

    @property
    def first_look(self) -> int | None:
        """The fewest rounds that can decide, None if the budget is too small for any."""
        return next((n for n in range(2, self.max_rounds + 1, 2) if self.need[n] <= n), None)


def _tail(n: int, c: int) -> float:
    """P(Binomial(n, 1/2) >= c)."""
    return _tails(n)[min(max(c, 0), n + 1)]


@functools.lru_cache(maxsize=4096)
def _tails(n: int) -> tuple[float, ...]:
    """P(Binomial(n, 1/2) >= c) for c = 0 .. n + 1, each the exact integer sum divided once by
    2**n (the same floats as summing per c, computed once rather than per look and level)."""
    suffix, total = [0] * (n + 2), 0
    for k in range(n, -1, -1):
        total += math.comb(n, k)
        suffix[k] = total
    return tuple(x / 2**n for x in suffix)


def _boundaries(max_rounds: int, level: float) -> tuple[int, ...]:
    need = [1] * (max_rounds + 1)
    for n in range(max_rounds + 1):
        tails = _tails(n)
        need[n] = next((c for c in range(n + 1) if tails[c] <= level), n + 1)
    return tuple(need)


def _crossing(need: tuple[int, ...]) -> float:
    """The exact probability that the count of a fair coin's heads reaches ``need[n]`` at some
    even n (the looks), by dynamic programming over the walk not yet stopped."""
    alive = [1.0]  # alive[s]: P(s heads after n tosses and no crossing yet)
    crossed = 0.0
    for n in range(1, len(need)):
        nxt = [0.0] * (n + 1)
        for s, p in enumerate(alive):
            nxt[s] += p / 2
            nxt[s + 1] += p / 2
        if n % 2 == 0:
            crossed += sum(nxt[need[n] :])
            nxt = [p if s < need[n] else 0.0 for s, p in enumerate(nxt)]
        alive = nxt
    return crossed


@functools.lru_cache(maxsize=64)
def sequential_plan(max_rounds: int, alpha: float = ERROR_RATE) -> SequentialPlan:
    """The boundaries of Note [Sequential sign test] for a budget of ``max_rounds`` rounds and
    an error rate ``alpha`` per direction: one nominal per-look level, the largest whose exact
    crossing probability is <= ``alpha`` (bisection; the boundaries are integers, so many levels
    give the same ones)."""
    if max_rounds < 2:
        raise ValueError(f"max_rounds={max_rounds!r} must be >= 2")
    if not 0 < alpha < 0.5:
        raise ValueError(f"alpha={alpha!r} must be in (0, 0.5)")
    lo, hi = 0.0, alpha  # the level of one look is never above the whole
    for _ in range(60):
        mid = (lo + hi) / 2
        if _crossing(_boundaries(max_rounds, mid)) <= alpha:
            lo = mid
        else:
            hi = mid
    need = _boundaries(max_rounds, lo)
    return SequentialPlan(max_rounds, alpha, need, _crossing(need))


@dataclass(frozen=True)
class RatioDecision:
    """What the rounds so far say about one variant (Note [Sequential sign test]).
    ``verdict``: "REGRESSION" (the interval lies above 1 + threshold), "ok" (below it),
    "faster" (below 1 - threshold) or "INCONCLUSIVE" (neither, yet); ``low``/``high``: the
    interval on the median ratio, None where too few rounds bound it."""

    verdict: str
    rounds: int
    median: float
    low: float | None
    high: float | None
    spread: tuple[float, float]

    @property
    def decided(self) -> bool:
        return self.verdict != "INCONCLUSIVE"

    def describe(self, coverage: float) -> str:
        lo = "-" if self.low is None else f"x{self.low:.3f}"
        hi = "-" if self.high is None else f"x{self.high:.3f}"
        return (
            f"{self.rounds} rounds, median ratio x{self.median:.3f}, {coverage:.1%} interval "
            f"[{lo}, {hi}], spread x{self.spread[0]:.3f}-x{self.spread[1]:.3f}"
        )


def decide_ratio(ratios, threshold: float, plan: SequentialPlan) -> RatioDecision:
    """The verdict of Note [Sequential sign test] on the per-round head/base ``ratios`` so far
    (an even number of them, at most ``plan.max_rounds``)."""
    ratios = [float(r) for r in ratios]
    n = len(ratios)
    if not threshold > 0:
        raise ValueError(f"threshold={threshold!r} must be > 0")
    if n < 1 or n > plan.max_rounds or min(ratios) <= 0:
        raise ValueError(
            f"{n} ratios {ratios} must be > 0, at least 1 and at most {plan.max_rounds}"
        )
    ordered = sorted(ratios)
    c = plan.need[n] if n % 2 == 0 else n + 1
    low = ordered[n - c] if c <= n else None  # the c-th largest
    high = ordered[c - 1] if c <= n else None  # the c-th smallest
    verdict = "INCONCLUSIVE"
    if low is not None and low > 1 + threshold:
        verdict = "REGRESSION"
    elif high is not None and high < 1 - threshold:
        verdict = "faster"
    elif high is not None and high < 1 + threshold:
        verdict = "ok"
    return RatioDecision(
        verdict, n, statistics.median(ratios), low, high, (ordered[0], ordered[-1])
    )


EXACT_QUANTITIES = (
    "collectives",
    "payload_bytes",
    "bus_bytes",
    "optimizer_state_bytes",
    "peak_init_bytes",
    "peak_before_step_bytes",
    "peak_step_bytes",
    # Note [Checkpoint bytes] in paracheck.bench._checkpoint.
    "checkpoint_save_bytes",
    "checkpoint_load_bytes",
    "peak_load_bytes",
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

    def to_dict(self) -> dict:
        return {
            "base_s": list(self.base),
            "head_s": list(self.head),
            "ratios": self.ratios,
            "median_ratio": self.median_ratio,
            "min_ratio": self.min_ratio,
        }


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


# What the table's verdict column says for a row's verdict: the words of the gate's summary
# (FAIL, PASS, INCONCLUSIVE), or "not gated" with the reason, so that no row reads as a verdict
# the summary does not give.
_WORDS = {
    "REGRESSION": "FAIL",
    "ok": "PASS",
    "faster": "PASS (faster)",
    "better": "PASS (lower)",
    "INCONCLUSIVE": "INCONCLUSIVE",
    "UNSTABLE": "not gated (unstable)",
    "new": "not gated (new)",
    "gone": "not gated (gone)",
}


@dataclass
class GateRow:
    """One row of the gate's table. ``verdict`` is the rule's own word ("REGRESSION", "ok",
    "faster", "better", "INCONCLUSIVE", "UNSTABLE", "new", "gone"); ``word`` is what the table
    prints for it, in the summary's words."""

    variant: str
    quantity: str
    base: float | None
    head: float | None
    verdict: str
    detail: str = ""

    @property
    def failed(self) -> bool:
        return self.verdict == "REGRESSION"

    @property
    def word(self) -> str:
        return _WORDS.get(self.verdict, self.verdict)


def timing_row(
    variant: str,
    quantity: str,
    timing: PassTiming,
    decision: RatioDecision,
    coverage: float,
    verbose: bool = False,
) -> GateRow:
    """The table's row of one variant's step time: the medians of its jobs, the decision, and
    (with ``verbose``) the ratio of the fastest jobs, which is reported, not judged (Note [The
    gate rule]): printed bare beside a PASS, "ratio of minima x1.411" read as a 41% slowdown, so
    it says what it is, and only when asked."""
    detail = decision.describe(coverage)
    if verbose:
        detail += f"; not judged: fastest head job / fastest base job x{timing.min_ratio:.3f}"
    return GateRow(
        variant,
        quantity,
        1e3 * statistics.median(timing.base),
        1e3 * statistics.median(timing.head),
        decision.verdict,
        detail,
    )


def round_words(
    variant: str, base: list[float], head: list[float], decision: RatioDecision, coverage: float
) -> str:
    """A progress line's words for ``variant`` after a pair of rounds: the two rounds' head/base
    ratios, named as such (a bare "x1.411" reads as a verdict), and, once decided, the verdict in
    the table's and the summary's words."""
    ratios = ", ".join(f"x{h / b:.3f}" for b, h in zip(base[-2:], head[-2:]))
    words = f"{variant} head/base of these rounds {ratios}"
    if decision.decided:
        words += (
            f" -> {_WORDS.get(decision.verdict, decision.verdict)} ({decision.describe(coverage)})"
        )
    return words


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
            f"| {r.word} | {r.detail} |"
        )
    if hidden:
        lines.append(f"\n{hidden} exact quantities unchanged (--verbose shows them).")
    return "\n".join(lines)
