"""The optimizer-sharding kinds: what each rank runs (``run_sharded``, ``run_zero``,
``run_reload``) and the properties checked, in the driver, on what the ranks recorded
(``check_sharding_properties``).

Kinds (see ``paracheck.check.targets``):

* ``sharded``: ``Class(params, optimizer_cls, **kwargs)``, a ``torch.optim.Optimizer`` (CS336
  ``ShardedOptimizer``). Gradients are synchronised by paracheck's ``FlatDDP`` (checked on its own)
  before ``step()``. Optional: ``partition`` (an object with ``owners``, one per parameter of
  ``param_groups`` flattened) and ``local_optimizer`` (or ``optim``), the wrapped optimizer.
* ``zero``: ``Class(module, optimizer_cls, *, params, bucket_size_mb, **kwargs)`` with ``forward``,
  ``finish_gradient_synchronization()``, ``no_sync()``, ``step()``, ``zero_grad()`` (of every
  parameter of the module: ``Case.zero_grad_module``), ``param_groups``, ``add_param_group``,
  ``state_dict()``; optional ``full_gradients()`` (then gradients are compared too), ``layout``
  and ``pieces`` (``paracheck.zero.Zero1``), ``optimizer`` (the ``torch.optim.Optimizer`` an LR
  scheduler is built on).

The rank programs call only what the interface offers: the harness never resets a gradient
itself, so ``zero_grad()`` must clear every parameter of the optimizer's groups (not only this
rank's shard). Per case they follow its protocols (``Case``): an LR scheduler built on the
target and stepped after every step (a target that is not a ``torch.optim.Optimizer`` cannot
carry one: the case is skipped with a note), parameter groups as dicts of generators,
``add_param_group`` mid-training, ``step(closure)`` (``sharded`` and ``zero``), and, for
``sharded``, ``state_dict()`` -> a fresh instance -> ``load_state_dict()`` mid-training.

Every step records parameters, gradients, the optimizer state this rank's ``state_dict()`` returns
(mapped to parameter indices as ``paracheck.oracle.train.optimizer_state`` does; Note [State dict
conventions]), the bytes of optimizer state this rank holds, the collectives issued during the
step (``record_collectives``; ``state_dict()``, the gradient gathering for the check and the
closure's gradient synchronisation are outside it) and the declared owners.

Note [State dict conventions]
    Nothing in the CS336 interface asks ``state_dict()`` to consolidate. Two readings are
    accepted: *consolidated* (every rank returns every parameter's state) and *per-rank shards*
    (a rank returns the state of the parameters it owns, as ``torch.optim.Optimizer.state_dict()``
    does on a wrapper that keeps its shard in ``self.state``; several ranks may return the same
    parameter's state if they return it identically). Indices name the wrapper's
    ``param_groups`` (torch's convention), or, failing that, the wrapped optimizer's groups
    (a wrapper that returns its ``local_optimizer.state_dict()``). The ``state`` property checks
    the union over ranks; ``state-consolidated`` (opt-in) asks every rank for everything, which is
    what loading the dict at another world size needs (``run_reload``): a per-rank-shards dict
    can only be loaded back at the same world size, by the same rank.

Properties (``PROPERTIES``; a check may select a subset, ``Target.properties``; the default is
``DEFAULT_PROPERTIES``, every one but ``state-consolidated``):

* ``equivalence``: parameters (and gradients) equal the oracle after every step; ranks agree bitwise;
* ``state``: the optimizer state, the union over ranks of what ``state_dict()`` returns, equals the
  oracle's after every step (Note [State dict conventions]);
* ``memory``: each rank holds exactly the optimizer-state bytes its declared partition implies
  (``paracheck.accounting.memory``): the state *is* sharded, and as declared;
* ``balance``: the declared partition is within its stated bound (Note [Balance bound] /
  Note [Flat layout] in ``paracheck.zero.partition``) and owns every parameter exactly once;
* ``traffic``: each rank's collectives per step equal the analytic model exactly
  (``paracheck.accounting.traffic``);
* ``state-consolidated`` (opt-in): every rank's ``state_dict()`` holds every parameter's state.
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.distributed as dist

from paracheck.accounting.memory import (
    flat_state_bytes,
    measured_state_bytes,
    sharded_state_bytes,
    state_model,
)
from paracheck.accounting.traffic import (
    StepTraffic,
    owner_broadcast_traffic,
    record_collectives,
    zero1_traffic,
)
from paracheck.cases import (
    Case,
    add_late_groups,
    apply_lr_schedule,
    batch_for,
    build_case_model,
    build_optimizer,
    build_scheduler,
    loss_fn,
    param_groups,
)
from paracheck.check._drive import DDPDriver
from paracheck.check._rank import _cls, _device, _snapshot, train_micro_steps
from paracheck.check.compare import Divergence, compare_state_union, state_convention
from paracheck.zero.partition import Piece, flat_layout

__all__ = [
    "DEFAULT_PROPERTIES",
    "DRIVER_PROPERTIES",
    "PROPERTIES",
    "check_sharding_properties",
    "resolve_properties",
    "run_reload",
    "run_sharded",
    "run_zero",
    "sharding_notes",
]

PROPERTIES = ("equivalence", "state", "memory", "balance", "traffic", "state-consolidated")
DEFAULT_PROPERTIES = frozenset(PROPERTIES) - {"state-consolidated"}
# Judged by check_sharding_properties on what the ranks recorded (each rank's state values are
# also compared with the oracle's by paracheck.check.compare, along the trajectory).
DRIVER_PROPERTIES = frozenset({"state", "state-consolidated", "memory", "balance", "traffic"})


def resolve_properties(properties) -> frozenset[str]:
    """None -> ``DEFAULT_PROPERTIES``; otherwise a subset of ``PROPERTIES`` (ValueError naming the rest)."""
    if properties is None:
        return DEFAULT_PROPERTIES
    chosen = frozenset(properties)
    unknown = sorted(chosen - set(PROPERTIES))
    if unknown:
        raise ValueError(
            f"properties={sorted(chosen)!r}: unknown {unknown}; choose from {list(PROPERTIES)}"
        )
    return chosen


# -- recording helpers ------------------------------------------------------------------------


def _inner_optimizers(opt):
    """``opt`` and the optimizers it wraps, outermost first: ``local_optimizer`` / ``optim`` /
    ``optimizer`` attributes followed down (at most four levels)."""
    chain = [opt]
    for _ in range(4):
        nxt = None
        for name in ("local_optimizer", "optim", "optimizer"):
            cand = getattr(chain[-1], name, None)
            if isinstance(cand, torch.optim.Optimizer) and all(cand is not o for o in chain):
                nxt = cand
                break
        if nxt is None:
            break
        chain.append(nxt)
    return chain


def _local_state(opt):
    """The state mapping of this rank's innermost wrapped optimizer (``opt.state`` if none; None
    for a target without either: the interface does not require one)."""
    return getattr(_inner_optimizers(opt)[-1], "state", None)


def _state_bytes(opt) -> int | None:
    state = _local_state(opt)
    return None if state is None else measured_state_bytes(state)


def _group_sizes(groups) -> list[int]:
    return [len(g["params"]) for g in groups]


def _state_by_param(state_dict: dict, opt, index: dict[int, int]) -> tuple[dict | None, str]:
    """The state in ``state_dict`` keyed by index into the model's parameters, and how its indices
    were read (Note [State dict conventions]); (None, why) when they name no optimizer's groups.
    Never raises on a state dict in torch's format."""
    saved = state_dict.get("param_groups") if isinstance(state_dict, dict) else None
    state = state_dict.get("state") if isinstance(state_dict, dict) else None
    if not isinstance(saved, (list, tuple)) or not isinstance(state, dict):
        return None, (
            f"state_dict() returned {type(state_dict).__name__} without 'state' (dict) and "
            f"'param_groups' (list): torch's format is required"
        )
    sizes = [len(g.get("params", ())) for g in saved]
    to_model, how = None, ""
    for depth, o in enumerate(_inner_optimizers(opt)):
        groups = getattr(o, "param_groups", None)
        if groups is not None and _group_sizes(groups) == sizes:
            to_model = {}
            for sg, g in zip(saved, groups):
                for j, p in zip(sg["params"], g["params"]):
                    to_model[j] = index.get(id(p))
            how = (
                "the optimizer's param_groups"
                if depth == 0
                else "the wrapped optimizer's param_groups"
            )
            break
    if to_model is None:
        return None, (
            f"state_dict()['param_groups'] has groups of {sizes} parameters; neither the optimizer's "
            f"param_groups ({_group_sizes(getattr(opt, 'param_groups', []))}) nor a wrapped "
            f"optimizer's match"
        )
    out = {}
    for j, st in state.items():
        if st is None:
            continue
        i = to_model.get(j)
        if i is None:
            return None, f"state_dict()['state'] has index {j!r}, which names no parameter of {how}"
        entry = {}
        for k, v in st.items():
            if torch.is_tensor(v):
                entry[k] = v.detach().to("cpu", copy=True)
            elif isinstance(v, (int, float)) and not isinstance(v, bool):
                entry[k] = torch.tensor(float(v))
        out[i] = entry
    return out, how


