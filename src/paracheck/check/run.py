"""Run one case: the target on the runner, the oracle in this process, then compare."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch

from paracheck.cases import Case, build_case_model
from paracheck.check.compare import Divergence, compare
from paracheck.check.targets import Target
from paracheck.oracle import train
from paracheck.world import World, WorldError

__all__ = ["CaseResult", "CheckFailure", "run_case", "oracle_for"]


@dataclass
class CaseResult:
    case: Case
    divergence: Divergence | None = None
    error: WorldError | None = None
    worst_ratio: float = 0.0
    extra: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.divergence is None and self.error is None

    def describe(self) -> str:
        if self.error is not None:
            return self.error.report()
        if self.divergence is not None:
            return self.divergence.describe()
        return "ok"


class CheckFailure(AssertionError):
    """A case on which the target does not equal the oracle (raised inside Hypothesis tests)."""

    def __init__(self, result: CaseResult, target: Target):
        self.result = result
        self.target = target
        super().__init__(f"{target.name}: {result.describe()}")


@contextlib.contextmanager
def _single_thread():
    # The ranks run single-threaded; so does the oracle, so that each rank's local gradient is
    # computed by the same kernels with the same blocking (see paracheck.check.tolerance).
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def oracle_for(case: Case):
    with _single_thread():
        return train(case)


def param_names(case: Case) -> list[str]:
    with torch.random.fork_rng(devices=[]):
        model = build_case_model(case, 0)
    return [n for n, _ in model.named_parameters()]


def run_case(world: World, target: Target, case: Case, *, device: str | None = None,
             timeout: float | None = None, check_state: bool | None = None) -> CaseResult:
    """Run ``case`` on ``target`` and return how it compares with the oracle (never raises for a
    target's failure: a raising, hanging or dying rank comes back in ``CaseResult.error``)."""
    payload = {"case": case, "path": target.path, "takes_bucket": target.takes_bucket, "device": device}
    ticket = world.submit(target.rank_fn, payload, world_size=case.world_size, timeout=timeout)
    traj = oracle_for(case)  # computed while the ranks train
    try:
        ranks = world.collect(ticket)
    except WorldError as exc:
        return CaseResult(case, error=exc)
    sharding = target.kind in ("sharded", "zero")
    if sharding:  # optimizer-state sharding: selectable properties (paracheck.check._rank_zero)
        from paracheck.check._rank_zero import check_sharding_properties, resolve_properties

        props = resolve_properties(target.properties)
    if check_state is None:
        check_state = sharding and "state" in props
    div, worst = None, 0.0
    if not sharding or props & {"equivalence", "state"}:
        div, worst = compare(traj, ranks, param_names(case), check_state=check_state)
    if div is None and sharding:
        div = check_sharding_properties(case, traj, ranks, target.kind, props)
    extra = {k: v for k, v in ranks[0].items() if k not in ("initial_params", "initial_buffers", "steps")}
    return CaseResult(case, divergence=div, worst_ratio=worst, extra=extra)
