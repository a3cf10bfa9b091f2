"""Which row a failure of the verdict table belongs to, and whether it is a cause not yet known
(Note [Finding every cause] in ``paracheck.check.table``): a failure's case run again without
the features of its row (or some of them), and the row of what still fails the same way."""

from __future__ import annotations

import time

from paracheck.check.features import (
    case_features,
    closure,
    optional_features,
    without_all,
)
from paracheck.check.search import BudgetSpent
from paracheck.check.shared_search import _Search as Search
from paracheck.check.verdict import (
    RowVerdict,
    by_row,
    cause_key,
    cause_keys,
    cause_of,
    reading_of,
    readings,
    same_cause,
)

__all__ = [
    "ALL",
    "attribute",
    "fails_same",
    "is_new",
    "new_reading",
    "row_features",
    "row_keeps",
    "row_of",
]

ALL = "all features"

# The cases a new cause's attribution runs at most, and the seconds past the budget it may take.
_ATTRIBUTION_RUNS = 8
_ATTRIBUTION_GRACE = 10.0


def row_features(row: RowVerdict) -> tuple[str, ...]:
    """The optional features a row's cases all have (none for the core and the whole contract)."""
    return (row.feature,) if row.feature is not None else row.pair


def row_keeps(planned) -> dict[str, set[str]]:
    """Each searched row's name -> the optional features its cases may have."""
    every = set(optional_features())
    return {row.name: every - set(off) for row, off in planned if off is not None}


def row_of(case, planned) -> str:
    """The row a case belongs to: the searched row with the fewest optional features that allows
    all of the case's (the core, one feature's, a pair's), or the whole contract's."""
    have = case_features(case) & set(optional_features())
    keeps = row_keeps(planned)
    fits = [(len(keep), name) for name, keep in keeps.items() if have <= keep and name != ALL]
    if not fits:
        return ALL if ALL in keeps else "core"
    return min(fits)[1]


def _quiet_run(search: Search, case):
    """``case`` run (or read from the cache) without changing the checker's last result, which
    the search in progress compares (Note [A cause searched by its property's name])."""
    checker = search.checker
    last = checker.last
    try:
        return checker.run(case)
    finally:
        checker.last = last


def fails_same(search: Search, prop: str, again, key: tuple):
    """The reading of ``again`` (``readings`` in ``paracheck.check.verdict``) that fails with
    the cause ``key`` (of ``prop``), or None: stuck ranks whether the rank died or hung this
    time (Note [Causes, not properties])."""
    props = ("hang", "died") if key[0] == "stuck" else (prop,)
    return next(
        (r for p in props for r in [reading_of(p, again, key, search.own)] if r is not None),
        None,
    )


def _groups_kept(case, simpler) -> bool:
    """Whether removing features from ``case`` left its optimizer's groups as they were (as
    many, added at the same steps): a removal that drops a group (all its parameters were the
    feature's: an unused branch) or its late addition takes away what may be the bug's trigger,
    and the case passing without the feature then says nothing of the feature."""
    a, b = case.optimizer.groups, simpler.optimizer.groups
    return len(a) == len(b) and [g.add_at_step for g in a] == [g.add_at_step for g in b]


def _tensor(result, prop: str):
    d = result.divergence_of(prop)
    return None if d is None else d.name


def is_new(search: Search, prop, result, row, planned, *, run: bool = True) -> bool:
    """Whether ``result``'s failure of ``prop``, in ``row``'s search, is a cause not yet known
    (Note [Finding every cause]), in any of its readings (``new_reading``); ``run`` False:
    without running the cases it would take."""
    return new_reading(search, prop, result, row, planned, run=run) is not None


def new_reading(search: Search, prop, result, row, planned, *, run: bool = True):
    """The first reading of ``result`` (``readings`` in ``paracheck.check.verdict``: the other
    ways its first step diverged, Note [Every way a step diverged] in
    ``paracheck.check.properties.equivalence``) whose failure of ``prop`` is a cause not yet
    known, or None."""
    return next(
        (r for r in readings(result) if _is_new(search, prop, r, row, planned, run=run)), None
    )