def _read_state(opt, index: dict[int, int]):
    """(state_dict(), its state by parameter or None, how it was read): one call of the target's
    ``state_dict()``, a collective for a consolidating target."""
    sd = opt.state_dict()
    state, how = _state_by_param(sd, opt, index)
    return sd, state, how


def _owners(opt, index: dict[int, int], n: int):
    owners = getattr(getattr(opt, "partition", None), "owners", None)
    if owners is None:
        return None
    out = [None] * n
    for p, o in zip((p for g in opt.param_groups for p in g["params"]), owners):
        out[index[id(p)]] = int(o)
    return tuple(out)


def _minus(a: StepTraffic, b: StepTraffic) -> StepTraffic:
    d = a.as_dict()
    for k, c, n in b.entries:
        c0, n0 = d[k]
        d[k] = (c0 - c, n0 - n)
    return StepTraffic.from_dict(d)


def _scheduler_or_skip(case: Case, opt, device):
    """(the case's LR scheduler on ``opt`` or None, None) or (None, note) when ``opt`` cannot carry
    a torch scheduler (torch raises TypeError for anything not a ``torch.optim.Optimizer``): such a
    target does not offer the protocol, so the case is skipped, never failed. Ranks agree."""

    def build():
        try:
            return build_scheduler(case, opt), None
        except TypeError as exc:
            return None, (
                f"skipped: an LR scheduler ({case.optimizer.scheduler!r}) cannot be built on "
                f"{type(opt).__name__}: {exc}"
            )

    return _on_every_rank(build, device, "building the LR scheduler")


