"""Rank-side helpers of the optimizer-sharding kinds (``sharded``, ``zero``, reload): reading a
target's optimizer state (Note [State dict conventions]), its declared owners, the LR scheduler
a target can carry, the closure for ``step(closure)``, and building a ZeRO wrapper."""

from __future__ import annotations

import inspect
from dataclasses import replace

import torch

from paracheck.accounting.memory import measured_state_bytes
from paracheck.accounting.traffic import StepTraffic, record_collectives
from paracheck.cases import Case, batch_for, build_optimizer, build_scheduler, loss_fn
from paracheck.check.ranks._common import on_every_rank, train_micro_steps
from paracheck.check.ranks._drive import DDPDriver

__all__ = [
    "Closure",
    "build_zero",
    "declared_owners",
    "minus",
    "read_masters",
    "record_masters",
    "read_state",
    "scheduler_or_skip",
    "StateWatch",
    "state_by_param",
    "state_bytes",
    "state_dict_of",
]


def record_masters(case: Case, opt, index: dict[int, int], n: int, device) -> list | None:
    """What a step of ``case`` records of the target's master weights: ``read_masters`` on every
    rank where the case keeps them (Note [Master weights] in ``paracheck.cases``), else None."""
    if not case.master_weights:
        return None
    return on_every_rank(lambda: read_masters(opt, index, n), device, "master_params()")


def read_masters(opt, index: dict[int, int], n: int) -> list:
    """The target's ``master_params()`` (a collective where it gathers them): one tensor (float32
    for a correct target; compared by value, so a master kept in bfloat16 shows as such) or None
    per parameter of its ``param_groups`` (flattened, in order), mapped to the model's
    ``n`` parameters by ``index`` and copied to the CPU (Note [Master weights] in
    ``paracheck.cases``). A ValueError names a list of another length or a master of another
    shape."""
    got = list(opt.master_params())
    order = [p for g in opt.param_groups for p in g["params"]]
    if len(got) != len(order):
        raise ValueError(
            f"master_params() returned {len(got)} tensors for the {len(order)} parameters of "
            f"param_groups: it must return one (or None) per parameter, in their order"
        )
    out: list = [None] * n
    for p, m in zip(order, got):
        if m is None or id(p) not in index:
            continue
        if not torch.is_tensor(m) or tuple(m.shape) != tuple(p.shape):
            what = f"shape {tuple(m.shape)}" if torch.is_tensor(m) else type(m).__name__
            raise ValueError(
                f"master_params() returned {what} for a parameter of shape {tuple(p.shape)}: "
                f"each master must be a tensor of its parameter's shape"
            )
        out[index[id(p)]] = m.detach().to("cpu", copy=True)
    return out


def inner_optimizers(opt):
    """``opt`` and the optimizers it wraps, outermost first: ``local_optimizer`` / ``optim`` /
    ``optimizer`` attributes followed down (at most four levels), or where none of those names
    holds one, the one attribute of any name that holds a ``torch.optim.Optimizer`` (a wrapper's
    ``self._wrapped``; two such attributes are ambiguous and end the chain)."""
    chain = [opt]
    for _ in range(4):
        nxt = None
        for name in ("local_optimizer", "optim", "optimizer"):
            cand = getattr(chain[-1], name, None)
            if isinstance(cand, torch.optim.Optimizer) and all(cand is not o for o in chain):
                nxt = cand
                break
        if nxt is None:
            attrs = getattr(chain[-1], "__dict__", None)
            others = [
                v
                for v in (attrs.values() if isinstance(attrs, dict) else ())
                if isinstance(v, torch.optim.Optimizer) and all(v is not o for o in chain)
            ]
            nxt = others[0] if len(others) == 1 else None
        if nxt is None:
            break
        chain.append(nxt)
    return chain


def local_state(opt):
    """The state mapping of this rank's innermost wrapped optimizer (``opt.state`` if none; None
    for a target without either: the interface does not require one)."""
    return getattr(inner_optimizers(opt)[-1], "state", None)


def state_bytes(opt) -> int | None:
    state = local_state(opt)
    return None if state is None else measured_state_bytes(state)


def reachable_optimizers(opt, depth: int = 3) -> list:
    """``opt`` (where it has a ``state``) and every ``torch.optim.Optimizer`` reachable from it
    through attributes, and lists, tuples and dict values of them, ``depth`` levels down; each
    once. Tensors and modules are not entered."""
    found: list = []
    seen: set[int] = set()
    level = [opt]
    for _ in range(depth + 1):
        nxt: list = []
        for obj in level:
            if id(obj) in seen or torch.is_tensor(obj) or isinstance(obj, torch.nn.Module):
                continue
            seen.add(id(obj))
            if isinstance(obj, (list, tuple)):
                nxt.extend(obj)
                continue
            if isinstance(obj, dict):
                nxt.extend(obj.values())
                continue
            if isinstance(obj, torch.optim.Optimizer) or (obj is opt and hasattr(obj, "state")):
                found.append(obj)
            attrs = getattr(obj, "__dict__", None)
            if isinstance(attrs, dict) and (obj is opt or isinstance(obj, torch.optim.Optimizer)):
                nxt.extend(v for k, v in attrs.items() if k not in ("state", "param_groups"))
        level = nxt
    return found


