"""The verdict table of one target: one search per row, every row filled whatever the others
found, within a time budget.

Note [The verdict table]
    A check that searched every case its contract draws at once showed the first failure of the
    broadest contract, most often behind a feature the target never promised (buffers, a
    parameter used on some ranks only, a state reload), and every bug behind it stayed hidden.
    So the cases are searched by rows: the core (no optional feature: ``optional_features``, what
    some contract leaves undrawn), then each optional feature on its own on top of the core
    (``row_off``), then the pairs of features a bug may need together (``PAIRS``), then every
    feature the contract draws together (the search of the whole contract, same cases as
    ``CheckSettings(table=False)``). The rows within the target's contract (the one named, else
    the CS336 handout's for the kinds with its interfaces: ``beyond_contract``) come first, and
    those beyond it after, under their own heading; their causes are printed and numbered as
    found (Note [Numbered once, as printed]), and the summary counts both. Each row searches for
    causes of failure no earlier row found (Note [Finding every cause]); a row whose cases break
    only causes found earlier fails "as above". A feature row draws only cases that have its feature (a filter: a kind that
    never draws it makes the row "not drawn"); a feature turned off by the contract or
    ``--features`` is "not drawn", one the target's interface cannot take is "not supported"
    (``paracheck.check.interfaces``). A kind may name cases its core row runs first, as they are,
    before its search (``Kind.first_cases``: Note [A partition by count] in
    ``paracheck.strategies._sharding``): a bug the search rarely draws, found in the first case.

    Every case runs once (the checker caches results), so rows share the cost of the cases they
    share. The budget (``CheckSettings.budget``) covers the whole table: the saved and given
    cases run first whatever it is, then past it no new case runs (``BudgetSpent``), a failure
    being shrunk is reported as found so far, and the rows not reached say so. A row beyond the
    contract gets at most an equal share of what is left among those rows (``_row_deadline``), so
    that one row whose cases crash ranks, each a restart, cannot starve the rows after it. A
    Ctrl-C or SIGTERM ends the table the same way, and the report of what was found goes with
    the exception (``KeyboardInterrupt.report``) for the command to print.
"""

from __future__ import annotations

import dataclasses
import time

from hypothesis.errors import Unsatisfiable

from paracheck.check.attribution import ALL, attribute, is_new, new_reading, row_features, row_of
from paracheck.check.diagnose import cuda_only_call, stubbable_cuda_call
from paracheck.check.feature_choice import parse_features
from paracheck.check.features import (
    CONTRACTS,
    PAIRS,
    beyond_contract,
    case_features,
    feature,
    optional_features,
    row_off,
    unpromised_properties,
    without_all,
)
from paracheck.check.kinds import KINDS
from paracheck.check.properties.compiled import compiling_seconds
from paracheck.check.report import CheckReport, order
from paracheck.check.search import BudgetSpent, CauseName
from paracheck.check.shared_search import _Search
from paracheck.check.verdict import RowVerdict, cause_keys, cause_of, readings, same_cause
from paracheck.world import PoolLost

__all__ = ["fill_table", "plan_rows"]


