"""Reading a target's interface without calling it: how its constructor is called, which of its
methods are its hooks, what it declares (master weights, a gather method), and which of the CS336
adapter functions a module implements; whether its class fits the kind it is checked as
(``kind_mismatch``) and which optional case features it cannot be asked for (``unsupported``),
each with the method it lacks. Pure inspection, used by the driver to resolve a target before
any case runs and by the rank programs to construct it the same way.

Note [Readings of a DDP interface]
  A false failure on correct code is the worst result a check can give, so a DDP target is
  read by names, never by the position of its arguments alone (``ddp_construction``): the
  first argument receives the module whatever its name; the bucket size goes to the argument
  whose name says bucket (``bucket_size_mb``, ``bucket_mb``, ``bucket_cap_mb``, ``bucket_size``,
  ...; one whose name says bytes gets bytes), by keyword; required ``rank``, ``world_size``,
  ``process_group``/``group`` and ``device`` arguments are supplied; any other argument with a
  default keeps it (``DDP(module, use_async_comm=True)`` is not bucketed). The hooks are
  ``finish_gradient_synchronization()`` and ``on_train_batch_start()`` unless named otherwise
  (``Target.finish``, ``Target.batch_start``: a method name, or ``module:function`` called as
  ``f(ddp_model, optimizer)``); a method that takes a required argument is given the optimizer.
  The wrapper need not be an ``nn.Module``: it is called, or its ``forward`` is.


Note [Not implemented]
  The handout's stubs are ``raise NotImplementedError``. A function counts as not implemented
  when its body, docstring aside, is that one statement (read from its source; it is never
  called: a constructor would need a process group, and an implemented one may issue
  collectives). A body of ``pass`` is an implementation (a batch-start hook often has nothing to
  do); so is any body that raises NotImplementedError only on some path. A function whose source
  cannot be read counts as implemented. A design is checked when its constructor and its
  after-backward function are implemented; a batch-start function not implemented is left out
  (the wrapper's ``on_train_batch_start()``, if any, runs instead).
"""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap
from dataclasses import dataclass

from paracheck.check.kinds import GRADIENTS, KINDS, OPTIMIZER, PARAMETERS, STEP
from paracheck.check.loading import TargetError, import_module, load_object

__all__ = [
    "DESIGNS",
    "GATHER_METHODS",
    "RESHARD_PER_RANK",
    "AdapterDesign",
    "Construction",
    "check_supplied",
    "companion_hooks",
    "ddp_construction",
    "declares",
    "function_status",
    "kind_mismatch",
    "gather_candidates",
    "missing_hook_message",
    "not_implemented",
    "plausible_hooks",
    "resolve_hook",
    "takes_keyword",
    "unsupported",
]

# The methods that give an FSDP's parameters whole, tried in order where none is named (Note
# [Reading an FSDP] in paracheck.check.ranks.fsdp).
GATHER_METHODS = ("gather_full_params", "full_parameters", "gather_params")


# -- what a target declares ---------------------------------------------------------------------


@functools.cache
def declares(path: str, reading: str | None) -> bool:
    """Whether the target at ``path`` offers ``reading``, one of a kind's readings
    (``Kind.step_gradients``, ``Kind.masters``): ``"param.grad"`` always, ``"NAME()"`` a method
    of it, ``"NAME="`` a keyword its constructor names; None never. False where it does not
    load."""
    if reading is None:
        return False
    if reading == "param.grad":
        return True
    try:
        obj = load_object(path)
    except TargetError:
        return False
    if reading.endswith("()"):
        return callable(getattr(obj, reading[:-2], None))
    if reading.endswith("="):
        return takes_keyword(obj, reading[:-1])
    raise ValueError(f"reading={reading!r} must be 'param.grad', 'NAME()' or 'NAME='")


def takes_keyword(cls, name: str) -> bool:
    """Whether ``cls(module, ...)`` names the keyword ``name`` (a ``**kwargs`` does not count: what
    it passes the keyword on to is not known)."""
    try:
        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return False
    return name in params and params[name].kind in (
        params[name].KEYWORD_ONLY,
        params[name].POSITIONAL_OR_KEYWORD,
    )


# -- reading a DDP constructor ------------------------------------------------------------------


@dataclass(frozen=True)
class Construction:
    """How to call a DDP constructor (Note [Readings of a DDP interface]): ``positional`` and
    ``keywords`` name what each argument receives: ``module``, ``bucket_mb``, ``bucket_bytes``,
    ``rank``, ``world_size``, ``process_group`` or ``device``."""

    positional: tuple[str, ...]
    keywords: tuple[tuple[str, str], ...] = ()

    @property
    def takes_bucket(self) -> bool:
        return any(
            w.startswith("bucket") for w in self.positional + tuple(w for _, w in self.keywords)
        )


