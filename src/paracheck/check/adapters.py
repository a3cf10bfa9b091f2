"""Function-style interfaces: a CS336 ``adapters.py`` (or the handout's ``get_ddp``) as targets.

The CS336 handouts ask for functions rather than classes:

* ``get_ddp(module)`` and ``ddp_on_after_backward(ddp_model, optimizer)`` (2026);
* ``get_ddp_individual_parameters(module)``, ``ddp_individual_parameters_on_after_backward(
  ddp_model, optimizer)``; ``get_ddp_bucketed(module, bucket_size_mb)``,
  ``ddp_bucketed_on_after_backward(ddp_model, optimizer)``, ``ddp_bucketed_on_train_batch_start(
  ddp_model, optimizer)``; ``get_sharded_optimizer(params, optimizer_cls, **kwargs)`` (earlier
  handouts' ``tests/adapters.py``).

``discover_adapters`` finds which designs a module implements and makes one ``Target`` per
design; the ranks import the functions by path (``paracheck.check.targets.load_object``, which
also imports a .py file by location) and call them through ``paracheck.check.ranks._drive``.

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
import inspect
import os
import textwrap
from dataclasses import dataclass

from paracheck.check.targets import (
    Target,
    TargetError,
    check_supplied,
    ddp_construction,
    import_module,
)

__all__ = [
    "DESIGNS",
    "AdapterDesign",
    "AdapterReport",
    "companion_hooks",
    "discover_adapters",
    "not_implemented",
]


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

# A student's sharded optimizer is judged on its parameters (what the handout's test checks):
# its state_dict() is commonly the local shard's, and its communication pattern is its own.
# memory and balance apply only where it declares its partition (paracheck.check.properties.memory, .balance).
ADAPTER_SHARDED_PROPERTIES = frozenset({"equivalence", "memory", "balance"})


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


def _status(module, name: str) -> str | None:
    fn = getattr(module, name, None)
    if fn is None or not callable(fn):
        return None
    return "not implemented" if not_implemented(fn) else "implemented"


@dataclass(frozen=True)
class AdapterReport:
    """What ``discover_adapters`` found: ``functions`` as (name, status) in handout order, one
    Target per design checked, and one line per design left out, saying why."""

    spec: str
    functions: tuple[tuple[str, str], ...]
    targets: tuple[Target, ...]
    skipped: tuple[str, ...]

    def lines(self) -> list[str]:
        width = max(len(n) for n, _ in self.functions)
        out = [f"adapters {self.spec}:"]
        out += [f"  {n:<{width}}  {s}" for n, s in self.functions]
        out += [f"  checking {t.name} ({_title(t)})" for t in self.targets]
        out += [f"  {s}" for s in self.skipped]
        if not self.targets:
            out.append("  no design is implemented: nothing to check")
        return out


def _title(t: Target) -> str:
    ctor = t.path.rpartition(":")[2]
    return next(d.title for d in DESIGNS if d.constructor == ctor)


def _module_path(spec: str) -> str:
    """The import path's module part for ``spec`` as the ranks import it (absolute for a file)."""
    return os.path.abspath(spec) if spec.endswith(".py") or os.sep in spec or "/" in spec else spec


def discover_adapters(spec: str, *, stub_cuda_timing: bool = False) -> AdapterReport:
    """The CS336 adapter functions in ``spec`` (a .py file or a module name), as targets.

    TargetError (a usage error) when ``spec`` does not import or defines none of them."""
    try:
        module = import_module(spec)
    except Exception as exc:  # noqa: BLE001 - the user's import error, reported as such
        raise TargetError(
            f"--adapters={spec!r} does not import: {type(exc).__name__}: {exc}"
        ) from exc
    known = [f for d in DESIGNS for f in d.functions]
    functions = tuple((name, st) for name in known if (st := _status(module, name)) is not None)
    if not functions:
        raise TargetError(
            f"--adapters={spec!r} defines none of the CS336 adapter functions "
            f"({', '.join(d.constructor for d in DESIGNS)}, ...)"
        )
    status = dict(functions)
    where = _module_path(spec)
    targets, skipped = [], []
    for d in DESIGNS:
        if status.get(d.constructor) != "implemented":
            continue
        if d.finish is not None and status.get(d.finish) != "implemented":
            why = "is not implemented" if d.finish in status else "is missing"
            skipped.append(f"not checking the {d.title}: {d.finish} {why}")
            continue
        batch_start = (
            d.batch_start if d.batch_start and status.get(d.batch_start) == "implemented" else None
        )
        constructor = getattr(module, d.constructor)
        try:
            check_supplied(constructor, d.kind, f"{spec}:{d.constructor}")
        except TargetError as exc:
            raise TargetError(f"--adapters={spec!r}: {exc}") from None
        takes_bucket = False
        if d.kind == "ddp":
            try:
                takes_bucket = ddp_construction(getattr(module, d.constructor)).takes_bucket
            except TargetError as exc:
                raise TargetError(f"--adapters={spec!r}: {d.constructor}: {exc}") from None
        targets.append(
            Target(
                f"{spec}:{d.constructor}",
                f"{where}:{d.constructor}",
                d.kind,
                takes_bucket=takes_bucket,
                properties=ADAPTER_SHARDED_PROPERTIES if d.kind == "sharded" else None,
                finish=None if d.finish is None else f"{where}:{d.finish}",
                batch_start=None if batch_start is None else f"{where}:{batch_start}",
                stub_cuda_timing=stub_cuda_timing,
            )
        )
    return AdapterReport(spec, functions, tuple(targets), tuple(skipped))


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
        if name is not None and _status(module, name) == "implemented":
            hooks[key] = f"{where}:{name}"
    return hooks
