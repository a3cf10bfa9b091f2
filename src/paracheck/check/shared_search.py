"""What every search of one check shares (``_Search``): the target's cases, the checker of
``paracheck.check.search`` that runs them, the failures found so far and their report; and which
saved or given cases are the target's."""

from __future__ import annotations

import time

from hypothesis import HealthCheck, Phase, Verbosity
from hypothesis import strategies as st

from paracheck.cases import Case
from paracheck.check.database import CaseDatabase
from paracheck.check.features import (
    CONTRACTS,
    case_features,
    closure,
    feature,
    without,
    without_all,
)
from paracheck.check.kinds import KINDS
from paracheck.check.plan import DTYPE_PRECISIONS, CheckPlan, plan_target
from paracheck.check.report import (
    CheckReport,
    PropertyFailure,
    order,
    own_fragments,
)
from paracheck.check.run import CaseResult
from paracheck.check.search import CaseTimeouts, _Checker, _Hit, declared_features, sequence_name
from paracheck.check.targets import load_object
from paracheck.check.verdict import cause_key, cause_of, readings, same_cause
from paracheck.strategies._core import precision_settings, world_size_draws
from paracheck.world import PoolLost

__all__ = ["DTYPE_PRECISIONS", "declared_mismatch"]


# The keywords of the older form ``check_target(target, world, world_sizes=..., ...)``: one search
# over the whole contract, stopping at the first failing property, as the selftest runs it.
class _Search:
    """What every search of one check shares: the target's cases, the checker that runs them (and
    caches their results), the failures found so far and how they are reported."""

    def __init__(self, target, world, settings, strategy, device_fn, progress, on_failure):
        # Decided once, by the plan (Note [One plan per check] in paracheck.check.plan).
        plan = settings if isinstance(settings, CheckPlan) else plan_target(settings, target)
        self.target, self.plan, self.settings = target, plan, plan.settings
        settings = plan.settings
        self.sizes = sizes = plan.world_sizes
        self.precision = precision = plan.precision
        self.declared = declared_features(target)
        self.off = off = plan.features_off
        self.unsupported = dict(plan.unsupported)
        self.off_at_precision = dict(plan.off_at_precision)
        database = plan.database
        if database is not None and not isinstance(database, CaseDatabase):
            database = CaseDatabase(database)
        self.database = database
        self.checked = plan.properties
        own_cases = strategy is None
        if strategy is None:
            # The kind's strategy (paracheck.check.kinds) draws the world size first, from `sizes`:
            # spread over the sizes, shrinking first toward two ranks, and no overridden draws
            # (which made duplicate examples). The sharding kinds draw more parameter groups and
            # late add_param_group calls (paracheck.strategies._sharding).
            options = {
                o: getattr(target, o)
                for o in KINDS[target.kind].options
                if getattr(target, o, None) is not None
            }
            strategy = load_object(KINDS[target.kind].strategy)(
                world_sizes=sizes, precision=precision, **options
            )
        else:
            # The world size is drawn first: drawn after a whole case, Hypothesis left it at its
            # simplest value (world size 1, no communication) in 21 of 40 derandomised examples.
            # Drawn as the kinds' strategies draw it (Note [Worlds that communicate first]).
            strategy = st.tuples(world_size_draws(sizes), strategy).map(
                lambda t: t[1].with_world_size(t[0])
            )
        self.drawn = strategy  # before the features turned off are removed
        # Mapped, not filtered: every draw is used. Only the features the strategy may draw: a map
        # adds a span that Hypothesis mutates after its first cases, so mapping away what the
        # kind never draws (``Kind.never_draws``) changed every derandomised sequence from its
        # twelfth case on while removing nothing. With nothing to remove the strategy, and so
        # every derandomised sequence, is the one it always was.
        drawn_off = mapped_off(off, KINDS[target.kind].never_draws if own_cases else ())
        if drawn_off:
            strategy = strategy.map(lambda c: without_all(c, drawn_off))
        self.strategy = strategy
        # The cases a check runs first (``Kind.first_cases``), with the kind's own cases only, and
        # only those this check would draw; ``first_run``: those the table has run.
        self.first_cases: list[tuple[str, Case]] = []
        first = KINDS[target.kind].first_cases
        if own_cases and first is not None:
            self.first_cases = [
                (why, case)
                for why, case in load_object(first)(world_sizes=sizes, precision=precision)
                # Built in the setting of ``precision``: only its sizes and features are asked.
                if _not_drawn(case, sizes, None, off) is None
                and declared_mismatch(case, target) is None
            ]
        self.first_run: set[int] = set()
        timeout = plan.timeout
        cap = min(timeout, world.timeout) if timeout is not None else world.timeout
        self.progress = progress or (lambda text: None)
        self.on_failure = on_failure or (lambda failure: None)
        # Hypothesis's database stays off: paracheck saves cases, not choices (Note [Saved cases]).
        cfg = dict(
            deadline=None,
            suppress_health_check=list(HealthCheck),
            database=None,
            print_blob=False,
            verbosity=Verbosity.quiet,
            phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],
        )
        seed = plan.seed
        if seed == 0:
            cfg["derandomize"] = True
        self.key = f"{target.path}|{target.kind}"  # the database's key: one target, one folder
        self.checker = _Checker(
            target,
            world,
            device_fn=device_fn,
            timeouts=CaseTimeouts(cap, floor=settings.timeout_floor),
            progress=self.progress,
            strategy_settings=cfg,
            key=f"{sequence_name(target.path)}|{target.kind}",
            seed=None if seed == 0 else seed,
            stepped_balance=CONTRACTS[settings.contract].stepped_balance,
        )
        self.world = world
        self.lost: PoolLost | None = None  # Note [A lost pool]
        self.t0 = time.monotonic()
        self.failures: list[PropertyFailure] = []
        self.known: set[str] = set()
        self.own = own_fragments(target.path)  # where the target's frames are
        self.first_at: int | None = None
        self.notes: list[str] = []
        self.replayed = self.dropped = 0

    def budget(self, prop: str):
        """The shrinking budget of a failure of ``prop``: hangs and dead ranks cost a timeout or a
        process start each, so their shrinking is bounded."""
        if getattr(self.world, "lost", None) is not None:
            return 0.0  # Note [A lost pool]: what was found is what is reported
        if prop in _COSTLY:
            return self.settings.hang_shrink_seconds
        return self.settings.shrink_seconds

    def finish(self, hit: _Hit, without_feature: str | None = None, row: str | None = None):
        s = self.settings
        # A hang's shrinking and labelling share one budget (Note [Hang timeouts]); a dead rank
        # costs a fork, and its labelling gets a budget of its own.
        shared = hit.prop == "hang" and hit.found_at is not None
        start = hit.found_at if shared else time.monotonic()
        deadline = start + s.hang_shrink_seconds if hit.prop in _COSTLY else None
        needs, complete = None, True
        if s.labels and not s.table:
            try:
                needs, complete = self.checker.needs(hit.prop, hit.result.case, deadline)
            except PoolLost as exc:  # Note [A lost pool]
                self.lost = exc
                self.checker.phase = "searching"
        extra = list(hit.notes)
        if not complete:
            extra.append("not every feature was tried: the time budget for hangs ran out")
        failure = PropertyFailure(
            hit.prop,
            hit.result,
            needs,
            hit.fully_shrunk,
            hit.found_after,
            without_feature,
            extra,
            shrunk=hit.shrunk,
            first=hit.first,
            own=self.own,
            kind=self.target.kind,
            row=row,
        )
        self.failures.append(failure)
        self.known.add(hit.prop)
        if self.first_at is None:
            self.first_at = hit.found_after + 1
        self.on_failure(failure)
        if self.lost is not None:
            raise self.lost
        return failure

    def is_known(self, prop: str, result: CaseResult, row: str | None = None) -> bool:
        """Whether ``result``'s failure of ``prop`` was found already: its property, without the
        verdict table; with it, its cause (Note [Causes, not properties] in
        ``paracheck.check.verdict``) in ``row`` (None: in no row, as far as can be told before
        the failure is attributed to one)."""
        if not self.settings.table:
            return prop in self.known
        key = cause_key(prop, result, self.own)
        return any(
            same_cause(cause_of(f), key) and (row is None or f.row == row) for f in self.failures
        )

    def run_as_is(self, case: Case, note: str, row=None, attribute=None) -> CaseResult:
        """``case`` run as it is, each failure not known yet reported under ``row(case)``, or
        where ``attribute(prop, result)`` says, with the case it gives: (row, result)."""
        result = self.checker.run(case)
        for prop in order(result.failed_properties):
            # Each reading of the case (Note [Every way a step diverged] in
            # paracheck.check.properties.equivalence), a cause of its own where not known.
            keys: list[tuple] = []
            for reading in readings(result) if self.settings.table else [result]:
                key = cause_key(prop, reading, self.own)
                if key in keys:
                    continue  # read the same way for this property
                keys.append(key)
                where, shown, notes = row(case) if row else None, reading, [note]
                if attribute is not None:
                    where, shown = attribute(prop, reading)
                if self.is_known(prop, shown, where):
                    continue
                if shown is not reading:
                    gone = sorted(case_features(case) - case_features(shown.case))
                    notes.append(
                        f"it fails the same way without {', '.join(gone)}: the case shown is "
                        f"without {'it' if len(gone) == 1 else 'them'}"
                    )
                self.finish(
                    _Hit(prop, shown, True, len(self.checker.cache) - 1, notes, shrunk=False),
                    row=where,
                )
        return result

    def replay(self, explicit, row=None, attribute=None) -> None:
        """The saved cases (Note [Saved cases]), then the ``explicit`` ones, each run as it is."""
        first_failure, database = self.settings.first_failure, self.database
        saved = database.cases(self.key) if database is not None else []
        kept: dict[str, int] = {}
        for entry in saved:
            if first_failure and self.failures:
                break
            if entry.case is None:
                database.delete(entry)
                self.notes.append(f"dropped a saved case that no longer loads: {entry.error}")
                continue
            # The target's own declaration first: it says more than the feature it turns off.
            why = declared_mismatch(entry.case, self.target) or _not_drawn(
                entry.case, self.sizes, self.precision, self.off
            )
            if why is not None:
                kept[why] = kept.get(why, 0) + 1
                continue
            result = self.run_as_is(
                entry.case,
                f"a saved case, replayed from {database.path} before the search (not shrunk again)",
                row,
                attribute,
            )
            self.replayed += 1
            if entry.property not in result.failed_properties and (
                entry.properties is None or entry.properties <= self.checked
            ):
                database.delete(entry)
                self.dropped += 1
        for why, n in kept.items():
            self.notes.append(f"{n} saved case{'s' if n > 1 else ''} kept, not replayed: {why}")
        for case in explicit:
            if first_failure and self.failures:
                break
            self.run_as_is(case, "a given case, not shrunk", row, attribute)

    def whole_contract(self, explicit) -> CheckReport:
        """One search over every case the contract draws (Note [One search per property])."""
        try:
            return self._whole_contract(explicit)
        except PoolLost as exc:  # Note [A lost pool]
            self.stopped_by(exc)
            return self.report(len(self.checker.cache))

    def stopped_by(self, lost: PoolLost) -> None:
        """The attached pool was lost: what was found is reported, with a note; with nothing
        found, ``lost`` is raised again (no verdict for this target: the caller says the pool is
        lost)."""
        self.lost = lost
        if not self.failures:
            raise lost
        self.notes.append(f"the check stopped here: {lost}")

    def _whole_contract(self, explicit) -> CheckReport:
        s, checker = self.settings, self.checker
        self.replay(explicit)
        for why, case in self.first_cases if s.first_cases else ():  # built for a bug, as is
            if s.first_failure and self.failures:
                break
            self.run_as_is(case, f"{why}, run first as it is (not shrunk)")
        # The first search also reports how many cases a passing target ran.
        passes = 0
        while not (s.first_failure and self.failures):
            hit = checker.search(
                self.strategy,
                lambda failed: next((p for p in order(failed) if p not in self.known), None),
                max_examples=self.plan.examples,
                tag=f"new:{passes}",
                shrink_budget=self.budget,
            )
            passes += 1
            if hit is None:
                break
            self.finish(hit)
        searched_cases = len(checker.cache)

        if s.search_without and s.labels and not s.first_failure:
            tried = set()
            for f in list(self.failures):
                for name in f.needs or ():
                    if not feature(name).search_without or (f.property, name) in tried:
                        continue
                    tried.add((f.property, name))
                    prop = f.property
                    masked = self.strategy.map(lambda c, name=name: without(c, name))
                    hit = checker.search(
                        masked,
                        lambda failed, prop=prop: next(
                            (p for p in order(failed) if p == prop or p not in self.known), None
                        ),
                        max_examples=max(10, self.plan.examples // 2),
                        tag=f"without:{prop}:{name}",
                        shrink_budget=self.budget,
                    )
                    if hit is not None:
                        self.finish(hit, without_feature=name)
        return self.report(searched_cases)

    def report(self, searched_cases: int, **extra) -> CheckReport:
        """The report of what was found, the failing cases saved in the database."""
        failures, database, checker = self.failures, self.database, self.checker
        notes = self.notes
        stored = 0
        if database is not None:
            try:
                for f in failures:
                    database.save(self.key, f.case, f.property, self.checked)
                    stored += 1
            except OSError as exc:
                notes.append(f"could not save the failing cases in {database.path}: {exc}")
        notes += sorted(
            {r.extra["unjudged"] for r in checker.cache.values() if r.extra.get("unjudged")}
        )
        if self.checked == {"float64-bound"} and checker.worst_bound is None and not failures:
            # The one property selected judged nothing: a pass would say nothing.
            notes.append(
                "float64-bound judged none of these cases: it judges the MLP and toy cases "
                "computed below float64 (--precision fp32, bf16, fp16 or mixed) of every kind "
                "but loop"
            )
        if hasattr(self.progress, "clear"):
            self.progress.clear()
        return CheckReport(
            self.target,
            not failures,
            self.first_at if failures else searched_cases,
            time.monotonic() - self.t0,
            failures,
            checker.worst,
            self.sizes,
            notes,
            cases_run=len(checker.cache),
            timeout=self.settings.timeout,
            database=None if database is None else str(database.path),
            replayed=self.replayed,
            dropped=self.dropped,
            saved=stored,
            worst_bound=checker.worst_bound,
            **extra,
        )


# Hangs and dead ranks cost a timeout or a process start each: their shrinking is bounded.
_COSTLY = ("hang", "died", "memory-cap")


def mapped_off(off, never) -> tuple[str, ...]:
    """The features of ``off`` a strategy that never draws ``never`` (and what needs them) may
    still draw: those a case has to have taken away."""
    never_closed = closure(never)
    return tuple(f for f in off if f not in never_closed)


def declared_mismatch(case: Case, target) -> str | None:
    """Why ``case`` is not one of ``target``'s cases by what the target declares of itself (a
    loop's loss and clip norm: ``Kind.options``), or None. A case saved under another declaration
    (the loss declared after a first run) is not the target's: replayed, it fails a correct one."""
    options = KINDS[target.kind].options
    if "loss" in options:
        want = getattr(target, "loss", None) or "token-mean"
        if case.loss != want:
            return f"its loss is {case.loss!r}, the target declares {want!r}"
    if "clip_norm" in options:
        want = getattr(target, "clip_norm", None)
        if case.clip_norm != want:
            return f"its clip norm is {case.clip_norm}, the target declares {want}"
    return None


def _not_drawn(case: Case, sizes, precision: str, off) -> str | None:
    """Why this check would not draw ``case`` (None: it would); ``precision`` None: a case built
    in the check's precision, its setting not asked."""
    if case.world_size not in sizes:
        return f"world size {case.world_size} is not among {list(sizes)}"
    setting = (case.dtype, case.autocast, case.loss_scale)
    if precision is not None and setting not in precision_settings(precision):
        return f"precision {_setting_text(setting)} is not drawn at --precision {precision}"
    turned_off = sorted(case_features(case) & set(off), key=list(off).index)
    if turned_off:
        return f"{turned_off[0]} is not drawn"
    return None


def _setting_text(setting) -> str:
    dtype, autocast, scale = setting
    return (
        dtype
        + (f" under {autocast} autocast" if autocast else "")
        + (f" with loss scale {scale:g}" if scale else "")
    )