_SUPPLIED = {
    "rank": "rank",
    "world_size": "world_size",
    "process_group": "process_group",
    "group": "process_group",
    "pg": "process_group",
    "device": "device",
}


def _bucket_role(name: str) -> str | None:
    low = name.lower()
    if "bucket" not in low:
        return None
    return "bucket_bytes" if "byte" in low else "bucket_mb"


def _ddp_reading(fn) -> tuple[Construction, list[inspect.Parameter]]:
    """How to call the DDP constructor ``fn`` and its required arguments it cannot supply (Note
    [Readings of a DDP interface]); TargetError where it cannot take the module. Pure."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return Construction(("module",)), []
    params = list(sig.parameters.values())
    if params and params[0].name == "self" and not inspect.isclass(fn):
        params = params[1:]
    if not params:
        raise TargetError("the constructor takes no argument: it must take the module to wrap")
    first, rest = params[0], params[1:]
    positional, keywords = [], []
    if first.kind == first.KEYWORD_ONLY:
        keywords.append((first.name, "module"))
    elif first.kind == first.VAR_KEYWORD:
        raise TargetError("the constructor takes only **kwargs: it must take the module to wrap")
    else:
        positional.append("module")
    unknown_required = []
    for p in rest:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        role = _bucket_role(p.name) or (_SUPPLIED.get(p.name) if p.default is p.empty else None)
        if role is None:
            if p.default is p.empty:
                unknown_required.append(p)
            continue
        if p.kind == p.POSITIONAL_ONLY:
            if len(positional) != params.index(p):
                raise TargetError(
                    f"argument {p.name!r} is positional-only after an argument paracheck leaves out"
                )
            positional.append(role)
        else:
            keywords.append((p.name, role))
    has_bucket = any(r.startswith("bucket") for r in positional + [r for _, r in keywords])
    # One more required argument whose name speaks of a size, and no bucket argument: the bucket
    # size under another name (DDP(module, size_mb)).
    if (
        len(unknown_required) == 1
        and not has_bucket
        and any(s in unknown_required[0].name.lower() for s in ("mb", "size", "cap"))
    ):
        p = unknown_required.pop()
        keywords.append(
            (p.name, "bucket_mb")
        ) if p.kind != p.POSITIONAL_ONLY else positional.append("bucket_mb")
    return Construction(tuple(positional), tuple(keywords)), unknown_required


def ddp_construction(fn) -> Construction:
    """Read the constructor (class or function) of a DDP target by its argument names; raises
    TargetError naming an argument it cannot supply. Pure: inspects, never calls."""
    construction, unknown = _ddp_reading(fn)
    if unknown:
        raise TargetError(_unsupplied("the constructor", fn, "ddp", [p.name for p in unknown]))
    return construction


# -- arguments paracheck cannot supply ----------------------------------------------------------


def _passes(kind: str) -> str:
    """What the rank program of ``kind`` passes to the constructor (``Kind.constructor``)."""
    constructor = KINDS[kind].constructor
    return "nothing: it is called, not constructed" if constructor is None else constructor.passes


def _unsupplied(name: str, obj, kind: str, missing: list[str]) -> str:
    them = "it a default" if len(missing) == 1 else "them defaults"
    what = "class" if inspect.isclass(obj) else "function"
    return (
        f"{name} requires {', '.join(missing)}, which paracheck does not supply; give {them} or "
        f"wrap the {what} (paracheck passes {_passes(kind)})"
    )


def _missing(obj, kind: str) -> list[str]:
    """The required arguments of ``obj``'s constructor that the rank program of ``kind`` does not
    pass (nothing where its signature cannot be read)."""
    constructor = KINDS[kind].constructor
    if constructor is None:
        return []
    if constructor.by_names:
        try:
            return [p.name for p in _ddp_reading(obj)[1]]
        except TargetError:
            return []  # cannot take the module: ddp_construction says so
    try:
        params = list(inspect.signature(obj).parameters.values())
    except (TypeError, ValueError):
        return []
    if params and params[0].name == "self" and not inspect.isclass(obj):
        params = params[1:]
    # Class(*first, **kwargs), the keywords of ``by_name`` passed by name where it takes them.
    # Hyper-parameters come as keywords in some cases only.
    missing, positional = [], 0
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if p.kind != p.KEYWORD_ONLY and positional < len(constructor.first):
            positional += 1
            continue
        if p.default is p.empty and p.name not in constructor.by_name:
            missing.append(p.name)
    return missing


def _not_a_wrapper(obj, kind: str) -> str | None:
    """Why ``obj`` cannot be constructed as a ``kind`` wrapper ``Class(first, optimizer_cls,
    **kwargs)``, or None. Refuses only what fails on every case: fewer than two positional
    arguments, or a second one named ``lr`` (a torch optimizer, which would take the optimizer
    class as its learning rate). A signature that cannot be read is accepted."""
    constructor = KINDS[kind].constructor
    if constructor is None or not constructor.wraps_optimizer:
        return None
    first = constructor.first
    try:
        params = list(inspect.signature(obj).parameters.values())
    except (TypeError, ValueError):
        return None
    if params and params[0].name == "self" and not inspect.isclass(obj):
        params = params[1:]
    if any(p.kind == p.VAR_POSITIONAL for p in params):
        return None
    positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(positional) < 2:
        took = f"({', '.join(positional)})" if positional else "no positional argument"
        return f"takes {took}, not ({', '.join(first)}, ...)"
    if positional[1] == "lr":
        return f"takes ({positional[0]}, lr, ...): an optimizer, not a wrapper of optimizer_cls"
    return None


def check_supplied(obj, kind: str, path: str) -> None:
    """TargetError when the constructor ``obj`` of a ``kind`` target, named ``path`` by the user,
    cannot take what the ``kind``'s rank program passes, or has required arguments that paracheck
    does not supply: it would fail on every case."""
    why = _not_a_wrapper(obj, kind)
    if why is not None:
        name = f"{path}.__init__" if inspect.isclass(obj) else path
        first = KINDS[kind].constructor.first  # type: ignore[union-attr]  # a wrapper has one
        raise TargetError(
            f"--kind {kind}: {name} {why}; a {kind} target is constructed as Class("
            f"{', '.join(first)}, **kwargs) (paracheck passes {_passes(kind)})"
        )
    missing = _missing(obj, kind)
    if missing:
        name = f"{path}.__init__" if inspect.isclass(obj) else path
        raise TargetError(_unsupplied(name, obj, kind, missing))


# -- hooks --------------------------------------------------------------------------------------

# Methods that plausibly are the after-backward / batch-start hook under another name.
_FINISH_WORDS = ("sync", "reduce", "after_backward", "finish", "average_grad", "wait")
_BATCH_START_WORDS = (
    "batch_start",
    "start_batch",
    "on_batch",
    "reset",
    "prepare",
    "before_forward",
    "pre_forward",
)


def _own_methods(cls) -> list[str]:
    """Public methods defined by ``cls`` and its bases other than nn.Module / object."""
    import torch

    base = set(dir(torch.nn.Module)) | set(dir(object))
    return sorted(
        n
        for n in dir(cls)
        if not n.startswith("_") and n not in base and callable(getattr(cls, n, None))
    )


def plausible_hooks(cls, which: str) -> list[str]:
    """``cls``'s methods that plausibly are the ``which`` ("finish" or "batch_start") hook."""
    words = _FINISH_WORDS if which == "finish" else _BATCH_START_WORDS
    skip = {"no_sync", "forward", "finish_gradient_synchronization", "on_train_batch_start"}
    return [n for n in _own_methods(cls) if n not in skip and any(w in n.lower() for w in words)]


