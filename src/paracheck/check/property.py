"""The equivalence property, driven by Hypothesis: generate cases, run, shrink, report."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from hypothesis.errors import Flaky

from paracheck.cases import Case
from paracheck.check.run import CaseResult, CheckFailure, run_case
from paracheck.check.targets import Target
from paracheck.world import World

__all__ = ["CheckReport", "check_target", "replay_command", "PROFILES"]

# Hypothesis settings per profile: ci is derandomised (same examples every run).
PROFILES = {
    "ci": dict(max_examples=40, derandomize=True),
    "dev": dict(max_examples=100, derandomize=False),
    "nightly": dict(max_examples=1000, derandomize=False),
}


@dataclass
class CheckReport:
    target: Target
    passed: bool
    examples: int  # examples run before the first failure (or in total when passed)
    seconds: float
    failure: CaseResult | None = None
    worst_ratio: float = 0.0
    world_sizes: tuple[int, ...] = ()
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        if self.passed:
            return (f"PASS {self.target.name}: {self.examples} cases, world sizes {list(self.world_sizes)}, "
                    f"{self.seconds:.1f} s, worst relative error {self.worst_ratio:.1e}")
        return f"FAIL {self.target.name} after {self.examples} cases ({self.seconds:.1f} s)"


def replay_command(target: Target, case: Case, backend: str = "gloo") -> str:
    path = target.name
    return f"paracheck check {path} --backend {backend} --case '{case.to_json()}'"


def check_target(target: Target, world: World, *, world_sizes: tuple[int, ...], max_examples: int = 40,
                 seed: int | None = 0, strategy=None, device_fn=None, database=None,
                 timeout: float | None = None, explicit: list[Case] = (), dtype: str = "float64") -> CheckReport:
    """Check ``target`` on ``max_examples`` generated cases (plus ``explicit`` ones first).

    ``seed`` not None derandomises Hypothesis (the ci profile); the shrunk failing case is the
    smallest Hypothesis finds: fewest ranks, smallest model, fewest steps.
    """
    from paracheck.strategies import cases

    sizes = tuple(sorted(set(world_sizes)))
    if strategy is None:
        # cases() draws the world size first, from `sizes`: spread over the sizes, shrinking first
        # toward the fewest ranks, and no overridden draws (which made duplicate examples).
        default = cases
        if target.kind in ("sharded", "zero"):
            # More parameter groups and late add_param_group calls (paracheck.strategies._sharding).
            from paracheck.strategies._sharding import sharding_cases as default
        strategy = default(world_sizes=sizes, dtype=dtype)
    else:
        # The world size is drawn first: drawn after a whole case, Hypothesis left it at its
        # simplest value (world size 1, no communication) in 21 of 40 derandomised examples.
        strategy = st.tuples(st.sampled_from(sizes), strategy).map(lambda t: t[1].with_world_size(t[0]))
    state = {"n": 0, "first_fail_at": None, "last": None, "worst": 0.0}
    t0 = time.monotonic()

    def one(case: Case) -> None:
        state["n"] += 1
        result = run_case(world, target, case, device=device_fn(case) if device_fn else None, timeout=timeout)
        if result.ok:
            state["worst"] = max(state["worst"], result.worst_ratio)
            return
        if state["first_fail_at"] is None:
            state["first_fail_at"] = state["n"]
        state["last"] = result
        raise CheckFailure(result, target)

    for case in explicit:
        try:
            one(case)
        except CheckFailure as exc:
            return CheckReport(target, False, state["n"], time.monotonic() - t0, exc.result, state["worst"], sizes)

    cfg = dict(
        max_examples=max_examples,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        database=database,
        print_blob=False,
        phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],
    )
    # A seed makes the run reproducible. Without a database that is Hypothesis's derandomize
    # mode; with one (the CLI's default), failing cases are saved and replayed first next time.
    if seed is not None and database is None:
        cfg["derandomize"] = True

    @settings(**cfg)
    @given(strategy)
    def prop(case):
        one(case)

    if seed is not None and database is not None:
        prop = hypothesis_seed(seed)(prop)
    try:
        prop()
    except CheckFailure as exc:
        return CheckReport(target, False, state["first_fail_at"] or state["n"], time.monotonic() - t0,
                           exc.result, state["worst"], sizes)
    except Flaky:
        last = state["last"]
        return CheckReport(target, False, state["first_fail_at"] or state["n"], time.monotonic() - t0, last,
                           state["worst"], sizes, ["the failure did not reproduce on replay (flaky)"])
    except BaseException as exc:  # an ExceptionGroup of several distinct failures
        last = state["last"]
        if last is None:
            raise
        return CheckReport(target, False, state["first_fail_at"] or state["n"], time.monotonic() - t0, last,
                           state["worst"], sizes, [f"several distinct failures ({type(exc).__name__})"])
    return CheckReport(target, True, state["n"], time.monotonic() - t0, None, state["worst"], sizes)
