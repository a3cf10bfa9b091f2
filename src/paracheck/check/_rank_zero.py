"""The optimizer-sharding kinds: what each rank runs (``run_sharded``, ``run_zero``,
``run_reload``) and the properties checked, in the driver, on what the ranks recorded
(``check_sharding_properties``).

Kinds (see ``paracheck.check.targets``):

* ``sharded``: ``Class(params, optimizer_cls, **kwargs)``, a ``torch.optim.Optimizer`` (CS336
  ``ShardedOptimizer``). Gradients are synchronised by paracheck's ``FlatDDP`` (checked on its own)
  before ``step()``. Optional: ``partition`` (an object with ``owners``, one per parameter of
  ``param_groups`` flattened) and ``local_optimizer`` (or ``optim``), the wrapped optimizer.
* ``zero``: ``Class(module, optimizer_cls, *, params, bucket_size_mb, **kwargs)`` with ``forward``,
  ``finish_gradient_synchronization()``, ``no_sync()``, ``step()``, ``zero_grad()``,
  ``param_groups``, ``add_param_group``, ``state_dict()``; optional ``full_gradients()`` (then
  gradients are compared too), ``layout`` and ``pieces`` (``paracheck.zero.Zero1``).

Every step records parameters, gradients, the consolidated optimizer state (``state_dict()``,
mapped to parameter indices as ``paracheck.oracle.train.optimizer_state`` does), the bytes of
optimizer state this rank holds, the collectives issued during the step (``record_collectives``;
``state_dict()`` and the gradient gathering for the check are outside it) and the declared owners.

Properties (``PROPERTIES``; a check may select a subset, ``Target.properties``):

* ``equivalence``: parameters (and gradients) equal the oracle after every step; ranks agree bitwise;
* ``state``: the consolidated optimizer state equals the oracle's after every step;
* ``memory``: each rank holds exactly the optimizer-state bytes its declared partition implies
  (``paracheck.accounting.memory``): the state *is* sharded, and as declared;
* ``balance``: the declared partition is within its stated bound (Note [Balance bound] /
  Note [Flat layout] in ``paracheck.zero.partition``) and owns every parameter exactly once;
* ``traffic``: each rank's collectives per step equal the analytic model exactly
  (``paracheck.accounting.traffic``).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from paracheck.accounting.memory import flat_state_bytes, measured_state_bytes, sharded_state_bytes, state_model
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
    loss_fn,
    param_groups,
)
from paracheck.check._drive import DDPDriver
from paracheck.check._rank import _cls, _device, _snapshot, train_micro_steps
from paracheck.check.compare import Divergence
from paracheck.zero.partition import Piece, flat_layout

__all__ = ["PROPERTIES", "check_sharding_properties", "resolve_properties", "run_reload", "run_sharded", "run_zero"]

PROPERTIES = ("equivalence", "state", "memory", "balance", "traffic")


def resolve_properties(properties) -> frozenset[str]:
    """None -> every property; otherwise a subset of ``PROPERTIES`` (ValueError naming the rest)."""
    if properties is None:
        return frozenset(PROPERTIES)
    chosen = frozenset(properties)
    unknown = sorted(chosen - set(PROPERTIES))
    if unknown:
        raise ValueError(f"properties={sorted(chosen)!r}: unknown {unknown}; choose from {list(PROPERTIES)}")
    return chosen


# -- recording helpers ------------------------------------------------------------------------

def _local_state(opt):
    """The state mapping of this rank's wrapped optimizer: follow ``optimizer`` / ``local_optimizer``
    / ``optim`` attributes down to the innermost optimizer (falls back to ``opt.state``)."""
    inner = opt
    for _ in range(4):
        nxt = None
        for name in ("local_optimizer", "optim", "optimizer"):
            cand = getattr(inner, name, None)
            if isinstance(cand, torch.optim.Optimizer) and cand is not inner:
                nxt = cand
                break
        if nxt is None:
            break
        inner = nxt
    return inner.state


def _saved_to_model_index(state_dict: dict, opt, index: dict[int, int]) -> dict[int, int]:
    # torch's convention: saved group k's indices name opt.param_groups[k]'s parameters in order.
    out = {}
    for saved, group in zip(state_dict["param_groups"], opt.param_groups):
        for j, p in zip(saved["params"], group["params"]):
            out[j] = index[id(p)]
    return out


def _state_by_param(state_dict: dict, opt, index: dict[int, int]) -> dict[int, dict[str, torch.Tensor]]:
    to_model = _saved_to_model_index(state_dict, opt, index)
    out = {}
    for j, st in state_dict["state"].items():
        if st is None:
            continue
        out[to_model[j]] = {k: (v.detach().to("cpu", copy=True) if torch.is_tensor(v) else torch.tensor(float(v)))
                            for k, v in st.items()}
    return out


def _owners(opt, index: dict[int, int], n: int):
    owners = getattr(getattr(opt, "partition", None), "owners", None)
    if owners is None:
        return None
    out = [None] * n
    for p, o in zip((p for g in opt.param_groups for p in g["params"]), owners):
        out[index[id(p)]] = int(o)
    return tuple(out)


def _reset_outside_optimizer(case: Case, opt, params) -> None:
    # The oracle resets every gradient each step. A parameter whose group is added later (after
    # step k >= 2) is outside the optimizer's zero_grad() until then, so its .grad would accumulate
    # over steps; reset exactly those, leaving the target's own zero_grad() under test.
    inside = {id(p) for g in opt.param_groups for p in g["params"]}
    for p in params:
        if id(p) not in inside and p.grad is not None:
            if case.set_to_none:
                p.grad = None
            else:
                p.grad.zero_()


# -- rank functions -----------------------------------------------------------------------------

def run_sharded(payload: dict) -> dict:
    """Train ``case`` with FlatDDP for the gradients and the sharded optimizer at ``payload['path']``."""
    from paracheck.ddp import FlatDDP

    case: Case = payload["case"]
    rank = dist.get_rank()
    device = _device(payload.get("device"))
    model = build_case_model(case, rank, device=device)
    ddp = DDPDriver(wrapper=(flat := FlatDDP(model)), forward=flat,
                    finish=lambda optimizer: flat.finish_gradient_synchronization(), no_sync=flat.no_sync)
    params = list(model.parameters())
    index = {id(p): i for i, p in enumerate(params)}
    opt = build_optimizer(case, params, optimizer_cls=_cls(payload["path"]))
    record = {"initial_params": _snapshot(params), "initial_buffers": _snapshot(model.buffers()), "steps": []}
    for step in range(case.steps):
        add_late_groups(case, opt, params, step)
        opt.zero_grad(set_to_none=case.set_to_none)
        _reset_outside_optimizer(case, opt, params)
        train_micro_steps(case, ddp, opt, rank, device, step)
        grads = _snapshot([p.grad for p in params])
        with record_collectives() as rec:
            opt.step()
        apply_lr_schedule(case, opt)
        sd = opt.state_dict()
        record["steps"].append({
            "grads": grads,
            "params": _snapshot(params),
            "state": _on_every_rank(lambda: _state_by_param(sd, opt, index), device,
                                    "reading the consolidated state_dict"),
            "state_bytes": measured_state_bytes(_local_state(opt)),
            "traffic": rec.traffic().entries,
            "owners": _owners(opt, index, len(params)),
        })
    record["final_state_dict"] = sd
    return record


def _build_zero(case: Case, model, cls):
    params = list(model.parameters())
    bucket = case.bucket_size_mb if case.bucket_size_mb is not None else 25.0

    def make(groups, optimizer_cls, **kwargs):
        return cls(model, optimizer_cls, params=groups, bucket_size_mb=bucket, **kwargs)

    return params, build_optimizer(case, params, optimizer_cls=make)


def run_zero(payload: dict) -> dict:
    """Train ``case`` with the ZeRO wrapper at ``payload['path']`` (gradient sync included)."""
    case: Case = payload["case"]
    rank = dist.get_rank()
    device = _device(payload.get("device"))
    model = build_case_model(case, rank, device=device)
    params, zero = _build_zero(case, model, _cls(payload["path"]))
    index = {id(p): i for i, p in enumerate(params)}
    trainable = getattr(zero, "trainable", [p for p in params if p.requires_grad])
    record = {"initial_params": _snapshot(params), "initial_buffers": _snapshot(model.buffers()), "steps": []}
    full_gradients = getattr(zero, "full_gradients", None)
    drv = DDPDriver(wrapper=zero, forward=zero, finish=lambda optimizer: zero.finish_gradient_synchronization(),
                    no_sync=getattr(zero, "no_sync", None))
    for step in range(case.steps):
        add_late_groups(case, zero, params, step)
        zero.zero_grad(set_to_none=case.set_to_none)
        with record_collectives() as rec:
            train_micro_steps(case, drv, zero, rank, device, step)
        entry = {}
        if full_gradients is not None:
            grads = [None] * len(params)
            for p, g in zip(trainable, full_gradients()):
                grads[index[id(p)]] = g
            entry["grads"] = _snapshot(grads)
        with record_collectives() as rec_step:
            zero.step()
        apply_lr_schedule(case, zero)
        sd = zero.state_dict()
        opt = getattr(zero, "optimizer", zero)
        entry.update({
            "params": _snapshot(params),
            "state": _on_every_rank(lambda: _state_by_param(sd, opt, index), device,
                                    "reading the consolidated state_dict"),
            "state_bytes": measured_state_bytes(_local_state(zero)),
            "traffic": (rec.traffic() + rec_step.traffic()).entries,
        })
        record["steps"].append(entry)
    pieces = getattr(zero, "pieces", None)
    if pieces is not None:
        record["pieces"] = tuple((index[id(trainable[pc.param])], pc.start, pc.length) for pc in pieces)
        record["bucket_numels"] = tuple(b.numel for b in zero.layout.buckets)
    record["final_state_dict"] = sd
    return record


def _on_every_rank(fn, device, what: str):
    """``fn()``, raising on every rank when it raises on any (the rank's own error where it has
    one). The harness's per-rank reading of a target's state_dict can fail on some ranks only (a
    consolidation bug leaves a rank without state it should see); the other ranks would go on to
    the next collective and wait there until the process-group timeout, so such a bug cost a
    timeout per example and per shrink step instead of failing at once."""
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
    """Load ``payload['state_dict']`` (saved at any world size) into a fresh target whose
    parameters are ``payload['params']``, with every group of the case; record the consolidated
    state, then step once with the deterministic gradient ``payload['grads']`` (identical on all
    ranks) and record parameters and state again."""
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
        return _state_by_param(opt.state_dict(), owner, index)

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
    return {"loaded": loaded, "params": _snapshot(params), "state": _state_by_param(opt.state_dict(), owner, index)}


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


def check_sharding_properties(case: Case, traj, ranks: list[dict], kind: str, properties=None) -> Divergence | None:
    """The first violation of the selected ``memory`` / ``balance`` / ``traffic`` properties (the
    ``equivalence`` and ``state`` ones are ``paracheck.check.compare``'s), or None."""
    props = resolve_properties(properties)
    if not props & {"memory", "balance", "traffic"}:
        return None
    params = _case_params(case)
    esize = [p.element_size() for p in params]
    nbytes = [p.numel() * p.element_size() for p in params]
    options, added = _group_of(case, params)
    models = [state_model(case.optimizer.name, options[i]) if i in options else None for i in range(len(params))]
    trainable = [i for i, p in enumerate(params) if p.requires_grad]
    for k, oref in enumerate(traj.steps):
        stateful = set(oref.state)
        if kind == "zero":
            d = _check_zero_step(case, k, ranks, props, params, models, stateful, trainable)
        else:
            d = _check_sharded_step(case, k, ranks, props, params, models, stateful, nbytes, esize, added)
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
                return _diverge(k, "balance", r, f"rank {r} declares owners {other}, rank 0 {owners}: "
                                                 f"every rank must compute the same partition")
    in_opt = [i for i in range(len(params)) if i in added and (added[i] is None or added[i] <= k)]
    if owners is not None and "balance" in props:
        unowned = [i for i in in_opt if owners[i] is None]
        if unowned:
            return _diverge(k, "balance", 0, f"parameters {unowned} are in the optimizer but owned by no rank",
                            index=unowned[0])
        weights = {i: nbytes[i] if params[i].requires_grad else 0 for i in in_opt}
        loads = [sum(w for i, w in weights.items() if owners[i] == r) for r in range(W)]
        total, largest = sum(weights.values()), max(weights.values(), default=0)
        if W * max(loads) > total + (W - 1) * largest:
            r = loads.index(max(loads))
            bound = total / W + (W - 1) / W * largest
            return _diverge(k, "balance", r,
                            f"rank {r} owns {max(loads)} bytes of trainable parameters; the bound total/W + (W-1)/W * "
                            f"largest is {total}/{W} + {W - 1}/{W} * {largest} = {bound:g} (loads {loads}, owners "
                            f"{owners})", got=max(loads), expected=bound)
    if owners is not None and "memory" in props:
        for r, rec in enumerate(ranks):
            got = rec["steps"][k]["state_bytes"]
            expected = sharded_state_bytes(owners, r, numels=[p.numel() for p in params], element_sizes=esize,
                                           models=models, stateful=stateful)
            if got != expected:
                return _diverge(k, "memory", r, f"rank {r} holds {got} bytes of optimizer state; its declared "
                                                f"partition gives {expected} (owners {owners}, parameters with "
                                                f"state {sorted(stateful)})", got, expected)
    if "traffic" in props:
        expected = owner_broadcast_traffic([nbytes[i] for i in in_opt if params[i].requires_grad], W)
        for r, rec in enumerate(ranks):
            got = StepTraffic(tuple(tuple(e) for e in rec["steps"][k]["traffic"]))
            if got != expected:
                return _diverge(k, "traffic", r, f"rank {r}'s step issued {got.as_dict()}; the owner-broadcast model "
                                                 f"gives {expected.as_dict()} (name: (calls, payload bytes))",
                                got.payload_bytes, expected.payload_bytes)
    return None


def _check_zero_step(case, k, ranks, props, params, models, stateful, trainable):
    W = case.world_size
    declared = [rec.get("pieces") for rec in ranks]
    e = params[trainable[0]].element_size()
    if declared[0] is not None and "balance" in props:
        covered: dict[int, list[tuple[int, int]]] = {}
        for r, pieces in enumerate(declared):
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
                return _diverge(k, "balance", 0, f"the ranks' pieces of parameter #{i} ({params[i].numel()} elements) "
                                                 f"are {runs}: they must tile it exactly once", index=i)
        loads = [sum(n for _, _, n in pieces) for pieces in declared]
        bound = sum(-(-n // W) for n in ranks[0]["bucket_numels"])
        if max(loads) > bound:
            r = loads.index(max(loads))
            return _diverge(k, "balance", r, f"rank {r} owns {max(loads)} elements; the bound sum_b ceil(n_b/W) is "
                                             f"{bound} (loads {loads})", max(loads), bound)
    if declared[0] is not None and "memory" in props:
        for r, rec in enumerate(ranks):
            pieces = [Piece(i, s, n, 0, 0) for i, s, n in declared[r]]
            expected = flat_state_bytes(pieces, element_size=e, models=models, stateful=stateful)
            got = rec["steps"][k]["state_bytes"]
            if got != expected:
                return _diverge(k, "memory", r, f"rank {r} holds {got} bytes of optimizer state; its pieces give "
                                                f"{expected} (parameters with state {sorted(stateful)})", got, expected)
    if "traffic" in props:
        bucket = case.bucket_size_mb if case.bucket_size_mb is not None else 25.0
        layout = flat_layout([params[i].numel() for i in trainable], W,
                             bucket_numel=max(1, int(bucket * 2**20) // e))
        syncs = 1 if case.no_sync else case.accumulation
        expected = zero1_traffic(layout, e, syncs=syncs)
        for r, rec in enumerate(ranks):
            got = StepTraffic(tuple(tuple(x) for x in rec["steps"][k]["traffic"]))
            if got != expected:
                return _diverge(k, "traffic", r, f"rank {r}'s step issued {got.as_dict()}; the ZeRO-1 model gives "
                                                 f"{expected.as_dict()} (name: (calls, payload bytes))",
                                got.payload_bytes, expected.payload_bytes)
    return None