class _Closure:
    """The step's work as a closure for ``step(closure)``: zero_grad, forward, backward and the
    gradient synchronisation; returns the loss of the last micro-step. Counts its calls and the
    collectives it issued (the synchronisation is not the optimizer's traffic)."""

    def __init__(self, case: Case, drv: DDPDriver, opt, rank: int, device, step: int):
        self.case, self.drv, self.opt, self.rank, self.device, self.step = (
            case,
            drv,
            opt,
            rank,
            device,
            step,
        )
        self.calls = 0
        self.traffic = StepTraffic()

    def __call__(self):
        case, outputs = self.case, []

        def forward(x):
            outputs.append(self.drv.forward(x))
            return outputs[-1]

        with record_collectives() as rec:
            self.opt.zero_grad(set_to_none=case.set_to_none)
            train_micro_steps(
                case,
                replace(self.drv, forward=forward),
                self.opt,
                self.rank,
                self.device,
                self.step,
            )
        self.calls += 1
        self.traffic = self.traffic + rec.traffic()
        _, y = batch_for(case, self.step, case.accumulation - 1, self.rank, device=self.device)
        return loss_fn(case, outputs[-1], y).detach()


def _reload(case: Case, opt, scheduler, params, cls, step: int, device):
    """Before step ``step``: save ``opt`` (and the scheduler), build a fresh instance over the same
    parameters with the constructor's groups, its scheduler, then the groups added so far, and
    load both dicts (the usual checkpoint order: construct, then load)."""

    def fresh():
        saved = opt.state_dict()
        saved_scheduler = None if scheduler is None else scheduler.state_dict()
        new = build_optimizer(case, params, optimizer_cls=cls)
        new_scheduler = build_scheduler(case, new) if scheduler is not None else None
        for k in range(step):
            add_late_groups(case, new, params, k)
        new.load_state_dict(saved)
        if new_scheduler is not None:
            new_scheduler.load_state_dict(saved_scheduler)
        return new, new_scheduler

    return _on_every_rank(fresh, device, "building a fresh optimizer and load_state_dict()")