def plan_rows(search: _Search) -> list[tuple[RowVerdict, tuple[str, ...] | None]]:
    """The rows of ``search``'s table, each with the features its cases never have (None: a row
    not searched, its status already said): the rows within the target's contract first, those
    beyond it after (``beyond_contract``)."""
    s, declared = search.settings, search.declared
    removed = parse_features(s.features or ()).removed  # parsed by the plan: as it is
    beyond = beyond_contract(search.target.kind, s.contract)

    def off_of(name):
        return tuple(f for f in row_off(name, search.off) if f not in declared)

    rows: list[tuple[RowVerdict, tuple[str, ...] | None]] = [
        (RowVerdict("core", None), off_of(None))
    ]
    searched: list[str] = []
    for name in optional_features():
        if name in declared:
            continue  # the target's declaration: in every case (Note [A loop's own precision])
        row = RowVerdict("+" + name, name, beyond=name in beyond)
        why = search.unsupported.get(name)
        if why is not None:
            row.status, row.why = "not supported", f"by the target's interface: {why}"
            rows.append((row, None))
            continue
        if name in search.off:
            row.status = "not drawn"
            if name in removed:
                row.why = f"--features -{name}"
            elif name in CONTRACTS[s.contract].off:
                row.why = f"--contract {s.contract}"
            elif name in search.off_at_precision:
                row.why = search.off_at_precision[name]
            elif name in KINDS[search.target.kind].never_draws:
                row.why = f"the {search.target.kind} kind does not draw it"
            else:
                row.why = "it needs a feature not drawn"
            rows.append((row, None))
            continue
        rows.append((row, off_of(name)))
        searched.append(name)
    for pair in PAIRS:
        if all(name in searched for name in pair):
            name = "+" + "+".join(pair)
            row = RowVerdict(name, None, beyond=any(f in beyond for f in pair), pair=pair)
            rows.append((row, off_of(pair)))
    if searched:
        rows.append((RowVerdict(ALL, None, beyond=any(f in beyond for f in searched)), search.off))
    rows.sort(key=lambda planned: planned[0].beyond)  # stable: the table's order within each
    return rows


def _by_name(planned, name: str) -> RowVerdict:
    return next(row for row, _ in planned if row.name == name)


def fill_table(search: _Search, explicit=()) -> CheckReport:
    """Search ``search``'s target row by row (Note [The verdict table]) and report the table."""
    s, checker = search.settings, search.checker
    planned = plan_rows(search)
    rows = [row for row, _ in planned]
    shown = getattr(search, "on_row", None) or (lambda row, i, n: None)

    def on_row(row, i, n):
        row.shown = True
        shown(row, i, n)

    budget = s.budget if s.budget else None
    current: list[RowVerdict] = []
    held: list = []
    announce = search.on_failure
    try:
        _replay(search, explicit, planned, held)
        search.on_failure = _holding_unpromised(search, planned, held, announce)
        deadline = None if budget is None else search.t0 + budget
        checker.deadline = deadline
        for i, (row, off) in enumerate(planned):
            if row.beyond:
                search.on_failure = announce
                _release(search, held)
            if off is None:
                on_row(row, i, len(rows))
                continue
            if s.first_failure and search.failures:
                row.why = "stopped at the first failing row (--first-failure)"
            elif deadline is not None and time.monotonic() > deadline:
                row.why = f"the budget of {budget:g} s ran out (--budget)"
            else:
                checker.deadline = _row_deadline(row, planned[i:], deadline)
                _stub_cuda_after(search, row)  # a saved case may have shown the call already
                current[:] = [row]
                share = None
                if checker.deadline is not None and checker.deadline < deadline:
                    share = checker.deadline - time.monotonic()
                _search_row(search, row, off, i, len(rows), planned, share)
                current.clear()
                checker.deadline = deadline
            _fill_unsearched(search, row)
            on_row(row, i, len(rows))
        _release(search, held)
    except PoolLost as lost:  # Note [A lost pool]: the rows found so far, and the one line
        for row in rows:
            if row.status == "not reached" and not row.why:
                row.why = "the attached pool was lost"
        search.stopped_by(lost)
    except KeyboardInterrupt as exc:
        search.on_failure = announce
        _release(search, held)
        how = "terminated (SIGTERM)" if type(exc).__name__ == "Terminated" else "interrupted"
        if current:
            row = current[0]
            hit = getattr(exc, "hit", None)
            reading = None
            if hit is not None:
                reading = new_reading(search, hit.prop, hit.result, row, planned, run=False)
            if reading is not None:
                hit = dataclasses.replace(hit, result=reading)
                _add_own(row, search.finish(hit, row=row.name))
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
        search.on_failure = announce
    _release(search, held)
    for row in rows:
        _fill_unsearched(search, row)
    return search.report(
        len(checker.cache),
        rows=rows,
        unpromised=unpromised_properties(search.target.kind, s.contract),
    )


