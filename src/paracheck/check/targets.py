"""Targets: what ``paracheck check`` can check, by built-in name or import path.

A target is ``(kind, import path)``. Kinds:

* ``ddp``: a DDP wrapper with the CS336 interface: ``Class(module)`` or
  ``Class(module, bucket_size_mb)``, ``forward``, ``finish_gradient_synchronization()``, and
  optionally ``on_train_batch_start()`` and ``no_sync()``; or a function ``get_ddp(module)``
  returning one, with the after-backward hook a function ``f(ddp_model, optimizer)``
  (``paracheck.check.adapters``);
* ``sharded``: an optimizer ``Class(params, optimizer_cls, **kwargs)`` (CS336 ShardedOptimizer),
  or a function of that signature; gradients are synchronised by paracheck's FlatDDP before its
  ``step()``;
* ``zero``: a ZeRO wrapper ``Class(module, optimizer_cls, *, params, bucket_size_mb, **kwargs)``
  that synchronises gradients itself (``paracheck.zero.Zero1``).

The import path is ``package.module:Name`` or ``path/to/file.py:Name`` (the file is imported
by location, with its directory, or its package's root, on ``sys.path``; the ranks do the same).

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

Each kind's rank program and properties, and how a target selects a subset
(``Target.properties``), are in ``paracheck.check.kinds``.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import importlib.util
import inspect
import os
import signal
import sys
import threading
from dataclasses import dataclass, field

__all__ = [
    "Target",
    "BUILTIN_TARGETS",
    "Construction",
    "check_supplied",
    "ddp_construction",
    "resolve_target",
    "TargetError",
    "load_object",
    "plausible_hooks",
    "with_reduce_dtype",
]


class TargetError(ValueError):
    """A target that cannot be used: unknown name, import failure, or unusable interface."""


@dataclass(frozen=True)
class Target:
    name: str
    path: str  # "package.module:Class" or "/abs/file.py:function"
    kind: str  # "ddp" | "sharded" | "zero" | "zero2" | "fsdp" | "loop"
    takes_bucket: bool = False
    # Which properties a check runs (None: the kind's defaults; paracheck.check.kinds).
    properties: frozenset[str] | None = None
    # DDP hooks (Note [Readings of a DDP interface]): a method name, or "module:function" called as
    # f(ddp_model, optimizer); None: finish_gradient_synchronization() / on_train_batch_start().
    finish: str | None = None
    batch_start: str | None = None
    # Replace CUDA timing/instrumentation calls by no-ops on the ranks (paracheck.check.ranks._cuda_stub).
    stub_cuda_timing: bool = False
    # What resolving the target found worth saying (a plausible hook not used, ...); not checked.
    notes: tuple[str, ...] = field(default=(), compare=False)
    # loop: the loss semantics the step minimises (Note [Loss semantics]): --loss, else the
    # function's ``paracheck_loss`` attribute, else "token-mean".
    loss: str | None = None
    # loop: the global gradient norm the step clips to (``clip_grad_norm_``), or None: the
    # function's ``paracheck_clip_norm`` attribute, or --clip-norm.
    clip_norm: float | None = None
    # ddp: the dtype the target declares it reduces gradients in (Note [Declared reduction
    # dtype]): --reduce-dtype, else the class's ``paracheck_reduce_dtype`` attribute, else None.
    reduce_dtype: str | None = None
    # loop: the dtype the step's forwards autocast to (Note [A loop's own precision]): the
    # function's ``paracheck_autocast`` attribute, else None; and whether the step takes a
    # ``scaler`` (a ``torch.amp.GradScaler``, passed where the case scales its loss).
    autocast: str | None = None
    scaler: bool = False
    # fsdp: how the check reads the parameters whole (Note [Reading an FSDP]): a method name, or
    # "module:function" called as f(wrapper); None: the first of GATHER_METHODS the wrapper has.
    gather: str | None = None

    @property
    def master_weights(self) -> bool:
        """A sharding target that keeps float32 master weights of bfloat16 parameters, declared by
        a ``master_params()`` method (Note [Master weights] in ``paracheck.cases``), or a fully
        sharded wrapper whose constructor takes ``compute_dtype`` (its float32 shards are the
        masters of the parameters it computes with: Note [Compute dtype of an FSDP])."""
        if self.kind == "fsdp":
            return _takes_compute_dtype(self.path)
        return self.kind in ("sharded", "zero", "zero2") and _has_master_params(self.path)

    @property
    def reports_gradients(self) -> bool:
        """Whether the rank program records the gradients of every step (a sharded optimizer's
        are its parameters' ``.grad``; a ZeRO wrapper reports them by ``full_gradients()``): a
        sharding target's step is then judged on them (Note [Comparing an update])."""
        if self.kind in ("zero", "zero2"):
            return _has_method(self.path, "full_gradients")
        return self.kind in ("sharded", "loop")

    @property
    def rank_fn(self) -> str:
        """The rank program of the target's kind (``paracheck.check.kinds.KINDS``)."""
        from paracheck.check.kinds import KINDS

        row = KINDS[self.kind]
        return row.stubbed_rank_fn if self.stub_cuda_timing else row.rank_fn

    def driver_payload(self) -> dict:
        """The payload keys the rank programs read about the target (``paracheck.check.ranks._drive``)."""
        return {
            "path": self.path,
            "takes_bucket": self.takes_bucket,
            "finish": self.finish,
            "batch_start": self.batch_start,
            "scaler": self.scaler,
            "gather": self.gather,
        }

    def cli_options(self) -> str:
        """The ``paracheck check`` options, after the target's name, that reproduce this target."""
        out = ""
        if self.finish is not None:
            out += f" --finish {self.finish}"
        if self.batch_start is not None:
            out += f" --batch-start {self.batch_start}"
        if self.stub_cuda_timing:
            out += " --stub-cuda-timing"
        if self.loss is not None:
            out += f" --loss {self.loss}"
        if self.clip_norm is not None:
            out += f" --clip-norm {self.clip_norm:g}"
        if self.reduce_dtype is not None:
            out += f" --reduce-dtype {self.reduce_dtype}"
        if self.gather is not None:
            out += f" --gather {self.gather}"
        return out


# name -> (path, kind).
BUILTIN_TARGETS: dict[str, tuple[str, str]] = {
    "naive": ("paracheck.ddp:NaiveDDP", "ddp"),
    "flat": ("paracheck.ddp:FlatDDP", "ddp"),
    "overlapped": ("paracheck.ddp.overlapped:OverlappedDDP", "ddp"),
    "bucketed": ("paracheck.ddp.bucketed:BucketedDDP", "ddp"),
    "torch-ddp": ("paracheck.ddp.torch_ddp:TorchDDP", "ddp"),
    "sharded": ("paracheck.zero:ShardedOptimizer", "sharded"),
    "sharded-master": ("paracheck.zero:MasterWeightsShardedOptimizer", "sharded"),
    "zero1": ("paracheck.zero:Zero1", "zero"),
    "zero1-master": ("paracheck.zero:MasterWeightsZero1", "zero"),
    "zero2": ("paracheck.zero:Zero2", "zero2"),
    "torch-zero": ("paracheck.zero.torch_zero:TorchZero", "sharded"),
    "fsdp": ("paracheck.fsdp:FSDP", "fsdp"),
    "torch-fsdp": ("paracheck.fsdp.torch_fsdp:TorchFSDP", "fsdp"),
    "loop": ("paracheck.loop:train_step", "loop"),
    "loop-batch-mean": ("paracheck.loop:train_step_batch_mean", "loop"),
}

# Built-ins checked on a subset of properties by default. torch's ZeroRedundancyOptimizer breaks
# "balance" and "traffic" by design (docs/findings-torch-zero.md); select them explicitly to see it.
BUILTIN_PROPERTIES: dict[str, frozenset[str]] = {
    "torch-zero": frozenset({"equivalence", "float64-bound", "state", "memory"}),
    # torch's fully_shard reduce-scatters a module called twice per forward twice in the backward
    # after a no_sync() micro-batch (docs/findings-torch-fsdp.md): select reduced-once to see it.
    "torch-fsdp": frozenset(
        {"equivalence", "float64-bound", "freed", "gather-dtype", "params-sharded"}
    ),
}


# -- importing ----------------------------------------------------------------------------------


def _is_file_spec(module: str) -> bool:
    return module.endswith(".py") or "/" in module or os.sep in module


def _import_file(spec: str):
    """Import the .py file ``spec``: as ``package.module`` when it lies in a package (so its
    relative imports work), else by location; its directory, or its package's root, goes on
    ``sys.path`` so that its own imports of neighbouring modules work, here and in the ranks, and
    so does the working directory, last."""
    path = os.path.abspath(spec)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no such file: {path}")
    root, parts = os.path.dirname(path), [os.path.splitext(os.path.basename(path))[0]]
    while os.path.isfile(os.path.join(root, "__init__.py")) and os.path.dirname(root) != root:
        parts.insert(0, os.path.basename(root))
        root = os.path.dirname(root)
    if root not in sys.path:
        sys.path.insert(0, root)
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.append(
            os.getcwd()
        )  # the project it belongs to, run from its root (tests/adapters.py)
    if len(parts) > 1:
        dotted = ".".join(parts)
        try:
            mod = importlib.import_module(dotted)
            if os.path.abspath(getattr(mod, "__file__", "") or "") == path:
                return mod
        except ImportError:
            pass  # a package of the same name shadows it: load by location below
    name = f"_paracheck_file_{hashlib.sha1(path.encode()).hexdigest()[:12]}_{parts[-1]}"
    if name in sys.modules:
        return sys.modules[name]
    spec_ = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec_)
    sys.modules[name] = mod
    try:
        spec_.loader.exec_module(mod)
    except BaseException:
        del sys.modules[name]
        raise
    return mod


