"""Function-style interfaces: a CS336 ``adapters.py`` (or the handout's ``get_ddp``) as targets.

The CS336 handouts ask for functions rather than classes:

* ``get_ddp(module)`` and ``ddp_on_after_backward(ddp_model, optimizer)`` (2026);
* ``get_ddp_individual_parameters(module)``, ``ddp_individual_parameters_on_after_backward(
  ddp_model, optimizer)``; ``get_ddp_bucketed(module, bucket_size_mb)``,
  ``ddp_bucketed_on_after_backward(ddp_model, optimizer)``, ``ddp_bucketed_on_train_batch_start(
  ddp_model, optimizer)``; ``get_sharded_optimizer(params, optimizer_cls, **kwargs)`` (earlier
  handouts' ``tests/adapters.py``).

``discover_adapters`` finds which designs a module implements and makes one ``Target`` per
design; the ranks import the functions by path (``paracheck.check.loading.load_object``, which

Which functions a module implements, and the designs they make up, are read by
``paracheck.check.interfaces`` (Note [Not implemented] there).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from paracheck.check.interfaces import (
    DESIGNS,
    AdapterDesign,
    check_supplied,
    companion_hooks,
    ddp_construction,
    function_status,
    not_implemented,
)
from paracheck.check.kinds import KINDS
from paracheck.check.loading import TargetError, import_module
from paracheck.check.targets import Target

__all__ = [
    "DESIGNS",
    "AdapterDesign",
    "AdapterReport",
    "companion_hooks",
    "discover_adapters",
    "not_implemented",
]


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
    functions = tuple(
        (name, st) for name in known if (st := function_status(module, name)) is not None
    )
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
        if KINDS[d.kind].constructor.by_names:  # type: ignore[union-attr]  # a design has one
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
                properties=KINDS[d.kind].adapter_properties,
                finish=None if d.finish is None else f"{where}:{d.finish}",
                batch_start=None if batch_start is None else f"{where}:{batch_start}",
                stub_cuda_timing=stub_cuda_timing,
            )
        )
    return AdapterReport(spec, functions, tuple(targets), tuple(skipped))