# -- rank functions -----------------------------------------------------------------------------


def run_sharded(payload: dict) -> dict:
    """Train ``case`` with FlatDDP for the gradients and the sharded optimizer at ``payload['path']``."""
    from paracheck.ddp import FlatDDP

    case: Case = payload["case"]
    rank = dist.get_rank()
    device = _device(payload.get("device"))
    model = build_case_model(case, rank, device=device)
    ddp = DDPDriver(
        wrapper=(flat := FlatDDP(model)),
        forward=flat,
        finish=lambda optimizer: flat.finish_gradient_synchronization(),
        no_sync=flat.no_sync,
    )
    params = list(model.parameters())
    index = {id(p): i for i, p in enumerate(params)}
    cls = _cls(payload["path"])
    opt = _on_every_rank(
        lambda: build_optimizer(case, params, optimizer_cls=cls),
        device,
        "constructing the optimizer",
    )
    scheduler, skipped = _scheduler_or_skip(case, opt, device)
    if skipped:
        return {"skipped": skipped}
    record = {
        "initial_params": _snapshot(params),
        "initial_buffers": _snapshot(model.buffers()),
        "steps": [],
    }
    for step in range(case.steps):
        if case.reload_at_step == step:
            opt, scheduler = _reload(case, opt, scheduler, params, cls, step, device)
        add_late_groups(case, opt, params, step)
        if case.closure:
            closure = _Closure(case, ddp, opt, rank, device, step)
            with record_collectives() as rec:
                opt.step(closure)
            traffic = _minus(rec.traffic(), closure.traffic)
            grads = _snapshot([p.grad for p in params])  # after the step: the closure computed them
        else:
            opt.zero_grad(set_to_none=case.set_to_none)
            train_micro_steps(case, ddp, opt, rank, device, step)
            grads = _snapshot([p.grad for p in params])
            with record_collectives() as rec:
                opt.step()
            traffic = rec.traffic()
        apply_lr_schedule(case, opt)
        if scheduler is not None:
            scheduler.step()
        sd, state, how = _on_every_rank(lambda: _read_state(opt, index), device, "state_dict()")
        record["steps"].append(
            {
                "grads": grads,
                "params": _snapshot(params),
                "state": state,
                "state_read": how,
                "state_bytes": _state_bytes(opt),
                "traffic": traffic.entries,
                "owners": _owners(opt, index, len(params)),
            }
        )
    record["final_state_dict"] = sd
    return record


def _build_zero(case: Case, model, cls):
    params = list(model.parameters())
    bucket = case.bucket_size_mb if case.bucket_size_mb is not None else 25.0

    def make(groups, optimizer_cls, **kwargs):
        return cls(model, optimizer_cls, params=groups, bucket_size_mb=bucket, **kwargs)

    return params, build_optimizer(case, params, optimizer_cls=make)


