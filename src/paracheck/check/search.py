"""The search machinery of a check (``paracheck.check.property.check_target``): the hang timeout
of each case, the progress line, one Hypothesis search for a property (``_Checker``) and what
every search of one check shares (``_Search``, in
``paracheck.check.shared_search``). The notes that govern it are in
``paracheck.check.property``."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis.errors import Flaky

from paracheck.cases import Case
from paracheck.check.features import (
    FEATURES,
    essential,
    without,
)
from paracheck.check.kinds import KINDS
from paracheck.check.run import CaseResult, CheckFailure, run_case

__all__ = [
    "BudgetSpent",
    "CaseTimeouts",
    "CauseName",
    "Progress",
    "declared_features",
    "sequence_name",
]


class CaseTimeouts:
    """The hang timeout of the next case of each world size; see Note [Hang timeouts]."""

    def __init__(self, cap: float, *, floor: float = 5.0, factor: float = 10.0):
        self.cap, self.floor, self.factor = cap, floor, factor
        self.slowest: dict[int, float] = {}

    def observe(self, world_size: int, seconds: float) -> None:
        self.slowest[world_size] = max(seconds, self.slowest.get(world_size, 0.0))

    def __call__(self, world_size: int) -> float:
        if world_size in self.slowest:
            t = self.factor * self.slowest[world_size]
        elif self.slowest:
            # Ranks share the cores: a larger world is slower in proportion; twice that for safety.
            t = 2 * self.factor * max(s * max(1.0, world_size / w) for w, s in self.slowest.items())
        else:
            return self.cap
        return min(self.cap, max(self.floor, t))


class Progress:
    """One rewritten status line on a terminal (stderr), after the first few seconds; silent when
    the stream is not a TTY."""

    def __init__(self, stream=None, *, after: float = 3.0):
        self.stream = sys.stderr if stream is None else stream
        self.enabled = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.after = after
        self.t0 = time.monotonic()
        self._last = 0.0
        self._shown = False

    def __call__(self, text: str) -> None:
        now = time.monotonic()
        if not self.enabled or now - self.t0 < self.after or now - self._last < 0.2:
            return
        self._last = now
        self.stream.write("\r\x1b[K" + text[:150])
        self.stream.flush()
        self._shown = True

    def clear(self) -> None:
        if self._shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self._shown = False


# Note [Sequences follow the source]
#   Hypothesis derives a derandomised sequence (seed 0: the selftest, the ci profile, paracheck's
#   own tests) from a hash of the test function's source, name and signature, plus the digest
#   added to it (the target and the search, ``_hypothesis_internal_add_digest``). The test function
#   here is ``_Checker.search``'s inner ``test``: editing its text, even reformatting it, changes
#   every derandomised sequence of every target, and with it which cases the selftest's figures
#   were measured on. Work that needs to see the search goes around it (as the first failure is
#   caught around ``wanted``); a deliberate change of ``test`` is a change of every sequence, to be
#   measured again.


@dataclass
class _Hit:
    prop: str
    result: CaseResult
    fully_shrunk: bool
    found_after: int
    notes: list
    shrunk: bool = True  # False: a case run as it is (given, or replayed from the database)
    first: CaseResult | None = None  # the first case found to break it, before shrinking
    found_at: float | None = None  # time.monotonic() when the search found it


# Note [A cause searched by its property's name]
#   The verdict table searches each row for causes of failure not yet known (Note [Causes, not
#   properties] in ``paracheck.check.verdict``), and shrinks a new one keeping it new: a case
#   shrunk only for its property drifts to the simplest case that breaks it, which is often a
#   cause found already (a first exception raised before a second; a core bug beside a feature's).
#   ``_Checker.search``'s test compares the searched property's name with each case's failed
#   properties, and its source must not change (Note [Sequences follow the source]); so the name
#   ``wanted`` returns may be a ``CauseName``: equal to the property's name only while the case
#   the checker ran last (``_Checker.last``) breaks it with the cause searched. Outside the test
#   it is turned back into a plain ``str``.


class CauseName(str):
    """A property's name equal to another only while ``same()`` holds (Note [A cause searched by
    its property's name])."""

    def __new__(cls, prop: str, same):
        name = super().__new__(cls, prop)
        name.same = same
        return name

    def __eq__(self, other):
        if not isinstance(other, str):
            return NotImplemented
        return str.__eq__(self, other) and bool(self.same())

    def __ne__(self, other):
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    __hash__ = str.__hash__