def import_module(module: str):
    """``package.module`` or ``path/to/file.py`` -> the module (see ``_import_file``). A dotted
    name not found is looked for in the working directory too, as ``python -m`` would (the
    ``paracheck`` script does not put it on ``sys.path``)."""
    if _is_file_spec(module):
        return _import_file(module)
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        cwd = os.getcwd()
        if exc.name != module.split(".")[0] or cwd in sys.path or "" in sys.path:
            raise
        sys.path.append(cwd)
        return importlib.import_module(module)


@functools.cache
def _has_master_params(path: str) -> bool:
    return _has_method(path, "master_params")


@functools.cache
def _has_method(path: str, name: str) -> bool:
    try:
        return callable(getattr(load_object(path), name, None))
    except TargetError:
        return False


@functools.cache
def _takes_compute_dtype(path: str) -> bool:
    try:
        return takes_keyword(load_object(path), "compute_dtype")
    except TargetError:
        return False


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


# Note [Importing a target]
#   A target's module runs its top level when imported, in the driver and in every rank. Three
#   things there would end or stall the check without a verdict: ``sys.exit`` (a script that
#   trains at import and exits 0: the driver exited 0 having checked nothing), ``os._exit``, and
#   a top level that never returns (it waits for a process group or for input). While a target
#   is imported, ``os._exit`` raises ``ExitAtImport`` instead, ``SystemExit`` is caught, and,
#   where the import runs in the main thread and nothing else uses SIGALRM, an interval timer
#   raises ``ImportTimeout`` after ``IMPORT_SECONDS``: each becomes a ``TargetError`` naming
#   what the module did. What it prints goes to stderr (stdout may be ``--json -``).
IMPORT_SECONDS = 120.0


