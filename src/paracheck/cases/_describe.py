"""A case in one line (``describe``): what a failure's report shows of its shrunk case. Every field
that differs from its default is named, its value with every digit it has: a failure whose cause
is one group's weight decay, a clip norm or an autocast dtype shows that cause on the line, not
only in the case's file."""

from __future__ import annotations

import dataclasses
from typing import Protocol

from paracheck.cases._optimizer import OptimizerSpec

__all__ = ["describe"]

# Fields the line's head shows in its own form (world size, model, optimizer, steps, windows,
# bucket), and those that only repeat another (a batch size per rank, given by the world size
# where they are equal).
_HEAD = {"model", "world_size", "optimizer", "steps", "accumulation", "bucket_size_mb"}
_HEAD |= {"unbounded_bucket", "batch_sizes"}


def _value(value) -> str:
    """``value`` as the line shows it: floats by ``repr`` (every digit: 0.1, 1e-07), sequences
    without spaces, strings bare."""
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (tuple, list)):
        return "[" + ",".join(_value(v) for v in value) + "]"
    return str(value)


def _short(value: float) -> str:
    """``value`` in its shortest form (25, 0.5) where that form is exact, else every digit: a
    bucket cap one byte below a parameter's size (9.5367431640625e-07 MB is one byte) and one at
    it bucket differently, and must not print alike."""
    return f"{value:g}" if float(f"{value:g}") == value else repr(value)


def _changed(value, default_of) -> list[str]:
    """``name=value`` for each field of the dataclass ``value`` that differs from its default
    (``default_of(field)``), True flags by their bare name."""
    out = []
    for f in dataclasses.fields(value):
        got = getattr(value, f.name)
        default = default_of(f)
        if default is dataclasses.MISSING or got == default:
            continue
        out.append(f.name if got is True and default is False else f"{f.name}={_value(got)}")
    return out


def _default(f: dataclasses.Field):
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def _model(spec) -> str:
    kind = getattr(spec, "kind", type(spec).__name__)
    head = f"{kind}[{','.join(str(w) for w in spec.widths)}]" if kind == "mlp" else kind
    hidden = {"widths"} if kind == "mlp" else set()
    changed = _changed(spec, lambda f: dataclasses.MISSING if f.name in hidden else _default(f))
    return head + (f"({', '.join(changed)})" if changed else "")


def _optimizer(opt) -> str:
    """The optimizer's name and number of groups ("adamwx2g", as before), then each group's
    hyper-parameters that differ from ``GroupSpec``'s defaults ("g0{weight_decay=0.1}"), then
    the optimizer's own options (an lr decay, a scheduler, generators)."""
    parts = [f"{opt.name}x{len(opt.groups)}g"]
    for i, group in enumerate(opt.groups):
        # ``params`` has no default: () is every parameter no other group names.
        changed = _changed(group, lambda f: () if f.name == "params" else _default(f))
        if changed:
            parts.append(f"g{i}{{{', '.join(changed)}}}")
    parts += _changed(
        opt, lambda f: dataclasses.MISSING if f.name in ("name", "groups") else _default(f)
    )
    return " ".join(parts)


class _Described(Protocol):
    """What ``describe`` reads of a case, besides its dataclass fields. (A ``Case`` is one;
    naming the protocol, not ``Case``, keeps this module below ``paracheck.cases._case``, which
    calls it.)"""

    @property
    def world_size(self) -> int: ...
    @property
    def model(self) -> object: ...
    @property
    def optimizer(self) -> OptimizerSpec: ...
    @property
    def steps(self) -> int: ...
    @property
    def accumulation(self) -> int: ...
    @property
    def loss(self) -> str: ...
    @property
    def unbounded_bucket(self) -> bool: ...
    @property
    def bucket_mb(self) -> float: ...
    @property
    def batch_sizes(self) -> tuple[int, ...]: ...


def describe(case: _Described) -> str:
    """``case`` in one line: world size, model and its options, optimizer with each group's
    hyper-parameters, steps, accumulation, the bucket (a wrapper's case), then every other field
    that differs from its default (``name=value``, flags by name), values with every digit."""
    user = getattr(case, "user_model", None)  # Note [A user's model]: its model, not ``model``
    model = _model(case.model) if user is None else user.describe()
    head = [f"W={case.world_size}", model, _optimizer(case.optimizer)]
    head += [f"steps={case.steps}", f"acc={case.accumulation}"]
    if case.loss == "rank-mean":  # a training loop's case has no bucket
        bucket = "None" if case.unbounded_bucket else f"{_short(case.bucket_mb)}MB"
        head.append(f"bucket={bucket}")
    if len(set(case.batch_sizes)) > 1 or case.batch_sizes[0] != 2:
        head.append(f"batches={_value(case.batch_sizes)}")
    rest = _changed(
        case,
        lambda f: dataclasses.MISSING if f.name in _HEAD or f.name == "user_model" else _default(f),
    )
    return " ".join(head + rest)
