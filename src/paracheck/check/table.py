"""The verdict table of one target: one search per row, every row filled whatever the others
found, within a time budget.

Note [The verdict table]
    A check that searched every case its contract draws at once showed the first failure of the
    broadest contract, most often behind a feature the target never promised (buffers, a
    parameter used on some ranks only, a state reload), and every bug behind it stayed hidden.
    So the cases are searched by rows: the core (no optional feature: ``optional_features``, what
    some contract leaves undrawn), then each optional feature on its own on top of the core
    (``row_off``), then every feature the contract draws together (the search of the whole
    contract, same cases as ``CheckSettings(table=False)``). Each row searches for a property no
    earlier row broke (Note [One search per property]) and shrinks the first it finds; a row whose
    cases break only properties found earlier fails "as above". A feature row draws only cases
    that have its feature (a filter: a kind that never draws it makes the row "not drawn"); a
    feature turned off by the contract or ``--features`` is "not drawn", one the target's
    interface cannot take is "not supported" (``paracheck.check.interface``). A kind may name
    cases its core row runs first, as they are, before its search (``Kind.first_cases``: Note [A
    partition by count] in ``paracheck.strategies._sharding``): a bug the search rarely draws,
    found in the first case.

    Every case runs once (the checker caches results), so rows share the cost of the cases they
    share. The budget (``CheckSettings.budget``) covers the whole table: the saved and given
    cases run first whatever it is, then past it no new case runs (``BudgetSpent``), a failure being shrunk is reported as found so far, and the rows not
    reached say so. A Ctrl-C or SIGTERM ends the table the same way, and the report of what was
    found goes with the exception (``KeyboardInterrupt.report``) for the command to print.
"""

from __future__ import annotations

import time

from hypothesis.errors import Unsatisfiable

from paracheck.check.features import (
    CONTRACTS,
    feature,
    optional_features,
    parse_features,
    row_off,
    without_all,
)
from paracheck.check.interface import unsupported
from paracheck.check.report import CheckReport, order
from paracheck.check.search import BudgetSpent
from paracheck.check.shared_search import _Search
from paracheck.check.verdict import RowVerdict
from paracheck.world import PoolLost

__all__ = ["fill_table", "plan_rows"]

ALL = "all features"


def plan_rows(search: _Search) -> list[tuple[RowVerdict, tuple[str, ...] | None]]:
    """The rows of ``search``'s table, each with the features its cases never have (None: a row
    not searched, its status already said)."""
    s, declared = search.settings, search.declared
    removed = {name for name, drawn in parse_features(s.features or ()) if not drawn}

    def off_of(name):
        return tuple(f for f in row_off(name, search.off) if f not in declared)

    rows: list[tuple[RowVerdict, tuple[str, ...] | None]] = [
        (RowVerdict("core", None), off_of(None))
    ]
    searched = 0
    for name in optional_features():
        if name in declared:
            continue  # the target's declaration: in every case (Note [A loop's own precision])
        row = RowVerdict("+" + name, name)
        if name in search.off:
            row.status = "not drawn"
            if name in removed:
                row.why = f"--features -{name}"
            elif name in CONTRACTS[s.contract].off:
                row.why = f"--contract {s.contract}"
            else:
                row.why = "it needs a feature not drawn"
            rows.append((row, None))
            continue
        why = unsupported(search.target, name)
        if why is not None:
            row.status, row.why = "not supported", f"by the target's interface: {why}"
            rows.append((row, None))
            continue
        rows.append((row, off_of(name)))
        searched += 1
    if searched:
        rows.append((RowVerdict(ALL, None), search.off))
    return rows


def _row_of(case, planned) -> str:
    """The row a case given or replayed belongs to: the core, its one optional feature's, or all."""
    from paracheck.check.features import case_features

    have = case_features(case) & set(optional_features())
    if not have:
        return "core"
    for row, off in planned:
        if row.feature in have and off is not None and not (have & set(off)):
            return row.name
    return ALL