def _fill_unsearched(search: _Search, row: RowVerdict) -> None:
    """A row not searched whose saved or given cases failed: FAIL with those causes."""
    mine = [f for f in search.failures if f.row == row.name]
    if row.status == "not reached" and mine:
        row.status, row.failure, row.more = "FAIL", mine[0], mine[1:]


# Note [Numbered once, as printed]
#   A cause is numbered when it is first printed (``on_failure``, as the table streams), and the
#   table printed at the end keeps those numbers: the causes in the order found. So that the
#   contract's causes come first, a cause a saved or given case shows beyond the contract (they
#   run before any row) is held back and printed when the first row beyond the contract starts
#   (``_replay``, ``_release``), and so is a cause of a row within the contract seen through a
#   property the contract does not promise (``_holding_unpromised``: a CS336 sharded optimizer's
#   empty ``state_dict()`` fails ``optimizer-state`` in the core row, and was printed before the
#   wrong updates the handout's cases show); the summary counts it beyond the contract. A cause
#   found in a later row but filed under a row printed already (it fails the same way without the
#   later row's features) changes that row: the row is printed again, saying where its new cause
#   was found (``_file``); a row printed PASS otherwise stays PASS.


def _replay(search: _Search, explicit, planned, held: list) -> None:
    """The saved and given cases, run whatever the budget (few, and the likeliest to fail), each
    failure filed under its row; those of rows beyond the contract go to ``held``, not printed
    yet (Note [Numbered once, as printed])."""
    announce = search.on_failure
    search.on_failure = _holding_unpromised(search, planned, held, announce, rows=True)
    try:
        search.replay(
            explicit,
            lambda case: row_of(case, planned),
            lambda prop, result: attribute(
                search, prop, result, _by_name(planned, row_of(result.case, planned)), planned
            ),
        )
    finally:
        search.on_failure = announce


def _holding_unpromised(search: _Search, planned, held: list, announce, *, rows: bool = False):
    """``announce``, but a cause seen through a property the contract does not promise
    (``unpromised_properties``: an empty ``state_dict()`` of a CS336 sharded optimizer) goes to
    ``held``, printed when the first row beyond the contract starts (Note [Numbered once, as
    printed]); with ``rows``, so does every cause filed under a row beyond the contract."""
    unpromised = unpromised_properties(search.target.kind, search.settings.contract)

    def hold(failure) -> None:
        beyond = _by_name(planned, failure.row).beyond
        if failure.property in unpromised and not beyond or rows and beyond:
            held.append(failure)
        else:
            announce(failure)

    return hold


def _release(search: _Search, held: list) -> None:
    """The held causes printed now, and moved to the end of the failures found (their order is
    their numbers: Note [Numbered once, as printed])."""
    if not held:
        return
    search.failures[:] = [f for f in search.failures if all(f is not h for h in held)] + held
    for failure in held:
        search.on_failure(failure)
    held.clear()


# A row beyond the contract may take at most this part of the budget left when it starts (or
# an equal share among the rows beyond it still to search, where more): most rows take a few
# seconds, and an equal share of 90 s among 17 rows cut a correct design's slower row short; one
# row crashing ranks case after case took 44-86 s of the 90 s and no row after it was reached.
_SHARE = 0.25


def _row_deadline(row: RowVerdict, rest, deadline: float | None) -> float | None:
    """The deadline of ``row``'s search: the table's, and for a row beyond the target's contract
    at most its share of what is left (``_SHARE``; the contract's rows come first:
    ``plan_rows``), so that no one of them starves the others."""
    if deadline is None or not row.beyond:
        return deadline
    left = sum(1 for r, off in rest if off is not None and r.beyond)
    now = time.monotonic()
    remaining = max(0.0, deadline - now)
    return min(deadline, now + remaining * max(_SHARE, 1 / max(1, left)))


