"""What a check found, as people and CI read it: one table of properties, the report objects,
their text (``CheckReport.text()``) and JSON (``CheckReport.to_dict()``).

Every failure is reported as the property it breaks (``PROPERTIES``: what the property means,
and what usually fixes it), the features of the shrunk case it needs
(``paracheck.check.features``), the case itself, what diverged, and a command that replays it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from paracheck.check.failure import (  # re-exported: the report's parts
    PROPERTIES,
    Property,
    PropertyFailure,
    case_line,
    order,
    own_fragments,
    replay_command,
    target_frame,
)
from paracheck.check.run import CaseResult
from paracheck.check.verdict import cause_text, causes_of

__all__ = [
    "PROPERTIES",
    "Property",
    "PropertyFailure",
    "CheckReport",
    "case_line",
    "case_report",
    "replay_command",
    "target_frame",
]


# The heading of the verdict table's rows beyond the target's contract (``RowVerdict.beyond``).
BEYOND_HEADING = "beyond the contract (features its interface does not promise):"


@dataclass
class CheckReport:
    """The verdict of ``check_target``: every failing property, each with its own shrunk case."""

    target: object
    passed: bool
    examples: int  # cases run before the first failure (or in total when passed)
    seconds: float
    failures: list[PropertyFailure] = field(default_factory=list)
    worst_ratio: float = 0.0
    world_sizes: tuple[int, ...] = ()
    notes: list[str] = field(default_factory=list)
    cases_run: int = 0  # distinct cases run, shrinking and labelling included
    timeout: float | None = None  # the hang timeout the replay commands carry
    # The example database (paracheck.check.database): its directory (None: none), the saved
    # cases run before the search, those of them dropped because they pass now, the cases saved.
    database: str | None = None
    replayed: int = 0
    dropped: int = 0
    saved: int = 0
    rank_memory: float | None = None  # the ranks' memory cap (GB) the replay commands carry
    # The largest ratio of a gradient's difference from the float64 gradient to its bound over
    # the cases the float64-bound property judged (None: none judged).
    worst_bound: float | None = None
    # The verdict table (Note [The verdict table] in paracheck.check.table); empty: no table.
    rows: list = field(default_factory=list)  # of paracheck.check.verdict.RowVerdict
    stopped: str | None = None  # why the check ended before its end (a signal), or None
    # Whether a table with rows not reached passes (``--incomplete pass``): else it is INCOMPLETE.
    incomplete_passes: bool = False
    # The properties the target's contract does not promise (paracheck.check.features
    # ``unpromised_properties``): a cause seen through one counts beyond the contract.
    unpromised: frozenset = frozenset()

    @property
    def not_reached(self) -> int:
        """The rows of the verdict table that were not searched (the budget ran out, a failure
        stopped the table with ``--first-failure``, a signal), whose verdict is unknown."""
        return sum(1 for r in self.rows if r.status == "not reached")

    @property
    def verdict(self) -> str:
        """FAIL (a property failed), STOPPED (a signal ended the check), INCOMPLETE (rows not
        reached and no failure, unless ``incomplete_passes``) or PASS."""
        if self.failures:
            return "FAIL"
        if self.stopped:
            return "STOPPED"
        if self.not_reached and not self.incomplete_passes:
            return "INCOMPLETE"
        return "PASS"

    @property
    def failure(self) -> CaseResult | None:
        """The first failing property's shrunk case (None when passed)."""
        return self.failures[0].result if self.failures else None

    def saved_cases(self) -> str:
        """What the example database did: "replayed 1 saved case (passes now: dropped)"."""
        out = []
        if self.replayed:
            s = "" if self.replayed == 1 else "s"
            text = f"replayed {self.replayed} saved case{s} first"
            if self.dropped:
                text += (
                    f" ({'it passes' if self.replayed == 1 else f'{self.dropped} pass'} now: "
                    "dropped)"
                )
            out.append(text)
        if self.saved:
            s = "" if self.saved == 1 else "s"
            out.append(f"saved {self.saved} failing case{s} in {self.database}")
        return "; ".join(out)

    def _summary(self) -> str:
        extra = self.saved_cases()
        extra = f"; {extra}" if extra else ""
        bound = (
            ""
            if self.worst_bound is None
            else f", float64 bound reached at most {self.worst_bound:.2f} of its allowance"
        )
        if self.passed and self.cases_run == 1 and self.examples == 1 and not self.replayed:
            return f"PASS {self.target.name}: the given case"
        if self.passed:
            return (
                f"PASS {self.target.name}: {_count(self.examples, 'case')}, world sizes {list(self.world_sizes)}, "
                f"{self.seconds:.1f} s, worst relative error {self.worst_ratio:.1e}{bound}{extra}"
            )
        props = ", ".join(
            f.property + (f" (without {f.without})" if f.without else "") for f in self.failures
        )
        return (
            f"FAIL {self.target.name}: {len(self.failures)} failing propert{'y' if len(self.failures) == 1 else 'ies'} "
            f"({props}); first found in case #{self.examples} run, "
            f"{_count(self.cases_run, 'case')} run in {self.seconds:.1f} s{extra}"
        )

    def text(self, backend: str = "gloo") -> str:
        if self.rows:
            return self.table_text(backend)
        out = [self.summary()]
        out += [f"  note: {n}" for n in self.notes]
        for f in self.failures:
            out.append(
                f.text(self.target, backend, timeout=self.timeout, rank_memory=self.rank_memory)
            )
        return "\n".join(out)

    def table_summary(self) -> str:
        """The verdict table's first line: how many rows fail, pass and were not run."""

        counts: dict[str, int] = {}
        for row in self.rows:
            counts[row.status] = counts.get(row.status, 0) + 1
        parts = [f"{n} {status}" for status, n in counts.items()]
        groups = self.causes()
        causes = len(groups)
        beyond = sum(1 for g in groups if self._beyond(g[0]))
        split = f" ({causes - beyond} within the contract, {beyond} beyond it)" if beyond else ""
        head = self.verdict
        found = (
            ""
            if self.passed
            else f"; {causes} cause{'s' if causes != 1 else ''} of failure{split}, the first "
            f"found in case #{self.examples} run"
        )
        extra = self.saved_cases()
        return (
            f"{head} {self.target.name}: verdict table of {_count(len(self.rows), 'row')} ({', '.join(parts)})"
            f"{found}; {_count(self.cases_run, 'case')} run (shrinking included), world sizes "
            f"{list(self.world_sizes)}, "
            f"{self.seconds:.1f} s" + (f"; {extra}" if extra else "")
        )

    def summary(self) -> str:
        return self.table_summary() if self.rows else self._summary()

    def _beyond(self, failure: PropertyFailure) -> bool:
        """Whether ``failure`` was filed under a row beyond the target's contract, or seen through
        a property the contract does not promise."""
        return failure.property in self.unpromised or any(
            r.beyond for r in self.rows if r.name == failure.row
        )

    def causes(self) -> list[list[PropertyFailure]]:
        """The failures grouped by cause (``causes_of``), in the order found, as the table
        streams them (Note [Numbered once, as printed] in ``paracheck.check.table``)."""
        return causes_of(self.failures)

    def table_text(self, backend: str = "gloo", *, blocks: bool = True, rows: bool = True) -> str:
        """The verdict table, one line per row (``rows``), then one block per cause of failure
        (``blocks``)."""

        out = [self.summary()]
        if self.stopped:
            out.append(f"  {self.stopped}")
        out += [f"  note: {n}" for n in self.notes]
        causes = self.causes()
        number = {id(f): i + 1 for i, group in enumerate(causes) for f in group}
        width = max(len(r.name) for r in self.rows)
        heading = False
        for row in self.rows if rows else ():
            if row.beyond and not heading:
                heading = True
                out.append(f"  {BEYOND_HEADING}")
            out.append("  " + row.line(width, number))
        if blocks:
            for i, group in enumerate(causes):
                out.append(
                    cause_text(
                        group,
                        i + 1,
                        self.target,
                        backend,
                        timeout=self.timeout,
                        rank_memory=self.rank_memory,
                        case_files=self.database is not None,
                    )
                )
        return "\n".join(out)

    def _failure_dicts(self, backend: str) -> list[dict]:
        """Each failure's dict; with the verdict table, in the order of its causes (``causes``),
        each with its row and its cause's number."""

        def one(f: PropertyFailure) -> dict:
            return f.to_dict(
                self.target, backend, timeout=self.timeout, rank_memory=self.rank_memory
            )

        if not self.rows:
            return [one(f) for f in self.failures]
        return [
            {**one(f), "row": f.row, "cause": n + 1}
            for n, group in enumerate(self.causes())
            for f in group
        ]

    def to_dict(self, backend: str = "gloo") -> dict:
        failures = self._failure_dicts(backend)
        return {
            "rows": [r.to_dict() for r in self.rows],
            "target": self.target.name,
            "path": self.target.path,
            "kind": self.target.kind,
            "passed": self.passed,
            "verdict": self.verdict,
            "rows_not_reached": self.not_reached,
            "first_failure_at_case": None if self.passed else self.examples,
            "cases_run": self.cases_run,
            "seconds": round(self.seconds, 3),
            "world_sizes": list(self.world_sizes),
            "worst_relative_error": self.worst_ratio,
            "worst_float64_bound_ratio": self.worst_bound,
            "failed_properties": [f["property"] for f in failures],
            "failures": failures,
            "notes": list(self.notes),
            "database": None
            if self.database is None
            else {
                "path": self.database,
                "replayed": self.replayed,
                "dropped": self.dropped,
                "saved": self.saved,
            },
        }


def _count(n: int, noun: str) -> str:
    """``n`` and ``noun``, plural unless ``n`` is 1: "1 case", "3 cases"."""
    return f"{n} {noun}" + ("" if n == 1 else "s")


def case_report(
    target, result: CaseResult, *, timeout: float | None = None, rank_memory: float | None = None
) -> CheckReport:
    """The report of one given case (``paracheck check --case``): every property it breaks, as is."""
    failures = [
        PropertyFailure(
            p, result, None, True, 0, None, [], shrunk=False, own=own_fragments(target.path)
        )
        for p in order(result.failed_properties)
    ]
    return CheckReport(
        target,
        result.ok,
        1,
        result.seconds,
        failures,
        result.worst_ratio,
        (result.case.world_size,),
        # A case the target declares out of its interface is not run: say so, never a bare pass.
        [f"not supported, not run: {result.extra['skipped']}"]
        if (result.extra or {}).get("skipped")
        else [],
        cases_run=1,
        timeout=timeout,
        rank_memory=rank_memory,
    )