class ExitAtImport(Exception):
    """``os._exit(code)`` called while a target was imported (Note [Importing a target])."""

    def __init__(self, code):
        super().__init__(code)
        self.code = code


class ImportTimeout(Exception):
    """A target's import ran past ``IMPORT_SECONDS`` (Note [Importing a target])."""


@contextlib.contextmanager
def guarded_import(seconds: float | None = None):
    """Note [Importing a target] (``seconds``: ``IMPORT_SECONDS``)."""
    seconds = IMPORT_SECONDS if seconds is None else seconds
    real_exit = os._exit

    def refuse(code):
        raise ExitAtImport(code)

    def expire(signum, frame):
        raise ImportTimeout()

    timed = (
        threading.current_thread() is threading.main_thread()
        and hasattr(signal, "setitimer")
        and signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, None)
        and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    )
    os._exit = refuse  # type: ignore[assignment]  # restored below
    if timed:
        previous = signal.signal(signal.SIGALRM, expire)
        signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        os._exit = real_exit
        if timed:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)


def load_object(path: str):
    module, sep, name = path.rpartition(":")
    if not sep or not module or not name:
        raise TargetError(
            f"target={path!r} must be a built-in name, 'package.module:Class' or 'file.py:Name'"
        )
    try:
        with guarded_import():
            obj = import_module(module)
    except SystemExit as exc:
        raise TargetError(
            f"target={path!r}: importing module {module!r} called sys.exit({exc.code!r}), which "
            f"would end the check having checked nothing; keep a script's work under "
            f'`if __name__ == "__main__":`'
        ) from None
    except ExitAtImport as exc:
        raise TargetError(
            f"target={path!r}: importing module {module!r} called os._exit({exc.code!r}), which "
            f"would end the check having checked nothing; keep a script's work under "
            f'`if __name__ == "__main__":`'
        ) from None
    except ImportTimeout:
        raise TargetError(
            f"target={path!r}: module {module!r} did not finish importing within "
            f"{IMPORT_SECONDS:g} s (does it train, read input or wait for a process group at its "
            f"top level?)"
        ) from None
    except Exception as exc:  # noqa: BLE001 - any import failure is the user's to read
        raise TargetError(
            f"target={path!r}: module {module!r} does not import: {type(exc).__name__}: {exc}"
        ) from exc
    for part in name.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise TargetError(
                f"target={path!r}: module {module!r} has no attribute {part!r}"
            ) from None
    return obj


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