def _stub_cuda_after(search: _Search, row: RowVerdict) -> None:
    """Where a failure found so far (in ``row``'s search, or a saved case replayed before it) is
    the target calling a CUDA timing or NVTX function on ranks without CUDA, the rest of the
    table runs with those calls stubbed (``--stub-cuda-timing``): each row would fail on the same
    call first, and the bugs behind it would never be reached. Said in a note; the cached
    failures the call caused are run again."""
    target = search.target
    if target.stub_cuda_timing or getattr(search.world, "backend", "gloo") == "nccl":
        return
    for f in search.failures:
        err = f.result.error
        if f.property != "raised" or err is None:
            continue
        report = err.report()
        if not stubbable_cuda_call(report):
            continue
        stubbed = dataclasses.replace(target, stub_cuda_timing=True)
        search.target = search.checker.target = stubbed
        for key in [k for k, r in search.checker.cache.items() if r.error is not None]:
            del search.checker.cache[key]
        search.notes.append(
            f"{(cuda_only_call(report) or '').split(';')[0]}: from row {row.name} on, the cases ran with --stub-cuda-timing "
            "(CUDA timing and NVTX calls are no-ops), so that the bugs behind it are reached"
        )
        return


# Note [Finding every cause]
#   Each row searches for cases whose failure is a cause not yet known (Note [Causes, not
#   properties] in ``paracheck.check.verdict``), shrinks it keeping it new (Note [A cause
#   searched by its property's name] in ``paracheck.check.search``), files it, and searches on
#   (at most ``_CAUSES_PER_ROW`` causes a row; the derandomised sequence goes on where it stopped,
#   its cases cached). A failure of a feature row whose cause is known in another row is that
#   cause only where the case without the row's features (as that row draws it) still fails the
#   same way; otherwise the feature adds a bug of its own (a core that sums gradients, and an
#   accumulation that drops a micro-batch: both diverge first on the same gradient). Before a
#   new cause is filed it is attributed (``_attribute``): the optional features of its shrunk
#   case are removed while it still fails the same way, and it is filed under the row of what
#   remains (the core, mostly), its case the simpler one. A row whose cases crash ranks with
#   causes known (each costing a restart of the ranks) stops after ``_CRASHES`` of them.
_CAUSES_PER_ROW = 4
_CRASHES = 3


class _RowCrashing(BaseException):
    """The row's cases crashed ranks ``_CRASHES`` times with causes known: the row stops with
    what it found (a BaseException, so that Hypothesis ends the search at once)."""


def _add_own(row: RowVerdict, failure) -> None:
    if row.failure is None:
        row.failure = failure
    else:
        row.more.append(failure)
    row.status = "FAIL"


def _file(search: _Search, hit, row: RowVerdict, planned) -> None:
    """A new cause found in ``row``'s search, attributed (``_attribute``) and filed in its row."""
    if len(readings(hit.result)) > 1:  # the reading that is new (Note [Every way a step diverged])
        reading = new_reading(search, hit.prop, hit.result, row, planned)
        if reading is not None:
            hit = dataclasses.replace(hit, result=reading)
    home, result = attribute(search, hit.prop, hit.result, row, planned)
    if result is not hit.result:
        gone = sorted(case_features(hit.result.case) - case_features(result.case))
        hit = dataclasses.replace(
            hit,
            result=result,
            notes=hit.notes
            + [
                f"found in row {row.name}; it fails the same way without "
                f"{', '.join(gone)}, so it is filed under {home} with that case"
            ],
        )
    failure = search.finish(hit, row=home)
    target = _by_name(planned, home)
    _add_own(target, failure)
    if target is not row:
        row.also.append(failure)
        if target.shown:
            # Printed already: printed again, saying why (Note [Numbered once, as printed]).
            later = f"a cause found later, in row {row.name}, filed here"
            target.why = f"{target.why}; {later}" if target.why else later
            on_row = getattr(search, "on_row", None)
            if on_row is not None:
                index = next(i for i, (r, _) in enumerate(planned) if r is target)
                on_row(target, index, len(planned))