def run_zero(payload: dict) -> dict:
    """Train ``case`` with the ZeRO wrapper at ``payload['path']`` (gradient sync included). The
    LR scheduler is built on its ``optimizer`` (itself if it has none); ``reload_at_step`` is not
    exercised here (a second wrapper over the same module would hook it twice)."""
    case: Case = payload["case"]
    rank = dist.get_rank()
    device = _device(payload.get("device"))
    model = build_case_model(case, rank, device=device)
    params, zero = _on_every_rank(
        lambda: _build_zero(case, model, _cls(payload["path"])),
        device,
        "constructing the optimizer",
    )
    index = {id(p): i for i, p in enumerate(params)}
    trainable = getattr(zero, "trainable", [p for p in params if p.requires_grad])
    scheduler, skipped = _scheduler_or_skip(case, getattr(zero, "optimizer", zero), device)
    if skipped:
        return {"skipped": skipped}
    record = {
        "initial_params": _snapshot(params),
        "initial_buffers": _snapshot(model.buffers()),
        "steps": [],
    }
    full_gradients = getattr(zero, "full_gradients", None)
    drv = DDPDriver(
        wrapper=zero,
        forward=zero,
        finish=lambda optimizer: zero.finish_gradient_synchronization(),
        no_sync=getattr(zero, "no_sync", None),
    )
    for step in range(case.steps):
        add_late_groups(case, zero, params, step)
        if case.closure:
            with record_collectives() as rec:
                zero.step(_Closure(case, drv, zero, rank, device, step))
            traffic = rec.traffic()  # the synchronisation is ZeRO's own traffic
        else:
            zero.zero_grad(set_to_none=case.set_to_none)
            with record_collectives() as rec:
                train_micro_steps(case, drv, zero, rank, device, step)
        entry = {}
        if full_gradients is not None:
            grads = [None] * len(params)
            for p, g in zip(trainable, full_gradients()):
                grads[index[id(p)]] = g
            entry["grads"] = _snapshot(grads)
        if not case.closure:
            with record_collectives() as rec_step:
                zero.step()
            traffic = rec.traffic() + rec_step.traffic()
        apply_lr_schedule(case, zero)
        if scheduler is not None:
            scheduler.step()
        sd, state, how = _on_every_rank(lambda: _read_state(zero, index), device, "state_dict()")
        entry.update(
            {
                "params": _snapshot(params),
                "state": state,
                "state_read": how,
                "state_bytes": _state_bytes(zero),
                "traffic": traffic.entries,
            }
        )
        record["steps"].append(entry)
    pieces = getattr(zero, "pieces", None)
    if pieces is not None:
        record["pieces"] = tuple(
            (index[id(trainable[pc.param])], pc.start, pc.length) for pc in pieces
        )
        record["bucket_numels"] = tuple(b.numel for b in zero.layout.buckets)
    record["final_state_dict"] = sd
    return record