def resolve_hook(option: str, value: str, obj, module_name: str, path: str) -> str:
    """A hook named by the user -> a method name (kept) or ``module:function`` (a function of the
    target's module, or an import path). TargetError when it names nothing."""
    if ":" in value:
        fn = load_object(value)
        if not callable(fn):
            raise TargetError(f"{option}={value!r} is a {type(fn).__name__}, not a function")
        return value
    is_class = inspect.isclass(obj)
    if is_class and callable(getattr(obj, value, None)):
        return value
    module = import_module(module_name)
    if callable(getattr(module, value, None)) and not inspect.isclass(getattr(module, value)):
        return f"{module_name}:{value}"
    if not is_class:
        return value  # a method of the object the function returns: checked on the ranks
    others = plausible_hooks(obj, "finish" if option == "--finish" else "batch_start")
    hint = f"; it has {', '.join(m + '()' for m in others)}" if others else ""
    raise TargetError(
        f"{option}={value!r}: target {path!r} has no method {value}() and its module no function "
        f"{value}(){hint}"
    )


def missing_hook_message(cls, path: str) -> str:
    others = plausible_hooks(cls, "finish")
    if others:
        return (
            f"target={path!r} has no finish_gradient_synchronization(); it has {others[0]}(): pass "
            f"--finish {others[0]} (finish=... in paracheck_check) if that synchronises the gradients after "
            f"backward" + (f" (other candidates: {', '.join(others[1:])})" if others[1:] else "")
        )
    return (
        f"target={path!r} fits neither interface: a DDP wrapper needs Class(module[, bucket_size_mb]) with "
        f"finish_gradient_synchronization() (or another method named with --finish NAME); a sharded "
        f"optimizer needs Class(params, optimizer_cls, **kwargs) (a torch.optim.Optimizer subclass). "
        f"Pass --kind to say which it is."
    )