class StateWatch:
    """Which model parameters' optimizer state this rank *steps* (Note [State stepped on two
    ranks] in ``paracheck.check.properties.memory``): after each step, the state tensors of the
    parameter's own shape, keyed by the parameter itself in any optimizer reachable from the
    target, compared with this rank's copy from the step before."""

    def __init__(self, index: dict[int, int]):
        self.index = index
        self.previous: dict[int, list] = {}

    def stepped(self, opt) -> tuple[int, ...]:
        """The parameters whose whole-shaped state this rank held before this step and changed
        in it; remembers this step's state for the next."""
        now: dict[int, list] = {}
        for o in reachable_optimizers(opt):
            state = getattr(o, "state", None)
            if not hasattr(state, "items"):
                continue
            for key, entry in list(state.items()):
                i = self.index.get(id(key)) if torch.is_tensor(key) else None
                if i is None or not hasattr(entry, "values"):
                    continue
                now.setdefault(i, []).extend(
                    v.detach().to("cpu", copy=True)
                    for v in entry.values()
                    if torch.is_tensor(v) and v.shape == key.shape and v.numel() > 0
                )
        changed = tuple(
            sorted(
                i
                for i, vs in now.items()
                if i in self.previous
                and (
                    len(vs) != len(self.previous[i])
                    or any(not _same_bits(a, b) for a, b in zip(vs, self.previous[i]))
                )
            )
        )
        self.previous = now
        return changed


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality (a NaN kept is unchanged)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))


def group_sizes(groups) -> list[int]:
    return [len(g["params"]) for g in groups]


def state_by_param(state_dict: dict, opt, index: dict[int, int]) -> tuple[dict | None, str]:
    """The state in ``state_dict`` keyed by index into the model's parameters, and how its indices
    were read (Note [State dict conventions]); (None, why) when they name no optimizer's groups.
    Never raises on a state dict in torch's format."""
    saved = state_dict.get("param_groups") if isinstance(state_dict, dict) else None
    state = state_dict.get("state") if isinstance(state_dict, dict) else None
    if isinstance(state_dict, dict) and _empty_shard(state_dict):
        # A rank that owns no parameter has no state, and often no wrapped optimizer whose groups
        # the dict could name (Note [State dict conventions]): nothing to map.
        return {}, "an empty shard"
    if not isinstance(saved, (list, tuple)) or not isinstance(state, dict):
        return None, (
            f"state_dict() returned {type(state_dict).__name__} without 'state' (dict) and "
            f"'param_groups' (list): torch's format is required"
        )
    sizes = [len(g.get("params", ())) for g in saved]
    to_model, how = None, ""
    for depth, o in enumerate(inner_optimizers(opt)):
        groups = getattr(o, "param_groups", None)
        if groups is not None and group_sizes(groups) == sizes:
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
            f"param_groups ({group_sizes(getattr(opt, 'param_groups', []))}) nor a wrapped "
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


def _empty_shard(state_dict: dict) -> bool:
    """Whether ``state_dict`` holds no parameter's state: ``{}``, or a ``state`` with no entry
    (or only empty ones) beside any ``param_groups`` list."""
    state = state_dict.get("state", {})
    groups = state_dict.get("param_groups", [])
    return (
        isinstance(state, dict)
        and isinstance(groups, (list, tuple))
        and not any(st for st in state.values())
    )


def state_dict_of(opt):
    """``opt.state_dict()`` on this rank, read the way the target offers it (Note [State dict
    conventions]): a target with ``consolidate_state_dict(to=...)`` (torch's
    ZeroRedundancyOptimizer protocol, where only the receiving rank may call ``state_dict()``) is
    consolidated onto rank 0, whose dict every rank then receives. A collective for such a
    target (and for any target whose ``state_dict()`` is one): call it on every rank."""
    consolidate = getattr(opt, "consolidate_state_dict", None)
    if not callable(consolidate):
        return opt.state_dict()
    import torch.distributed as dist

    try:
        inspect.signature(consolidate).bind(to=0)
        takes_to = True
    except TypeError:  # takes no ``to``: consolidates onto rank 0 (or everywhere) by itself
        takes_to = False
    except ValueError:  # no signature to read
        takes_to = True
    if takes_to:
        consolidate(to=0)
    else:
        consolidate()
    # Every rank asks: the receiving rank's state_dict() may itself be a collective (a design that
    # also broadcasts it). Another rank's may refuse (torch raises RuntimeError there); rank 0's is
    # the dict, on every rank.
    if dist.get_rank() == 0:
        sd = opt.state_dict()
    else:
        try:
            sd = opt.state_dict()
        except RuntimeError:
            sd = None
    if dist.get_world_size() == 1:
        return sd
    box = [sd]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def read_state(opt, index: dict[int, int]):
    """(state_dict(), its state by parameter or None, how it was read): one call of the target's
    ``state_dict()``, a collective for a consolidating target."""
    sd = state_dict_of(opt)
    state, how = state_by_param(sd, opt, index)
    return sd, state, how


def declared_owners(opt, index: dict[int, int], n: int):
    owners = getattr(getattr(opt, "partition", None), "owners", None)
    if owners is None:
        return None
    out = [None] * n
    for p, o in zip((p for g in opt.param_groups for p in g["params"]), owners):
        out[index[id(p)]] = int(o)
    return tuple(out)


def minus(a: StepTraffic, b: StepTraffic) -> StepTraffic:
    d = a.as_dict()
    for k, c, n in b.entries:
        c0, n0 = d[k]
        d[k] = (c0 - c, n0 - n)
    return StepTraffic.from_dict(d)


def scheduler_or_skip(case: Case, opt, device):
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

    return on_every_rank(build, device, "building the LR scheduler")


class Closure:
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


def build_zero(case: Case, model, cls):
    params = list(model.parameters())
    bucket = case.bucket_mb

    def make(groups, optimizer_cls, **kwargs):
        return cls(model, optimizer_cls, params=groups, bucket_size_mb=bucket, **kwargs)

    return params, build_optimizer(case, params, optimizer_cls=make)