def _on_every_rank(fn, device, what: str):
    """``fn()``, raising on every rank when it raises on any (the rank's own error where it has
    one). The harness's per-rank reading of a target's state_dict can fail on some ranks only (a
    consolidation bug leaves a rank without state it should see); the other ranks would go on to
    the next collective and wait there until the process-group timeout, so such a bug cost a
    timeout per example and per shrink step instead of failing at once. The same holds for a
    constructor that raises on some ranks only (a rank that owns no parameter)."""
    try:
        result, failure = fn(), None
    except Exception as e:  # re-raised below, on every rank
        result, failure = None, e
    flag = torch.tensor([0 if failure is None else 1], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    if failure is not None:
        raise failure
    if flag.item():
        raise RuntimeError(f"{what} raised on another rank (that rank reports the error)")
    return result


def run_reload(payload: dict) -> dict:
    """Load ``payload['state_dict']`` (consolidated, saved at any world size) into a fresh target
    whose parameters are ``payload['params']``, with every group of the case; record the
    consolidated state, then step once with the deterministic gradient ``payload['grads']``
    (identical on all ranks) and record parameters and state again. A per-rank-shards state dict
    cannot be loaded at another world size (Note [State dict conventions])."""
    case: Case = payload["case"]
    rank = dist.get_rank()
    device = _device(payload.get("device"))
    model = build_case_model(case, rank, device=device)
    with torch.no_grad():
        for p, v in zip(model.parameters(), payload["params"]):
            p.copy_(v)
    cls = _cls(payload["path"])
    if payload["kind"] == "zero":
        params, opt = _build_zero(case, model, cls)
        owner = opt.optimizer
    else:
        params = list(model.parameters())
        opt = build_optimizer(case, params, optimizer_cls=cls)
        owner = opt
    for step in range(case.steps):
        add_late_groups(case, opt, params, step)
    index = {id(p): i for i, p in enumerate(params)}

    def load():
        opt.load_state_dict(payload["state_dict"])
        return _state_by_param(opt.state_dict(), owner, index)[0]

    loaded = _on_every_rank(load, device, "load_state_dict")
    opt.zero_grad(set_to_none=True)
    if payload["kind"] == "zero":
        # The gradient goes through the ZeRO wrapper's own synchronisation (identical on all ranks,
        # so the average is the gradient itself).
        for p, g in zip(params, payload["grads"]):
            if g is not None and p.requires_grad:
                p.grad = g.to(device).clone()
        opt.finish_gradient_synchronization()
    else:
        for p, g in zip(params, payload["grads"]):
            p.grad = None if g is None else g.to(device).clone()
    opt.step()
    return {
        "loaded": loaded,
        "params": _snapshot(params),
        "state": _state_by_param(opt.state_dict(), owner, index)[0],
    }


# -- properties (driver side) -------------------------------------------------------------------


def _diverge(step, what, rank, detail, got=0.0, expected=0.0, index=None, name=None) -> Divergence:
    return Divergence(step, what, rank, index, name, abs(float(got) - float(expected)), 0.0, detail)


def _case_params(case: Case):
    with torch.random.fork_rng(devices=[]):
        model = build_case_model(case, 0)
    return list(model.parameters())


def _group_of(case: Case, params) -> tuple[dict[int, dict], dict[int, int | None]]:
    """Per parameter index: its group's options, and the step its group is added at (None: constructor)."""
    index = {id(p): i for i, p in enumerate(params)}
    options, added = {}, {}
    for late in (False, True):
        for g in param_groups(case, params, late=late):
            at = g.pop("add_at_step", None)
            for p in g.pop("params"):
                options[index[id(p)]] = g
                added[index[id(p)]] = at
    return options, added


def sharding_notes(traj, ranks: list[dict]) -> dict:
    """What a report says about how the target met the interface: ``{"state_dict": convention}``
    (Note [State dict conventions]; "consolidated", "per-rank shards", or "no optimizer state to
    tell" when no step had any), or ``{"skipped": why}`` for a case the target cannot run."""
    skipped = next((rec["skipped"] for rec in ranks if "skipped" in rec), None)
    if skipped is not None:
        return {"skipped": skipped}
    seen = set()
    for k, oref in enumerate(traj.steps):
        states = [rec["steps"][k].get("state") for rec in ranks if k < len(rec.get("steps", ()))]
        if len(states) == len(ranks) and all(st is not None for st in states):
            seen.add(state_convention(states, oref.state))
    seen.discard(None)
    if not seen:
        return {"state_dict": "no optimizer state to tell" if len(ranks) > 1 else "one rank"}
    return {"state_dict": "per-rank shards" if "per-rank shards" in seen else "consolidated"}


def _names(case: Case) -> list[str]:
    with torch.random.fork_rng(devices=[]):
        model = build_case_model(case, 0)
    return [n for n, _ in model.named_parameters()]


def _check_state(case: Case, traj, ranks: list[dict], props) -> Divergence | None:
    """``state`` (the union over ranks, Note [State dict conventions]) and ``state-consolidated``."""
    names = _names(case)
    from paracheck.oracle.tolerance import tolerance_for

    rtol = tolerance_for(case.dtype).state
    if any(len(rec.get("steps", ())) != len(traj.steps) for rec in ranks):
        return None  # the structure divergence is paracheck.check.compare's
    for k, oref in enumerate(traj.steps):
        states = []
        for r, rec in enumerate(ranks):
            step = rec["steps"][k]
            if step.get("state") is None:
                return _diverge(
                    k,
                    "state",
                    r,
                    f"rank {r}'s state_dict() cannot be read: {step.get('state_read')}",
                )
            states.append(step["state"])
        d = compare_state_union(k, states, oref.state, rtol, names)
        if d is not None:
            return d
        if "state-consolidated" in props:
            for r, st in enumerate(states):
                missing = sorted(
                    {i for i, v in oref.state.items() if v} - {i for i, v in st.items() if v}
                )
                if missing:
                    return _diverge(
                        k,
                        "state-consolidated",
                        r,
                        f"rank {r}'s state_dict() has no state for parameters {missing} (it holds "
                        f"{sorted(st)}): state-consolidated asks every rank for every parameter's state",
                        index=missing[0],
                        name=names[missing[0]],
                    )
    return None


def check_sharding_properties(
    case: Case, traj, ranks: list[dict], kind: str, properties=None
) -> Divergence | None:
    """The first violation of the selected ``state`` / ``state-consolidated`` / ``memory`` /
    ``balance`` / ``traffic`` properties (``equivalence`` is ``paracheck.check.compare``'s, which
    also checks each rank's state values), or None."""
    props = resolve_properties(properties)
    if props & {"state", "state-consolidated"}:
        d = _check_state(case, traj, ranks, props)
        if d is not None:
            return d
    if not props & {"memory", "balance", "traffic"}:
        return None
    params = _case_params(case)
    esize = [p.element_size() for p in params]
    nbytes = [p.numel() * p.element_size() for p in params]
    options, added = _group_of(case, params)
    models = [
        state_model(case.optimizer.name, options[i]) if i in options else None
        for i in range(len(params))
    ]
    trainable = [i for i, p in enumerate(params) if p.requires_grad]
    for k, oref in enumerate(traj.steps):
        stateful = set(oref.state)
        if kind == "zero":
            d = _check_zero_step(case, k, ranks, props, params, models, stateful, trainable)
        else:
            d = _check_sharded_step(
                case, k, ranks, props, params, models, stateful, nbytes, esize, added
            )
        if d is not None:
            return d
    return None


def _check_sharded_step(case, k, ranks, props, params, models, stateful, nbytes, esize, added):
    W = case.world_size
    declared = [rec["steps"][k].get("owners") for rec in ranks]
    owners = declared[0]
    if owners is not None and ("memory" in props or "balance" in props):
        for r, other in enumerate(declared):
            if other != owners:
                return _diverge(
                    k,
                    "balance",
                    r,
                    f"rank {r} declares owners {other}, rank 0 {owners}: "
                    f"every rank must compute the same partition",
                )
    in_opt = [i for i in range(len(params)) if i in added and (added[i] is None or added[i] <= k)]
    if owners is not None and "balance" in props:
        unowned = [i for i in in_opt if owners[i] is None]
        if unowned:
            return _diverge(
                k,
                "balance",
                0,
                f"parameters {unowned} are in the optimizer but owned by no rank",
                index=unowned[0],
            )
        weights = {i: nbytes[i] if params[i].requires_grad else 0 for i in in_opt}
        loads = [sum(w for i, w in weights.items() if owners[i] == r) for r in range(W)]
        total, largest = sum(weights.values()), max(weights.values(), default=0)
        if W * max(loads) > total + (W - 1) * largest:
            r = loads.index(max(loads))
            bound = total / W + (W - 1) / W * largest
            return _diverge(
                k,
                "balance",
                r,
                f"rank {r} owns {max(loads)} bytes of trainable parameters; the bound total/W + (W-1)/W * "
                f"largest is {total}/{W} + {W - 1}/{W} * {largest} = {bound:g} (loads {loads}, owners "
                f"{owners})",
                got=max(loads),
                expected=bound,
            )
    if owners is not None and "memory" in props:
        for r, rec in enumerate(ranks):
            got = rec["steps"][k]["state_bytes"]
            expected = sharded_state_bytes(
                owners,
                r,
                numels=[p.numel() for p in params],
                element_sizes=esize,
                models=models,
                stateful=stateful,
            )
            if got != expected:
                return _diverge(
                    k,
                    "memory",
                    r,
                    f"rank {r} holds {got} bytes of optimizer state; its declared "
                    f"partition gives {expected} (owners {owners}, parameters with "
                    f"state {sorted(stateful)})",
                    got,
                    expected,
                )
    if "traffic" in props:
        expected = owner_broadcast_traffic(
            [nbytes[i] for i in in_opt if params[i].requires_grad], W
        )
        for r, rec in enumerate(ranks):
            got = StepTraffic(tuple(tuple(e) for e in rec["steps"][k]["traffic"]))
            if got != expected:
                return _diverge(
                    k,
                    "traffic",
                    r,
                    f"rank {r}'s step issued {got.as_dict()}; the owner-broadcast model "
                    f"gives {expected.as_dict()} (name: (calls, payload bytes))",
                    got.payload_bytes,
                    expected.payload_bytes,
                )
    return None


def _check_zero_step(case, k, ranks, props, params, models, stateful, trainable):
    W = case.world_size
    declared = [rec.get("pieces") for rec in ranks]
    e = params[trainable[0]].element_size()
    if declared[0] is not None and "balance" in props:
        covered: dict[int, list[tuple[int, int]]] = {}
        for pieces in declared:
            for i, start, length in pieces:
                covered.setdefault(i, []).append((start, length))
        for i in trainable:
            runs = sorted(covered.get(i, []))
            pos = 0
            for start, length in runs:
                if start != pos:
                    break
                pos += length
            if pos != params[i].numel() or sum(n for _, n in runs) != params[i].numel():
                return _diverge(
                    k,
                    "balance",
                    0,
                    f"the ranks' pieces of parameter #{i} ({params[i].numel()} elements) "
                    f"are {runs}: they must tile it exactly once",
                    index=i,
                )
        loads = [sum(n for _, _, n in pieces) for pieces in declared]
        bound = sum(-(-n // W) for n in ranks[0]["bucket_numels"])
        if max(loads) > bound:
            r = loads.index(max(loads))
            return _diverge(
                k,
                "balance",
                r,
                f"rank {r} owns {max(loads)} elements; the bound sum_b ceil(n_b/W) is "
                f"{bound} (loads {loads})",
                max(loads),
                bound,
            )
    if declared[0] is not None and "memory" in props:
        for r, rec in enumerate(ranks):
            pieces = [Piece(i, s, n, 0, 0) for i, s, n in declared[r]]
            expected = flat_state_bytes(pieces, element_size=e, models=models, stateful=stateful)
            got = rec["steps"][k]["state_bytes"]
            if got != expected:
                return _diverge(
                    k,
                    "memory",
                    r,
                    f"rank {r} holds {got} bytes of optimizer state; its pieces give "
                    f"{expected} (parameters with state {sorted(stateful)})",
                    got,
                    expected,
                )
    if "traffic" in props:
        bucket = case.bucket_size_mb if case.bucket_size_mb is not None else 25.0
        layout = flat_layout(
            [params[i].numel() for i in trainable], W, bucket_numel=max(1, int(bucket * 2**20) // e)
        )
        syncs = 1 if case.no_sync else case.accumulation
        expected = zero1_traffic(layout, e, syncs=syncs)
        for r, rec in enumerate(ranks):
            got = StepTraffic(tuple(tuple(x) for x in rec["steps"][k]["traffic"]))
            if got != expected:
                return _diverge(
                    k,
                    "traffic",
                    r,
                    f"rank {r}'s step issued {got.as_dict()}; the ZeRO-1 model gives "
                    f"{expected.as_dict()} (name: (calls, payload bytes))",
                    got.payload_bytes,
                    expected.payload_bytes,
                )
    return None