def gather_candidates(cls) -> list[str]:
    """``cls``'s own public methods whose names suggest they return whole parameters."""
    import torch

    words = ("gather", "full", "material", "unshard", "param")
    return [
        m
        for m in dir(cls)
        if not m.startswith("_")
        and m not in dir(torch.nn.Module)
        and callable(getattr(cls, m, None))
        and any(w in m.lower() for w in words)
    ]


# -- the CS336 adapter functions ------------------------------------------------------------------


@dataclass(frozen=True)
class AdapterDesign:
    """One design of the handout: its constructor and hooks (function names) and its kind."""

    title: str
    constructor: str
    kind: str  # "ddp" | "sharded"
    finish: str | None = None
    batch_start: str | None = None

    @property
    def functions(self) -> tuple[str, ...]:
        return tuple(f for f in (self.constructor, self.finish, self.batch_start) if f is not None)


DESIGNS: tuple[AdapterDesign, ...] = (
    AdapterDesign("DDP", "get_ddp", "ddp", "ddp_on_after_backward", "ddp_on_train_batch_start"),
    AdapterDesign(
        "individual-parameters DDP",
        "get_ddp_individual_parameters",
        "ddp",
        "ddp_individual_parameters_on_after_backward",
        "ddp_individual_parameters_on_train_batch_start",
    ),
    AdapterDesign(
        "bucketed DDP",
        "get_ddp_bucketed",
        "ddp",
        "ddp_bucketed_on_after_backward",
        "ddp_bucketed_on_train_batch_start",
    ),
    AdapterDesign("sharded optimizer", "get_sharded_optimizer", "sharded"),
)


def not_implemented(fn) -> bool:
    """Whether ``fn``'s body is only ``raise NotImplementedError`` (Note [Not implemented])."""
    try:
        source = textwrap.dedent(inspect.getsource(inspect.unwrap(fn)))
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError, ValueError):
        return False
    defs = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    if not defs:
        return False
    body = [
        s
        for s in defs[0].body
        if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))
    ]  # docstring, ...
    if len(body) != 1 or not isinstance(body[0], ast.Raise) or body[0].exc is None:
        return False
    exc = body[0].exc.func if isinstance(body[0].exc, ast.Call) else body[0].exc
    return (isinstance(exc, ast.Name) and exc.id == "NotImplementedError") or (
        isinstance(exc, ast.Attribute) and exc.attr == "NotImplementedError"
    )


def function_status(module, name: str) -> str | None:
    fn = getattr(module, name, None)
    if fn is None or not callable(fn):
        return None
    return "not implemented" if not_implemented(fn) else "implemented"


def companion_hooks(fn, path: str) -> dict:
    """The hooks of the design whose constructor is ``fn`` (at import path ``path``), from the
    same module, where implemented: ``{"finish": "module:function", "batch_start": ...}``."""
    design = next((d for d in DESIGNS if d.constructor == getattr(fn, "__name__", None)), None)
    if design is None or design.finish is None:
        return {}
    where = path.rpartition(":")[0]
    module = import_module(where)
    hooks = {}
    for key in ("finish", "batch_start"):
        name = getattr(design, key)
        if name is not None and function_status(module, name) == "implemented":
            hooks[key] = f"{where}:{name}"
    return hooks


# -- what a target's class cannot be asked for: refusals read before any case runs -------------


def _steps_optimizer(kind: str) -> bool:
    """Whether a ``kind`` target owns the optimizer's step (a sharded optimizer, a ZeRO wrapper)."""
    return kind in KINDS and OPTIMIZER in KINDS[kind].owns


def _object(target):
    try:
        return load_object(target.path)
    except TargetError:
        return None


def _is_subclass(obj, module: str, name: str) -> bool:
    import importlib

    try:
        base = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return False
    return inspect.isclass(obj) and issubclass(obj, base)