# What each kind's rank program passes to the constructor (paracheck.check.ranks: _drive.py for
# ddp, cases.build_optimizer for sharded, _optimizer.build_zero for zero).
_PASSES = {
    "ddp": "the module first, a bucket size to an argument named like bucket_size_mb, and rank, "
    "world_size, process_group (or group) and device by name",
    "sharded": "params and optimizer_cls first, and the optimizer's hyper-parameters (lr, ...) "
    "through **kwargs",
    "zero": "the module and optimizer_cls first, params= and bucket_size_mb=, and the optimizer's "
    "hyper-parameters (lr, ...) through **kwargs",
    "zero2": "the module and optimizer_cls first, params= and bucket_size_mb=, and the optimizer's "
    "hyper-parameters (lr, ...) through **kwargs",
}


def _unsupplied(name: str, obj, kind: str, missing: list[str]) -> str:
    them = "it a default" if len(missing) == 1 else "them defaults"
    what = "class" if inspect.isclass(obj) else "function"
    return (
        f"{name} requires {', '.join(missing)}, which paracheck does not supply; give {them} or "
        f"wrap the {what} (paracheck passes {_PASSES[kind]})"
    )


def _missing(obj, kind: str) -> list[str]:
    """The required arguments of ``obj``'s constructor that the rank program of ``kind`` does not
    pass (nothing where its signature cannot be read)."""
    if kind == "ddp":
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
    # sharded: Class(params, optimizer_cls, **kwargs); zero: Class(module, optimizer_cls, *,
    # params, bucket_size_mb, **kwargs). Hyper-parameters come as keywords in some cases only.
    by_name = {"params", "bucket_size_mb"} if kind in ("zero", "zero2") else set()
    missing, positional = [], 0
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if p.kind != p.KEYWORD_ONLY and positional < 2:
            positional += 1
            continue
        if p.default is p.empty and p.name not in by_name:
            missing.append(p.name)
    return missing