class BudgetSpent(BaseException):
    """Raised by a case not yet run once the check's time budget is spent: a BaseException, so
    that Hypothesis ends the search at once rather than shrink it as a failure."""


class _Found(AssertionError):
    """Raised inside a Hypothesis search on a case that breaks the searched property."""

    def __init__(self, prop: str, result: CaseResult):
        super().__init__(
            f"{prop}: {result.describe(prop).splitlines()[0] if result.describe(prop) else ''}"
        )
        self.prop = prop
        self.result = result


class _Checker:
    def __init__(
        self,
        target,
        world,
        *,
        device_fn,
        timeouts,
        progress,
        strategy_settings,
        key,
        seed,
        stepped_balance=True,
    ):
        self.target, self.world, self.device_fn = target, world, device_fn
        self.stepped_balance = stepped_balance  # the contract's (paracheck.check.features)
        self.timeouts, self.progress = timeouts, progress
        self.settings = strategy_settings
        self.key = key
        self.seed = seed  # hypothesis.seed() of every search; None: the settings decide
        self.cache: dict[str, CaseResult] = {}
        self.worst = 0.0
        self.worst_bound: float | None = None  # the float64 bound's worst ratio, where judged
        self.phase = "searching"
        self.last: CaseResult | None = None  # the result run() returned last
        self.deadline: float | None = None  # past it, a case not run yet raises BudgetSpent
        self.row = ""  # the verdict table's row being searched, for the progress line
        self.row_log: list[CaseResult] | None = None  # the results of the row's cases

    def run(self, case: Case) -> CaseResult:
        key = case.to_json()
        if key in self.cache:
            self.last = self.cache[key]
            if self.row_log is not None:
                self.row_log.append(self.last)
            return self.last
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise BudgetSpent()
        self.progress(
            f"paracheck {self.target.name}: {self.row}{len(self.cache)} cases, world size "
            f"{case.world_size}, {self.phase}"
        )
        result = self._fresh(case)
        if result.ok:
            self.timeouts.observe(case.world_size, result.seconds)
            self.worst = max(self.worst, result.worst_ratio)
            if result.bound_ratio is not None:
                self.worst_bound = max(self.worst_bound or 0.0, result.bound_ratio)
        self.cache[key] = result
        self.last = result
        if self.row_log is not None:
            self.row_log.append(result)
        return result

    def search(
        self, strategy, wanted, *, max_examples: int, tag: str, shrink_budget
    ) -> _Hit | None:
        """Search ``strategy`` for a case on which ``wanted(failed_properties)`` names a property,
        then shrink it for that property (Note [One search per property])."""
        state = {"prop": None, "result": None, "n": 0, "first_at": 0, "t": 0.0, "skipped": 0}
        # The first result that breaks a property (Note [Two margins] in ``paracheck.selftest``),
        # caught around ``wanted``: ``test``'s source must not change, since Hypothesis's
        # derandomised sequence is a hash of it (Note [Sequences follow the source]).
        state["first"] = None
        searched, budget_of = wanted, shrink_budget

        def shrink_budget(prop):
            return budget_of(str(prop))  # a CauseName is its property here

        def wanted(failed):
            prop = searched(failed)
            if prop is not None and state["first"] is None:
                state["first"] = self.last
            return prop

        def test(case):
            state["n"] += 1
            if state["prop"] is not None:
                budget = shrink_budget(state["prop"])
                if (
                    budget is not None
                    and time.monotonic() - state["t"] > budget
                    and case.to_json() not in self.cache
                ):
                    state["skipped"] += 1
                    return  # out of shrinking budget: uncached candidates count as passing
            result = self.run(case)
            failed = result.failed_properties
            if state["prop"] is None:
                prop = wanted(failed)
                if prop is None:
                    return
                state.update(prop=prop, result=result, first_at=state["n"], t=time.monotonic())
                self.phase = f"shrinking {prop}"
            elif state["prop"] not in failed:
                return
            state["result"] = result
            raise _Found(state["prop"], result)

        cfg = dict(self.settings, max_examples=max_examples)
        prop = settings(**cfg)(given(strategy)(test))
        prop.hypothesis.inner_test._hypothesis_internal_add_digest = f"{self.key}|{tag}".encode()
        if self.seed is not None:
            prop = hypothesis_seed(self.seed)(prop)
        notes = []
        try:
            prop()
        except _Found as exc:
            return _Hit(
                str(exc.prop),
                exc.result,
                state["skipped"] == 0,
                state["first_at"] - 1,
                notes,
                first=state["first"],
                found_at=state["t"],
            )
        except Flaky:
            if state["prop"] is None:
                raise
            notes.append("the failure did not reproduce on replay (flaky)")
        except KeyboardInterrupt as exc:
            # Ctrl-C or SIGTERM: the search stops; a failure it found goes with the exception,
            # to be reported (paracheck.cli).
            if state["prop"] is not None:
                exc.hit = _Hit(  # type: ignore[attr-defined]
                    str(state["prop"]),
                    state["result"],
                    False,
                    state["first_at"] - 1,
                    ["stopped while shrinking: the smallest failing case found so far"],
                    first=state["first"],
                )
            raise
        except BudgetSpent:
            if state["prop"] is None:
                raise
            notes.append("the time budget (--budget) ran out while shrinking")
        except BaseException as exc:  # an ExceptionGroup: several origins (should not happen)
            if state["prop"] is None:
                raise
            notes.append(f"Hypothesis ended the search with {type(exc).__name__}")
        finally:
            self.phase = "searching"
        if state["prop"] is None:
            return None
        return _Hit(
            str(state["prop"]),
            state["result"],
            False,
            state["first_at"] - 1,
            notes,
            first=state["first"],
            found_at=state["t"],
        )

    def needs(self, prop: str, case: Case, deadline: float | None) -> tuple[list[str], bool]:
        """The features of ``case`` without which it no longer breaks ``prop`` (and whether every
        feature was tried before ``deadline``)."""
        self.phase = f"labelling {prop}"
        out, complete = [], True
        declared = declared_features(self.target)
        for f in FEATURES:
            if not f.has(case) or f.name in declared:
                continue
            try:
                simpler = without(case, f.name)
            except (ValueError, KeyError, IndexError):
                continue  # no valid case without it
            if simpler == case:
                continue
            if (
                deadline is not None
                and time.monotonic() > deadline
                and simpler.to_json() not in self.cache
            ):
                complete = False
                break
            if prop not in self.run(simpler).failed_properties and self._passes_again(
                prop, simpler
            ):
                out.append(f.name)
        self.phase = "searching"
        return essential(out), complete

    def _passes_again(self, prop: str, case: Case, times: int = 2) -> bool:
        """Whether ``case``, which passed ``prop`` once, passes it ``times`` more on fresh runs: a
        race (an all-reduce not waited for) can land in time on one run, and a feature would be
        reported as needed when it is not."""
        return not any(prop in self._fresh(case).failed_properties for _ in range(times))

    def _fresh(self, case: Case) -> CaseResult:
        """``case`` run on the ranks, not from the cache."""
        return run_case(
            self.world,
            self.target,
            case,
            device=self.device_fn(case) if self.device_fn else None,
            timeout=self.timeouts(case.world_size),
            stepped_balance=self.stepped_balance,
        )


def declared_features(target) -> frozenset[str]:
    """The case features that are ``target``'s declarations, not draws: a loop's clip and its own
    autocast and loss scaling (Note [A loop's own precision]). Every case has them; none is turned
    off, labelled as needed, or searched without (a case without one is not the target's)."""
    out = set()
    if "clip_norm" in KINDS[target.kind].options and getattr(target, "clip_norm", None):
        out.add("clip")
    if getattr(target, "autocast", None) is not None:
        out |= {"low-precision", "autocast"}
        if getattr(target, "scaler", False):
            out.add("loss-scaling")
    return frozenset(out)


def sequence_name(path: str) -> str:
    """The part of a target's import path that picks its derandomised sequence: the path itself
    for ``package.module:Name``, the file's base name for a target given as a file. Its directory
    would make the sequence depend on where the checkout lives, and a user's machine and their CI
    would then draw different cases from the same command."""
    module, sep, name = path.rpartition(":")
    if sep and module.endswith(".py"):
        return f"{os.path.basename(module)}:{name}"
    return path


__all__ += ["CheckFailure"]
