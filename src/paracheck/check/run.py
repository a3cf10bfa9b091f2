"""Run one case: the target on the runner, the oracle in this process, then compare."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field, replace

import torch

from paracheck.cases import Case
from paracheck.check.kinds import KINDS, PARAMETERS, PROPERTY_CHECKS, Evidence, resolve_properties
from paracheck.check.properties import Divergence
from paracheck.check.properties._case import param_names
from paracheck.check.properties._sharding import declares_partition
from paracheck.check.properties.catalog import PARTITIONED, RERUNS
from paracheck.check.properties.compiled import compiling_too_long, model_cannot_compile
from paracheck.check.properties.equivalence import compare
from paracheck.check.properties.reading import on_its_reading, state_union
from paracheck.check.properties.reshard import NOT_JUDGED as RESHARD_NOT_JUDGED
from paracheck.check.properties.state import sharding_notes
from paracheck.check.targets import Target
from paracheck.check.user_model import fitted_case, model_cannot_run_mixed
from paracheck.errors import ParacheckError
from paracheck.oracle import train
from paracheck.oracle.tolerance import anchored
from paracheck.world import RankHang, World, WorldError

__all__ = ["CaseResult", "CheckFailure", "run_case", "oracle_for", "param_names"]


@dataclass
class CaseResult:
    """How one case went: a rank failure (``error``), or every property that failed on it
    (``divergences``: one per property, and after the first of gradients or parameters the
    other ways its step diverged, Note [Every way a step diverged]; ``divergence`` is the first
    of them)."""

    case: Case
    divergence: Divergence | None = None
    error: WorldError | None = None
    worst_ratio: float = 0.0
    # The largest |gradient - float64 gradient| / bound of a case the float64-bound property
    # judged and passed (None: not judged).
    bound_ratio: float | None = None
    extra: dict = field(default_factory=dict)
    divergences: list[Divergence] = field(default_factory=list)
    seconds: float = 0.0  # from submission to the verdict
    outputs: dict[int, str] = field(default_factory=dict)  # rank -> what it printed (clipped)

    def __post_init__(self):
        if self.divergence is not None and not self.divergences:
            self.divergences = [self.divergence]
        if self.divergence is None and self.divergences:
            self.divergence = self.divergences[0]

    @property
    def ok(self) -> bool:
        return self.divergence is None and self.error is None

    @property
    def failed_properties(self) -> list[str]:
        """The properties this case breaks (keys of ``paracheck.check.report.PROPERTIES``)."""
        if self.error is not None:
            kinds = {"hung": "hang", "died": "died", "memory": "memory-cap"}
            return [kinds.get(self.error.kind, "raised")]
        return list(dict.fromkeys(d.property for d in self.divergences))

    def divergence_of(self, prop: str) -> Divergence | None:
        return next((d for d in self.divergences if d.property == prop), None)

    def led_by(self, d: Divergence) -> CaseResult:
        """This result read as failing first with ``d``, one of its divergences (a reading:
        ``paracheck.check.verdict.readings``)."""
        rest = [x for x in self.divergences if x is not d]
        return replace(self, divergence=d, divergences=[d, *rest])

    def describe(self, prop: str | None = None) -> str:
        if self.error is not None:
            return self.error.report()
        d = self.divergence_of(prop) if prop is not None else self.divergence
        if d is not None:
            return d.describe()
        return "ok"


class CheckFailure(ParacheckError, AssertionError):
    """A case on which the target does not equal the oracle (raised inside Hypothesis tests)."""

    def __init__(self, result: CaseResult, target: Target):
        self.result = result
        self.target = target
        super().__init__(f"{target.name}: {result.describe()}")


@contextlib.contextmanager
def _single_thread():
    # The ranks run single-threaded; so does the oracle, so that each rank's local gradient is
    # computed by the same kernels with the same blocking (see paracheck.oracle.tolerance).
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def oracle_for(
    case: Case,
    anchors=None,
    *,
    target_gradients: bool = False,
    device: str | None = None,
    skip_unreached: frozenset[tuple[int, int]] = frozenset(),
):
    with _single_thread():
        return train(
            case,
            anchors,
            target_gradients=target_gradients,
            device=device,
            skip_unreached=skip_unreached,
        )


def oracle_device(case: Case, ranks_on: str) -> str | None:
    """Where the oracle computes its local gradients: the ranks' device type for a case below
    float32 on GPUs (Note [Local gradients on the ranks' device]), else None (the CPU)."""
    on_gpus = torch.device(ranks_on).type == "cuda"
    return ranks_on if on_gpus and anchored(case) else None


def run_case(
    world: World,
    target: Target,
    case: Case,
    *,
    device: str | None = None,
    timeout: float | None = None,
    check_state: bool | None = None,
    stepped_balance: bool = True,
) -> CaseResult:
    """Run ``case`` on ``target`` and return how it compares with the oracle (never raises for a
    target's failure: a raising, hanging or dying rank comes back in ``CaseResult.error``).
    ``stepped_balance``: the contract judges an undeclared sharded design's balance on the state
    its ranks step (Note [Balance of the state stepped])."""
    row = KINDS[target.kind]
    case = _prepared(case, target)
    skipped = _compressed_reduction(case, target)
    if skipped is not None:
        return skipped
    job = target.job(case, device=device)
    t0 = time.monotonic()
    timeout = None if case.compiled is not None else timeout  # Note [Compiling is not hanging]
    ticket = world.submit(target.rank_fn, job, world_size=case.world_size, timeout=timeout)
    # Computed while the ranks train, except where it starts each step from theirs.
    # Note [Anchored steps]; a master's update is judged on the target's own gradients (Note
    # [Comparing master weights]), and so is every step on a user's model (Note [An update on a
    # user's model] in paracheck.check.user_model).
    on_gradients = row.on_target_gradients or case.master_weights or case.user_model is not None
    by_step = anchored(case) or on_gradients
    # Where the ranks compute: the case's device, else the backend's (nccl: each rank's GPU).
    ranks_on = device or ("cuda" if getattr(world, "backend", "gloo") == "nccl" else "cpu")
    local_on = oracle_device(case, ranks_on)
    traj = None if by_step else oracle_for(case, device=local_on)
    try:
        ranks = world.collect(ticket)
    except WorldError as exc:
        return _raised(case, exc, t0)
    seconds = time.monotonic() - t0
    outputs = dict(getattr(world, "last_outputs", {}))
    if ranks[0].skipped is not None:  # a case the target declares out of its interface
        return CaseResult(
            case, extra={"skipped": ranks[0].skipped}, seconds=seconds, outputs=outputs
        )
    # Each step starts from rank 0's state after the last (Note [Anchored steps]).
    anchors = [(s.params, s.grads, s.masters) for s in ranks[0].steps] if by_step else None
    if traj is None:
        traj = oracle_for(case, anchors, target_gradients=on_gradients, device=local_on)
    notes = {}
    if row.compares_state:
        notes = sharding_notes(traj, ranks)
        if "skipped" in notes:  # a protocol the target does not offer: no verdict, never a failure
            return CaseResult(case, extra=notes, seconds=seconds, outputs=outputs)
    props = resolve_properties(target.kind, target.properties, takes_bucket=target.takes_bucket)
    if check_state is None:
        check_state = row.compares_state and "state" in props
    divs, worst = [], 0.0
    judged_from = _grouped_from(case) if row.syncs_its_groups else None
    if "equivalence" in props or (row.compares_state and "state" in props):
        traj, div, worst = on_its_reading(  # Note [A parameter no rank reached]
            traj,
            lambda traj: compare(
                traj,
                ranks,
                param_names(case),
                check_state=check_state,
                # Local gradients computed where the ranks compute them: the same operations.
                device="cpu" if local_on is not None else ranks_on,
                anchored=by_step,
                derived=row.derived_bound,
                judged_from=judged_from,
            ),
            lambda skips: oracle_for(
                case, anchors, target_gradients=on_gradients, device=local_on, skip_unreached=skips
            ),
            union=state_union(case, ranks, props, world, row.compares_state),
        )
        divs += [div, *div.others] if div is not None else []  # Note [Every way a step diverged]
    evidence = Evidence(
        case,
        traj,
        ranks,
        target.kind,
        world,
        target,
        timeout,
        ranks_on=ranks_on,
        judged_from=judged_from,
        stepped_balance=stepped_balance,
    )
    # Each property is checked on its own (they do not depend on each other's verdicts); one
    # divergence per property. The properties compared with the oracle come first, in name order,
    # then those that run the target again.
    others = sorted(props - {"equivalence"}, key=lambda p: (p in RERUNS, p))
    for prop in others:
        try:
            div = PROPERTY_CHECKS[prop](evidence)
        except WorldError as exc:
            return _raised(case, exc, t0)
        if div is not None and all(d.property != div.property for d in divs):
            divs.append(div)
    extra = _notes(evidence, notes, props, stepped_balance=stepped_balance)
    return CaseResult(
        case,
        worst_ratio=worst,
        bound_ratio=evidence.measured.get("float64-bound"),
        extra=extra,
        divergences=divs,
        seconds=seconds,
        outputs=outputs,
    )


def _notes(evidence: Evidence, notes: dict, props, *, stepped_balance: bool) -> dict:
    """The case result's notes: the ranks' own, ``notes`` (the sharding protocol's), and what
    was not judged, with why (never a bare pass)."""
    ranks, row, case = evidence.ranks, evidence.row, evidence.case
    extra = ranks[0].notes()
    extra.update(notes)
    judged_on_a_partition = props & PARTITIONED
    if row.compares_state and judged_on_a_partition and case.world_size > 1:
        if not declares_partition(ranks):
            # Note [Traffic judges a declared design] in paracheck.check.properties.traffic.
            stepped = row.state_layout == "per-parameter"  # Note [State stepped on two ranks]
            extra["unjudged"] = _unjudged(
                judged_on_a_partition, stepped=stepped, balance=stepped and stepped_balance
            )
    if evidence.measured.get(RESHARD_NOT_JUDGED):  # check_reshard
        said = extra.get("unjudged")
        why = evidence.measured[RESHARD_NOT_JUDGED]
        extra["unjudged"] = f"{said}; {why}" if said else why
    return extra


def _prepared(case: Case, target: Target) -> Case:
    """``case`` as ``target``'s kind runs it (``Kind.prepare_case``), with SGD for Adam below
    float32 where the step is not judged on the target's own gradients."""
    row = KINDS[target.kind]
    case = fitted_case(case, target.user_model)  # Note [Cases drawn around a user's model]
    if row.prepare_case is not None:
        case = row.prepare_case(case, target)
    if anchored(case) and case.optimizer.name != "sgd" and not target.reports_gradients:
        # Adam below float32 only where the step is judged on the target's own gradients (Note
        # [Precision from the seed]).
        case = replace(case, optimizer=replace(case.optimizer, name="sgd"))
    return case


def _compressed_reduction(case: Case, target: Target) -> CaseResult | None:
    """The skipped result of a case whose parameters are wider than the target's declared
    reduction dtype (a compressed reduction), or None."""
    # A wrapper that keeps float32 shards of its parameters reduces in what it computes in: its
    # declared reduction dtype is judged, never skipped (Note [Declared reduction dtype]).
    if target.reduce_dtype is None or PARAMETERS in KINDS[target.kind].owns:
        return None
    from paracheck.check.properties.reduce_dtype import narrower_than

    wider = narrower_than(target.reduce_dtype, case)
    if wider is None:
        return None
    # A compressed reduction (Note [Declared reduction dtype]).
    return CaseResult(
        case,
        extra={
            "skipped": f"the declared reduction dtype {target.reduce_dtype} is narrower "
            f"than the parameters' {wider}: a compressed reduction rounds the mean "
            "itself, which is not judged"
        },
    )


def _raised(case: Case, exc: WorldError, t0: float) -> CaseResult:
    """The result of a case whose ranks raised, hung or died (started at ``t0``); skipped where a
    compiled case's ranks were still compiling (Note [Compiling is not hanging]), its ranks still
    ran at a second timeout on an overloaded machine (Note [Too slow to judge] in
    ``paracheck.world._failures``), or torch cannot compile a user's model alone (Note [A user's
    model torch cannot compile]) or run it alone in mixed precision (Note [A user's model torch
    cannot run in mixed precision])."""
    slow = (
        compiling_too_long(case, exc)
        or _too_slow(exc)
        or model_cannot_compile(case, exc)
        or model_cannot_run_mixed(case, exc)
    )
    if slow is not None:
        return CaseResult(case, extra={"skipped": slow}, seconds=time.monotonic() - t0)
    return CaseResult(
        case,
        error=exc,
        seconds=time.monotonic() - t0,
        outputs={f.rank: f.output for f in exc.failures if f.output},
    )


def _too_slow(exc: WorldError) -> str | None:
    return exc.too_slow() if isinstance(exc, RankHang) else None


def _unjudged(props: frozenset[str], *, stepped: bool, balance: bool = False) -> str:
    """The report's note for a target that declares no partition: which of ``props`` were not
    judged, and (``sharded``, Note [State stepped on two ranks], Note [Balance of the state
    stepped]) how ``memory`` and ``balance`` still were."""
    exact = sorted(props - ({"memory"} if stepped else set()) - ({"balance"} if balance else set()))
    parts = []
    if exact:
        parts.append(
            f"{', '.join(exact)} not judged: the target declares no partition (partition.owners, "
            f"or pieces and layout), so nothing says where its optimizer state should be"
        )
    if stepped and "memory" in props:
        parts.append(
            "memory judged only by the state each rank steps: no parameter's state may be "
            "stepped on two ranks" + ("" if exact else " (the target declares no partition)")
        )
    if balance and "balance" in props:
        parts.append(
            "balance judged on the state each rank steps: at most total/W + largest parameter "
            "bytes per rank" + ("" if exact else " (the target declares no partition)")
        )
    return "; ".join(parts)


# Note [Gradients outside the groups]
#   A ZeRO wrapper owns the module and synchronises gradients for its optimizer, so one reading
#   synchronises only the parameters its groups hold: a parameter whose group is added at step k
#   (``add_param_group``) keeps its local gradient, or none, before k. Nothing is trained with
#   it before k, so its gradient is judged from step k on, where it must be the average like any
#   other; its parameter is judged at every step. A DDP, which has no groups, and a sharded
#   optimizer (trained behind a DDP) are judged at every step.
def _grouped_from(case) -> dict[int, int]:
    """Parameter index -> the step its group is added at, for the parameters of groups added
    mid-training (Note [Gradients outside the groups])."""
    from paracheck.check.properties._case import case_params, group_of

    _, added = group_of(case, case_params(case))
    return {i: at for i, at in added.items() if at is not None}