# Cases drawn for a feature row before the feature is taken as never drawn by the target's kind:
# Hypothesis gives up on a filter no draw passes only after about a thousand draws (20 s here).
_TRIES = 60


# The feature rows found not drawn, by kind, strategy (its repr: the kind's strategy and its
# arguments), seed and features: a seeded search draws the same cases for every target whose
# strategy is the same, so a check of several targets of one kind (the main job) draws a row's
# ``_TRIES`` cases once; drawing them took 0.3-2.4 s a row, 20% of the main job.
_NOT_DRAWN: set[tuple] = set()


def _drawn_key(search: _Search, features: tuple[str, ...], off) -> tuple | None:
    """``_NOT_DRAWN``'s key of a feature row whose cases never have ``off`` (None: not kept, for
    the core and all-features rows, a search at random, or a strategy whose repr may not say all
    it draws: a lambda)."""
    seed = search.plan.seed
    text = repr(search.drawn)
    if not features or seed is None or "lambda" in text:
        return None
    return (search.target.kind, text, seed, features, tuple(off))


class _NeverDrawn(BaseException):
    """None of the first ``_TRIES`` cases drawn has the row's feature: a BaseException, so that
    Hypothesis ends the search at once."""


def _drawn_with(names: tuple[str, ...]):
    """A filter keeping the drawn cases with every feature of ``names``, raising ``_NeverDrawn``
    where none of the first ``_TRIES`` has them."""
    checks, tries = [feature(name).has for name in names], [0]

    def keep(case) -> bool:
        if all(has(case) for has in checks):
            tries[0] = -1  # drawn: never give up
            return True
        if tries[0] >= 0:
            tries[0] += 1
            if tries[0] >= _TRIES:
                raise _NeverDrawn()
        return False

    return keep