def fill_table(search: _Search, explicit=()) -> CheckReport:
    """Search ``search``'s target row by row (Note [The verdict table]) and report the table."""
    s, checker = search.settings, search.checker
    planned = plan_rows(search)
    rows = [row for row, _ in planned]
    on_row = getattr(search, "on_row", None) or (lambda row, i, n: None)
    budget = s.budget if s.budget else None
    current: list[RowVerdict] = []
    try:
        # The saved and given cases run whatever the budget: few, and the likeliest to fail.
        search.replay(explicit, lambda case: _row_of(case, planned))
        checker.deadline = None if budget is None else search.t0 + budget
        for i, (row, off) in enumerate(planned):
            if off is None:
                on_row(row, i, len(rows))
                continue
            if s.first_failure and search.failures:
                row.why = "stopped at the first failing row (--first-failure)"
            elif checker.deadline is not None and time.monotonic() > checker.deadline:
                row.why = f"the budget of {budget:g} s ran out (--budget)"
            else:
                current[:] = [row]
                _search_row(search, row, off, i, len(rows))
                current.clear()
            on_row(row, i, len(rows))
    except PoolLost as lost:  # Note [A lost pool]: the rows found so far, and the one line
        for row in rows:
            if row.status == "not reached" and not row.why:
                row.why = "the attached pool was lost"
        search.stopped_by(lost)
    except KeyboardInterrupt as exc:
        how = "terminated (SIGTERM)" if type(exc).__name__ == "Terminated" else "interrupted"
        if current:
            row = current[0]
            hit = getattr(exc, "hit", None)
            if hit is not None and hit.prop not in search.known:
                row.failure = search.finish(hit, row=row.name)
                row.status = "FAIL"
            else:
                row.why = f"{how} while this row was searched"
        for row in rows:
            if row.status == "not reached" and not row.why:
                row.why = how
        exc.report = search.report(  # type: ignore[attr-defined]
            len(checker.cache), rows=rows, stopped=f"{how}: the rows below are those it reached"
        )
        raise
    finally:
        checker.deadline = None
    for row in rows:  # a row not searched whose saved or given case failed
        mine = [f for f in search.failures if f.row == row.name]
        if row.status == "not reached" and mine:
            row.status, row.failure, row.also = "FAIL", mine[0], mine[1:]
    return search.report(len(checker.cache), rows=rows)


# Cases drawn for a feature row before the feature is taken as never drawn by the target's kind:
# Hypothesis gives up on a filter no draw passes only after about a thousand draws (20 s here).
_TRIES = 60


class _NeverDrawn(BaseException):
    """None of the first ``_TRIES`` cases drawn has the row's feature: a BaseException, so that
    Hypothesis ends the search at once."""


def _drawn_with(name: str):
    """A filter keeping the drawn cases with feature ``name``, raising ``_NeverDrawn`` where none of
    the first ``_TRIES`` has it."""
    has, tries = feature(name).has, [0]

    def keep(case) -> bool:
        if has(case):
            tries[0] = -1  # drawn: never give up
            return True
        if tries[0] >= 0:
            tries[0] += 1
            if tries[0] >= _TRIES:
                raise _NeverDrawn()
        return False

    return keep


def _search_row(search: _Search, row: RowVerdict, off, index: int, total: int) -> None:
    s, checker = search.settings, search.checker
    strategy = search.drawn
    if row.feature is not None:
        strategy = strategy.filter(_drawn_with(row.feature))
    strategy = strategy.map(lambda c: without_all(c, off))
    if row.feature is not None:
        strategy = strategy.filter(feature(row.feature).has)
    examples = s.examples if row.feature is None else max(5, s.examples // 4)
    checker.row = f"row {row.name} ({index + 1}/{total}), "
    checker.row_log = log = []
    t0 = time.monotonic()
    before = len(search.failures)
    spent = False
    try:
        hit = None
        if row.name == "core":
            for why, case in search.first_cases:
                search.run_as_is(
                    without_all(case, off),
                    f"{why}, run first in this row as it is (not shrunk)",
                    lambda _: row.name,
                )
                before = len(search.failures)  # what it found is this row's, as a saved case's
        if not (s.first_failure and search.failures):
            hit = checker.search(
                strategy,
                lambda failed: next((p for p in order(failed) if p not in search.known), None),
                max_examples=examples,
                tag="new:0" if row.name == ALL else f"row:{row.name}",
                shrink_budget=search.budget,
            )
    except (Unsatisfiable, _NeverDrawn):
        row.status = "not drawn"
        row.why = f"the {search.target.kind} kind does not draw it (none of {_TRIES} cases had it)"
        return
    except BudgetSpent:
        hit, spent = None, True
    finally:
        checker.row_log = None
        checker.row = ""
        row.cases = len({id(r) for r in log})
        row.seconds = time.monotonic() - t0
    if hit is not None:
        row.failure = search.finish(hit, row=row.name)
    # Failures of saved or given cases of this row, then the properties found in earlier rows
    # that this row's cases broke as well.
    mine = [f for f in search.failures[:before] if f.row == row.name]
    if row.failure is None and mine:
        row.failure, mine = mine[0], mine[1:]
    broken = order({p for r in log for p in r.failed_properties})
    by_property = {}
    for f in search.failures:
        by_property.setdefault(f.property, f)
    also = [by_property[p] for p in broken if p in by_property]
    seen = {id(row.failure)}
    row.also = []
    for f in also + mine:
        if id(f) not in seen:
            seen.add(id(f))
            row.also.append(f)
    if row.failure is not None or row.also:
        row.status = "FAIL"
    elif spent:
        row.why = f"the budget of {s.budget:g} s ran out after {row.cases} cases of this row"
    else:
        row.status = "PASS"