def kind_mismatch(target) -> str | None:
    """Why ``target``'s class cannot be a target of its kind (None: it can, or it is not a class
    paracheck can read): a DDP or FSDP kind given an optimizer, a sharded optimizer given a
    module, a ZeRO wrapper without ``step()``, a loop given a class: each read from the kind's
    row (its constructor's first arguments, what it owns)."""
    obj = _object(target)
    if obj is None or not inspect.isclass(obj):
        return None  # a function (a loop, get_ddp) or nothing readable: the ranks will say
    kind = target.kind
    row = KINDS.get(kind)
    if row is None:
        return None
    wraps_module = row.constructor is not None and row.constructor.wraps_module
    is_module = _is_subclass(obj, "torch.nn", "Module")
    is_optimizer = _is_subclass(obj, "torch.optim", "Optimizer")
    name = obj.__name__
    if wraps_module and is_optimizer:
        return (
            f"{name} is a torch.optim.Optimizer, not a module wrapper: a {kind} target wraps a "
            "module (Class(module, ...)); check a sharded optimizer with --kind sharded"
        )
    if wraps_module and not is_module and not callable(getattr(obj, "forward", None)):
        return f"{name} has no forward(): a {kind} target wraps a module and runs its forward"
    if row.constructor is not None and row.constructor.is_optimizer and is_module:
        return (
            f"{name} is a torch.nn.Module, not an optimizer: a sharded target is an optimizer "
            "(Class(params, optimizer_cls, **kwargs)); check a module wrapper with --kind ddp"
        )
    if _steps_optimizer(kind) and not callable(getattr(obj, "step", None)):
        return f"{name} has no step(): a {kind} target steps the optimizer it shards"
    if STEP in row.owns:
        return f"{name} is a class: a loop target is a function train_step(model, optimizer, ...)"
    return None


# The methods an optional case feature asks of the target's class, by the kinds that ask it:
# a reload asks an optimizer it steps for its state; no_sync() is a wrapper's that synchronises
# the gradients (without one, the rank program synchronises every micro-step, and the row would
# check plain accumulation under the no-sync name).
def _needed(kind: str, feature: str) -> tuple[str, ...]:
    if feature in ("reload", "reshard") and _steps_optimizer(kind):
        return ("state_dict", "load_state_dict")
    if feature == "no-sync" and kind in KINDS and GRADIENTS in KINDS[kind].owns:
        return ("no_sync",)
    return ()


# Note [Resuming at another world size] in paracheck.check.properties.reshard: a fully sharded
# wrapper's state is per-rank unless its class declares DCP checkpoints (its shards are DTensors,
# which torch.distributed.checkpoint reshards: paracheck.check.ranks.reshard_dcp.DCP).
RESHARD_PER_RANK = (
    "its optimizer steps each rank's own shard parameters, so its state is per-rank by contract "
    "and cannot be loaded at another world size (a wrapper of DTensor shards declares "
    'paracheck_checkpoint = "torch.distributed.checkpoint")'
)
_DCP = "torch.distributed.checkpoint"


def unsupported(target, feature: str) -> str | None:
    """Why ``target`` cannot be asked for the optional case ``feature`` (None: it can): the method
    its class lacks, as "Class has no no_sync()". A target that is not a class (a function that
    builds the wrapper: an adapter) is not read here: the rank program runs what it returns."""
    if feature == "reshard" and target.kind in KINDS and PARAMETERS in KINDS[target.kind].owns:
        obj = _object(target)
        return None if getattr(obj, "paracheck_checkpoint", None) == _DCP else RESHARD_PER_RANK
    declined = _declined(target, feature)
    if declined is not None:
        return declined
    needed = _needed(target.kind, feature)
    if not needed:
        return None
    obj = _object(target)
    if obj is None or not inspect.isclass(obj):
        return None
    missing = [m for m in needed if not callable(getattr(obj, m, None))]
    if missing:
        return f"{obj.__name__} has no {missing[0]}()"
    return None


def _declined(target, feature: str) -> str | None:
    """Why a target's class declines ``feature`` in ``unsupported_case_features`` (the ``Case``
    field it sets -> why), as the rank program skips each such case: None where it does not."""
    from paracheck.check.features import FEATURES

    field = next((f.field for f in FEATURES if f.name == feature), None)
    obj = _object(target) if field is not None else None
    declared = getattr(obj, "unsupported_case_features", None) if inspect.isclass(obj) else None
    if not isinstance(declared, dict) or field not in declared:
        return None
    return f"{obj.__name__} declares {field} unsupported: {declared[field]}"