def _search_row(
    search: _Search, row: RowVerdict, off, index: int, total: int, planned, share=None
) -> None:
    """Search one row for causes not yet known (Note [Finding every cause]) and fill it;
    ``share``: the seconds of the budget it may take, where less than the table's rest."""
    s, checker = search.settings, search.checker
    features = row_features(row)
    key = _drawn_key(search, features, off)
    if key is not None and key in _NOT_DRAWN:
        row.status = "not drawn"
        row.why = f"the {search.target.kind} kind does not draw it (none of {_TRIES} cases had it)"
        return
    strategy = search.drawn
    if features:
        strategy = strategy.filter(_drawn_with(features))
    strategy = strategy.map(lambda c: without_all(c, off))
    if features:
        strategy = strategy.filter(lambda c: all(feature(f).has(c) for f in features))
    examples = search.plan.examples
    examples = examples if not features else max(5, examples // 4)
    checker.row = f"row {row.name} ({index + 1}/{total}), "
    checker.row_log = log = []
    ran_before = {id(r) for r in checker.cache.values()}  # compiled in an earlier row
    t0 = time.monotonic()
    before = len(search.failures)
    spent = crashing = False
    crashed: set[int] = set()

    def new(prop, result) -> bool:
        return is_new(search, prop, result, row, planned)

    def wanted(failed):
        result = checker.last
        for prop in order(failed):
            if new(prop, result):
                return CauseName(prop, lambda prop=prop: new(prop, checker.last))
        if result is not None and getattr(result.error, "kind", None) in ("died", "hung"):
            crashed.add(id(result))
            if len(crashed) >= _CRASHES:
                raise _RowCrashing()
        return None

    try:
        # The kind's cases built for a bug, each in the first row that draws all its features.
        for i, (why, case) in enumerate(search.first_cases):
            if i in search.first_run or case_features(case) & set(off):
                continue
            search.first_run.add(i)
            search.run_as_is(
                case, f"{why}, run first in this row as it is (not shrunk)", lambda _: row.name
            )
            before = len(search.failures)  # what it found is this row's, as a saved case's
        # A CUDA-only call diagnosed so far (in a saved, given or first case) is stubbed before
        # the search: every case would raise it first, and nothing behind it would be new.
        _stub_cuda_after(search, row)
        for _ in range(_CAUSES_PER_ROW):
            if s.first_failure and search.failures:
                break
            hit = checker.search(
                strategy,
                wanted,
                max_examples=examples,
                tag="new:0" if row.name == ALL else f"row:{row.name}",
                shrink_budget=search.budget,
            )
            if hit is None:
                break
            _file(search, hit, row, planned)
            _stub_cuda_after(search, row)  # then this row is searched again, stubbed
    except (Unsatisfiable, _NeverDrawn):
        if key is not None:
            _NOT_DRAWN.add(key)
        row.status = "not drawn"
        row.why = f"the {search.target.kind} kind does not draw it (none of {_TRIES} cases had it)"
        return
    except BudgetSpent:
        spent = True
    except _RowCrashing:
        crashing = True
    finally:
        checker.row_log = None
        checker.row = ""
        row.earlier = len({id(r) for r in log if id(r) in ran_before})
        row.cases = len({id(r) for r in log}) - row.earlier
        row.seconds = time.monotonic() - t0
        row.compiling = compiling_seconds(r for r in log if id(r) not in ran_before)
    # Failures of saved or given cases of this row, then the causes found in other rows that
    # this row's cases broke as well.
    for f in search.failures[:before]:
        if f.row == row.name and all(f is not g for g in row.own):
            _add_own(row, f)
    keys = {k for r in log for p in r.failed_properties for k in cause_keys(p, r, search.own)}
    seen = [cause_of(f) for f in row.own + row.also]
    for f in search.failures:
        key = cause_of(f)
        if any(same_cause(key, k) for k in keys) and not any(same_cause(key, k) for k in seen):
            seen.append(key)
            row.also.append(f)
    if spent and share is not None:
        spent_on = f"its share of the budget ({share:.1f} s of {s.budget:g} s)"
    else:
        spent_on = f"the budget of {s.budget:g} s" if s.budget else "the budget"
    if crashing:
        row.why = f"stopped after {_CRASHES} cases that crashed ranks with causes found already"
    elif spent:
        cases = f"{row.cases} case{'' if row.cases == 1 else 's'}"
        row.why = f"{spent_on} ran out after {cases} of this row"
    if row.failure is not None or row.also:
        row.status = "FAIL"
    elif features == ("reshard",) and log and all(_per_rank(r) for r in log):
        row.status = "not supported"
        row.why = (
            "by the target's state_dict(): each rank returns its own shard, which cannot be "
            "loaded at another world size (every resumed case said so)"
        )
    elif not spent:
        row.status = "PASS"
    _say_skipped(row, [r for r in log if id(r) not in ran_before], features)


def _say_skipped(row: RowVerdict, results, features) -> None:
    """A feature row whose cases were skipped says so (``CaseResult.extra["skipped"]``: a case
    torch cannot compile, a protocol the target does not offer): "not supported" where every one
    of them was, with the first reason, never a bare PASS; how many of them where some were."""
    skipped = [r.extra["skipped"] for r in results if (r.extra or {}).get("skipped")]
    if not features or not skipped or row.status not in ("PASS", "not reached"):
        return
    if len(skipped) == len(results) and row.status == "PASS":
        row.status = "not supported"
        row.why = f"every case of the row was skipped: {skipped[0]}"
        return
    said = f"{len(skipped)} of {len(results)} cases skipped: {skipped[0]}"
    row.why = f"{row.why}; {said}" if row.why else said


def _per_rank(result) -> bool:
    """Whether ``result``'s resumed case was not judged for per-rank state dicts (Note [Resuming
    at another world size] in ``paracheck.check.properties.reshard``)."""
    from paracheck.check.properties.reshard import PER_RANK_NOT_JUDGED

    return PER_RANK_NOT_JUDGED in (getattr(result, "extra", None) or {}).get("unjudged", "")