def _is_new(search: Search, prop, result, row, planned, *, run: bool) -> bool:
    """Whether ``result``'s failure of ``prop``, read as it leads (its first divergence of
    ``prop``), is a cause not yet known."""
    key = cause_key(prop, result, search.own)
    homes = {f.row for f in search.failures if same_cause(cause_of(f), key)}
    if homes and (row.name in homes or row.name == "core" or not run or not by_row(key)):
        return False
    if homes and (row.name == ALL or homes & {"+" + f for f in row.pair}):
        # The rows of combinations look for bugs no single feature's row shows: a cause one of
        # their own features' rows (or, for the whole contract, any row) found is that cause,
        # whether or not the case without the other features fails exactly so.
        return False
    if row.name == "core" or not run:
        return True
    keeps = row_keeps(planned)
    have = case_features(result.case)
    for home in homes:
        keep = keeps.get(home)
        if keep is None or not (keep - search.declared) <= have:
            continue  # that cause's row has a feature this case lacks: not the same bug
        simpler = without_all(result.case, [f for f in optional_features() if f not in keep])
        if simpler == result.case or not _groups_kept(result.case, simpler):
            return False
        if fails_same(search, prop, _quiet_run(search, simpler), key) is not None:
            return False
    if key[0] != "diverged":
        return True
    # A feature that rescales what diverges (a clipped gradient, Adam's normalised step) turns a
    # known wrong value into what looks like a rounding: the case without the row's features
    # failing the property with a known cause is that cause. In a pair's row, so is the case
    # without one of the two failing with a known cause on the same tensor (a parameter a rank
    # did not use: its None, known, becomes a wrong value with accumulation).
    tries = []
    if key[2] in ("rounding", "value", ""):
        tries.append((closure(set(row_features(row)) or set(optional_features())), False))
    tries += [(closure({f}), True) for f in row.pair]
    for mine, same_tensor in tries:
        simpler = without_all(result.case, mine)
        if simpler == result.case:
            continue
        if not same_tensor and not _groups_kept(result.case, simpler):
            # The removal says nothing: a known cause of the property, diverging so, is this.
            if any(cause_of(f)[:2] == key[:2] for f in search.failures):
                return False
            continue
        again = _quiet_run(search, simpler)
        if prop not in again.failed_properties:
            continue
        if same_tensor and _tensor(again, prop) != _tensor(result, prop):
            continue
        known = cause_keys(prop, again, search.own)
        if any(same_cause(cause_of(f), k) for f in search.failures for k in known):
            return False
    return True


def attribute(search: Search, prop: str, result, row: RowVerdict, planned):
    """The row a new cause found in ``row`` belongs to, and its simplest case: the case's
    optional features removed while it still fails ``prop`` the same way (at most
    ``_ATTRIBUTION_RUNS`` cases; Note [Finding every cause])."""
    if row.name == "core":
        return row.name, result
    key = cause_key(prop, result, search.own)
    tries = 0
    # A few cases past the budget: a failure filed under a feature it does not need (its case
    # left as found when the budget ran out while it was shrunk) misleads more than it costs.
    checker, deadline = search.checker, search.checker.deadline
    if deadline is not None:
        checker.deadline = max(deadline, time.monotonic() + _ATTRIBUTION_GRACE)
    try:
        while tries < _ATTRIBUTION_RUNS:
            have = [
                f
                for f in optional_features()
                if f in case_features(result.case) and f not in search.declared
            ]
            if not have:
                break
            tries_before = tries
            candidates = [without_all(result.case, closure(have))] if len(have) > 1 else []
            candidates += [without_all(result.case, closure({f})) for f in reversed(have)]
            for simpler in candidates:
                if simpler == result.case or tries >= _ATTRIBUTION_RUNS:
                    continue
                tries += 1
                again = fails_same(search, prop, _quiet_run(search, simpler), key)
                if again is not None:
                    result = again
                    break
            else:
                break
            if tries == tries_before:
                break
    except BudgetSpent:
        pass  # what was found so far
    finally:
        checker.deadline = deadline
    return row_of(result.case, planned), result