# The first two arguments of a wrapper around an optimizer class.
_WRAPPER_FIRST = {
    "sharded": ("params", "optimizer_cls"),
    "zero": ("module", "optimizer_cls"),
    "zero2": ("module", "optimizer_cls"),
}


def _not_a_wrapper(obj, kind: str) -> str | None:
    """Why ``obj`` cannot be constructed as a ``kind`` wrapper ``Class(first, optimizer_cls,
    **kwargs)``, or None. Refuses only what fails on every case: fewer than two positional
    arguments, or a second one named ``lr`` (a torch optimizer, which would take the optimizer
    class as its learning rate). A signature that cannot be read is accepted."""
    first = _WRAPPER_FIRST.get(kind)
    if first is None:
        return None
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
        raise TargetError(
            f"--kind {kind}: {name} {why}; a {kind} target is constructed as Class("
            f"{', '.join(_WRAPPER_FIRST[kind])}, **kwargs) (paracheck passes {_PASSES[kind]})"
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


def _resolve_hook(option: str, value: str, obj, module_name: str, path: str) -> str:
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


def _hook_message(cls, path: str) -> str:
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


# -- kinds --------------------------------------------------------------------------------------


def _param_names(obj) -> list[str]:
    try:
        sig = inspect.signature(obj.__init__ if inspect.isclass(obj) else obj)
    except (TypeError, ValueError):
        raise TargetError("cannot read the constructor's signature") from None
    return [p for p in sig.parameters if p != "self"]


def _is_optimizer_arg(name: str) -> bool:
    return "optim" in name.lower()


def _infer_kind(cls, path: str, finish: str | None = None) -> tuple[str, bool]:
    if not inspect.isclass(cls) and not inspect.isfunction(cls):
        raise TargetError(f"target={path!r} is a {type(cls).__name__}, not a class or a function")
    try:
        names = _param_names(cls)
    except TargetError as exc:
        raise TargetError(f"target={path!r}: {exc}") from None
    import torch

    first = names[0].lower() if names else ""
    if len(names) >= 2 and first in ("module", "model") and _is_optimizer_arg(names[1]):
        return (
            "zero",
            False,
        )  # Class(module, optimizer_cls, ...): a ZeRO wrapper (paracheck.zero.Zero1)
    if (inspect.isclass(cls) and issubclass(cls, torch.optim.Optimizer)) or (
        len(names) >= 2 and _is_optimizer_arg(names[1])
    ):
        return "sharded", False
    from paracheck.check.ranks.fsdp import GATHER_METHODS

    if inspect.isclass(cls) and any(hasattr(cls, m) for m in GATHER_METHODS):
        return "fsdp", False  # a wrapper that can give its sharded parameters whole
    if inspect.isclass(cls) and (
        "compute_dtype" in names or "fsdp" in cls.__name__.lower().replace("_", "")
    ):
        # The CS336 FSDP(module, compute_dtype=None), or a class named so, without a reader.
        others = _gather_candidates(cls)
        hint = f"; it has {', '.join(m + '()' for m in others)}" if others else ""
        raise TargetError(
            f"target={path!r} looks like a fully sharded wrapper but has none of "
            f"{', '.join(m + '()' for m in GATHER_METHODS)}{hint}: name the method (or "
            "module:function called as f(wrapper)) that returns every parameter whole with "
            "--gather NAME (gather=... in paracheck_check)"
        )
    if (
        inspect.isfunction(cls)
        or finish is not None
        or hasattr(cls, "finish_gradient_synchronization")
    ):
        check_supplied(cls, "ddp", path)
        try:
            return "ddp", ddp_construction(cls).takes_bucket
        except TargetError as exc:
            raise TargetError(f"target={path!r}: {exc}") from None
    raise TargetError(_hook_message(cls, path))


def _looks_like_a_step(obj) -> bool:
    """``train_step(model, optimizer, micro_batches)``: a function whose third argument names
    batches."""
    if not inspect.isfunction(obj):
        return False
    try:
        names = _param_names(obj)
    except TargetError:
        return False
    return (
        len(names) >= 3
        and names[0].lower() in ("model", "module")
        and "opt" in names[1].lower()
        and "batch" in names[2].lower()
    )


def _loop_target(
    name: str, path: str, obj, loss: str | None, clip_norm: float | None = None
) -> Target:
    """A ``loop`` target: ``obj`` is a function, or a class whose instance is called, as
    ``step(model, optimizer, micro_batches)``."""
    from paracheck.strategies._loop import LOOP_LOSSES

    if not callable(obj):
        raise TargetError(
            f"target={name!r} is a {type(obj).__name__}: a loop target is a function "
            "train_step(model, optimizer, micro_batches) or a class whose instances are called so"
        )
    if loss is None:
        loss = getattr(obj, "paracheck_loss", None) or "token-mean"
    if loss not in LOOP_LOSSES:
        raise TargetError(f"loss={loss!r} must be one of {', '.join(LOOP_LOSSES)}")
    if clip_norm is None:
        clip_norm = getattr(obj, "paracheck_clip_norm", None)
    if clip_norm is not None and not (isinstance(clip_norm, (int, float)) and clip_norm > 0):
        raise TargetError(f"clip_norm={clip_norm!r} must be a number > 0")
    autocast, scaler = _loop_precision(name, obj)
    return Target(
        name,
        path,
        "loop",
        loss=loss,
        clip_norm=None if clip_norm is None else float(clip_norm),
        autocast=autocast,
        scaler=scaler,
    )


# Note [A loop's own precision]
#   A training step opens its own ``torch.autocast`` and drives its own ``GradScaler``, so what it
#   computes in is the step's declaration, not a draw: ``paracheck_autocast = "float16"`` (or
#   ``"bfloat16"``) on the function or class says its forwards run under ``torch.autocast(
#   device_type, dtype)`` over float32 parameters, and every case is drawn so (the oracle applies
#   the same casts: Note [Precision of a case]). A step with a parameter named ``scaler`` is given
#   a ``torch.amp.GradScaler`` as ``scaler=`` and must scale its losses, ``unscale_`` before
#   anything reads the gradients (a clip), ``step`` and ``update`` it; its cases scale the loss as
#   the fp16 precision's do (a first backward that overflows on every rank, or none). A scaler is
#   for float16 compute: a step taking one declares ``paracheck_autocast = "float16"``, or gets it.


def _loop_precision(name: str, obj) -> tuple[str | None, bool]:
    """A loop's declared autocast dtype and whether it takes a ``scaler`` (Note [A loop's own
    precision]); a TargetError for a declaration that cannot be checked."""
    from paracheck.cases import AUTOCAST_DTYPES

    fn = obj.__call__ if inspect.isclass(obj) else obj
    try:
        scaler = "scaler" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        scaler = False
    declared = getattr(obj, "paracheck_autocast", None)
    if declared is None:
        return ("float16" if scaler else None), scaler
    text = str(declared).removeprefix("torch.")
    if text not in AUTOCAST_DTYPES:
        raise TargetError(
            f"paracheck_autocast={declared!r} must be one of {', '.join(sorted(AUTOCAST_DTYPES))} "
            f"(target {name!r})"
        )
    if scaler and text != "float16":
        raise TargetError(
            f"paracheck_autocast={text!r} with a scaler parameter (target {name!r}): a "
            "GradScaler is for float16 compute; declare 'float16'"
        )
    return text, scaler


def _companions(obj, path: str) -> dict:
    """A CS336 adapter constructor named by path (``adapters.py:get_ddp_bucketed``) brings its own
    hooks from its module, as ``--adapters`` checks it (``paracheck.check.adapters``)."""
    from paracheck.check.adapters import companion_hooks

    return companion_hooks(obj, path)


def resolve_target(
    name: str,
    kind: str | None = None,
    *,
    finish: str | None = None,
    batch_start: str | None = None,
    stub_cuda_timing: bool = False,
    loss: str | None = None,
    clip_norm: float | None = None,
    reduce_dtype: str | None = None,
    gather: str | None = None,
) -> Target:
    """A built-in name or an import path -> Target (imports it here, to fail early and clearly).

    ``finish`` / ``batch_start`` name the DDP hooks (Note [Readings of a DDP interface]);
    ``loss`` the loss semantics of a ``loop`` target (Note [Loss semantics]) and ``clip_norm``
    the global norm it clips its gradients to; ``reduce_dtype`` the dtype a DDP target reduces
    its gradients in (Note [Declared reduction dtype]; default: its class's
    ``paracheck_reduce_dtype``); ``gather`` how an FSDP target's parameters are read whole (a
    method name or ``module:function`` called as ``f(wrapper)``; it makes the kind ``fsdp``).
    """
    if gather is not None and kind is None and name not in BUILTIN_TARGETS:
        kind = "fsdp"
    target = _resolve(name, kind, finish, batch_start, stub_cuda_timing, loss, clip_norm)
    return with_gather(with_reduce_dtype(target, reduce_dtype), gather)


def _gather_candidates(cls) -> list[str]:
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


def with_gather(target: Target, gather: str | None) -> Target:
    """``target`` reading its parameters whole through ``gather`` (Note [Reading an FSDP]); a
    TargetError naming the value where it is neither a method of the class nor a function."""
    import dataclasses

    if gather is None:
        return target
    if target.kind != "fsdp":
        raise TargetError(
            f"gather={gather!r} is for fsdp targets; {target.name!r} is a {target.kind} target"
        )
    if ":" in gather:
        fn = load_object(gather)
        if not callable(fn):
            raise TargetError(f"gather={gather!r} is a {type(fn).__name__}, not a function")
        return dataclasses.replace(target, gather=gather)
    cls = load_object(target.path)
    if inspect.isclass(cls) and not callable(getattr(cls, gather, None)):
        others = _gather_candidates(cls)
        hint = f"; it has {', '.join(m + '()' for m in others)}" if others else ""
        raise TargetError(
            f"gather={gather!r}: target {target.name!r} has no method {gather}(){hint} (or name "
            "a module:function called as f(wrapper))"
        )
    return dataclasses.replace(target, gather=gather)


def with_reduce_dtype(target: Target, given=None) -> Target:
    """``target`` with its declared reduction dtype (``given``, else its class's attribute) and
    the ``reduce-dtype`` property added to its defaults; a TargetError for a bad declaration."""
    import dataclasses

    from paracheck.check.kinds import default_properties
    from paracheck.check.properties.reduce_dtype import REDUCE_DTYPES

    declared = given
    if declared is None:
        declared = getattr(load_object(target.path), "paracheck_reduce_dtype", None)
        if declared is None:
            return target
    text = str(declared).removeprefix("torch.")
    if text not in REDUCE_DTYPES:
        raise TargetError(
            f"reduce_dtype={declared!r} must be one of {', '.join(REDUCE_DTYPES)} "
            f"(target {target.name!r})"
        )
    if target.kind not in ("ddp", "fsdp"):
        raise TargetError(
            f"reduce_dtype={text!r} is declared for DDP and FSDP targets; {target.name!r} is a "
            f"{target.kind} target"
        )
    base = target.properties or default_properties(target.kind, target.takes_bucket)
    return dataclasses.replace(
        target, reduce_dtype=text, properties=frozenset(base) | {"reduce-dtype"}
    )


def _resolve(name, kind, finish, batch_start, stub_cuda_timing, loss, clip_norm) -> Target:
    from paracheck.check.kinds import KINDS

    if kind is not None and kind not in KINDS:
        raise TargetError(f"kind={kind!r} must be one of {', '.join(repr(k) for k in KINDS)}")
    if name in BUILTIN_TARGETS and BUILTIN_TARGETS[name][1] == "loop":
        return _loop_target(
            name, BUILTIN_TARGETS[name][0], load_object(BUILTIN_TARGETS[name][0]), loss
        )
    if name in BUILTIN_TARGETS:
        path, builtin_kind = BUILTIN_TARGETS[name]
        cls = load_object(path)
        module = path.rpartition(":")[0]
        return Target(
            name,
            path,
            builtin_kind,
            _infer_kind(cls, path)[1] if builtin_kind == "ddp" else False,
            BUILTIN_PROPERTIES.get(name),
            finish=None if finish is None else _resolve_hook("--finish", finish, cls, module, name),
            batch_start=None
            if batch_start is None
            else _resolve_hook("--batch-start", batch_start, cls, module, name),
            stub_cuda_timing=stub_cuda_timing,
        )
    if ":" not in name:
        raise TargetError(
            f"target={name!r} is not a built-in target ({', '.join(BUILTIN_TARGETS)}) "
            f"nor an import path 'package.module:Class' or 'file.py:Name'"
        )
    cls = load_object(name)
    module_part, _, attr = name.rpartition(":")
    path = f"{os.path.abspath(module_part)}:{attr}" if _is_file_spec(module_part) else name
    if kind == "loop" or (kind is None and _looks_like_a_step(cls)):
        return _loop_target(name, path, cls, loss, clip_norm)
    if loss is not None or clip_norm is not None:
        raise TargetError(
            f"loss={loss!r}, clip_norm={clip_norm!r} are for loop targets; {name!r} is not one "
            "(--kind loop)"
        )
    hooks = _companions(cls, path) if inspect.isfunction(cls) else {}
    if finish is not None:
        hooks["finish"] = _resolve_hook("--finish", finish, cls, path.rpartition(":")[0], name)
    if batch_start is not None:
        hooks["batch_start"] = _resolve_hook(
            "--batch-start", batch_start, cls, path.rpartition(":")[0], name
        )
    inferred, bucket = (
        _infer_kind(cls, name, hooks.get("finish")) if kind is None else (kind, False)
    )
    check_supplied(cls, inferred, name)
    if kind == "ddp":
        try:
            bucket = ddp_construction(cls).takes_bucket
        except TargetError as exc:
            raise TargetError(f"target={name!r}: {exc}") from None
    notes = ()
    if (
        inferred == "ddp"
        and inspect.isclass(cls)
        and hooks.get("batch_start") is None
        and not hasattr(cls, "on_train_batch_start")
    ):
        others = plausible_hooks(cls, "batch_start")
        if others:
            notes = (
                f"{name} has no on_train_batch_start(); it has {others[0]}(): if that must run before each "
                f"batch, pass --batch-start {others[0]}",
            )
    properties = None
    if inferred == "sharded" and inspect.isfunction(cls):
        from paracheck.check.adapters import ADAPTER_SHARDED_PROPERTIES as properties
    return Target(
        name,
        path,
        inferred,
        bucket,
        properties,
        finish=hooks.get("finish"),
        batch_start=hooks.get("batch_start"),
        stub_cuda_timing=stub_cuda_timing,
        notes=notes,
    )
