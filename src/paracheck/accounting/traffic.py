"""Bytes communicated per step: analytic models per design, and a layer that records what was sent.

Two measures, both per rank and per step:

* **payload bytes**: the size of the tensor each collective call is given, the quantity
  ``record_collectives`` counts exactly. Convention: ``all_reduce`` / ``broadcast``: the tensor;
  ``reduce_scatter``: the full input (``W`` chunks); ``all_gather``: the full output.
* **wire bytes** (``wire_bytes``): what a bandwidth-optimal ring moves per rank for that payload,
  the usual model for comparing designs (Note [Owner broadcast versus ZeRO-1]).

Note [Owner broadcast versus ZeRO-1]
    Let Psi be the bytes of the trainable parameters and W > 1 the world size. Per rank and step,
    in a ring: all-reduce 2(W-1)/W Psi, reduce-scatter (W-1)/W Psi, all-gather (W-1)/W Psi, and a
    broadcast of Psi, averaged over ranks, (W-1)/W Psi (each of the W-1 receivers gets Psi once).

    * DDP:             all-reduce                    = 2(W-1)/W Psi
    * ZeRO-1:          reduce-scatter + all-gather   = 2(W-1)/W Psi' (Psi' = Psi plus padding to
                       a multiple of W per bucket: at most (W-1) elements per bucket)
    * owner broadcast: all-reduce + broadcast        = 3(W-1)/W Psi

    The owner-broadcast ``ShardedOptimizer`` therefore sends (W-1)/W Psi more than ZeRO-1 per
    rank, 1.5x as much; the payload bytes, by contrast, are 2 Psi for both designs, which is why a
    count of "tensor bytes handed to NCCL" alone does not show the difference. Both paracheck
    designs also reduce one presence flag per trainable parameter (Note [Gradients that exist on
    some ranks only] in ``paracheck.ddp._common``): n * element_size bytes, counted exactly below.
"""

from __future__ import annotations

import contextlib
import inspect
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "CollectiveRecorder",
    "StepTraffic",
    "flat_ddp_traffic",
    "owner_broadcast_traffic",
    "record_collectives",
    "wire_bytes",
    "zero1_traffic",
]


@dataclass(frozen=True)
class StepTraffic:
    """Collectives one rank issued: ``(name, calls, payload_bytes)`` per canonical name, sorted."""

    entries: tuple[tuple[str, int, int], ...] = ()

    @classmethod
    def from_dict(cls, d: Mapping[str, tuple[int, int]]) -> StepTraffic:
        return cls(tuple(sorted((k, int(c), int(b)) for k, (c, b) in d.items() if c)))

    def as_dict(self) -> dict[str, tuple[int, int]]:
        return {k: (c, b) for k, c, b in self.entries}

    def __add__(self, other: StepTraffic) -> StepTraffic:
        d = self.as_dict()
        for k, c, b in other.entries:
            c0, b0 = d.get(k, (0, 0))
            d[k] = (c0 + c, b0 + b)
        return StepTraffic.from_dict(d)

    @property
    def payload_bytes(self) -> int:
        return sum(b for _, _, b in self.entries)

    def wire_bytes(self, world_size: int) -> float:
        return sum(wire_bytes(k, b, world_size) for k, _, b in self.entries)


def wire_bytes(collective: str, payload: int, world_size: int) -> float:
    """Bytes one rank sends (= receives) in a ring for ``payload`` (Note [Owner broadcast versus ZeRO-1])."""
    if world_size < 1:
        raise ValueError(f"world_size={world_size!r} must be >= 1")
    f = (world_size - 1) / world_size
    factors = {"all_reduce": 2 * f, "reduce_scatter": f, "all_gather": f, "broadcast": f}
    if collective not in factors:
        raise ValueError(f"collective={collective!r} has no wire model; known: {sorted(factors)}")
    return factors[collective] * payload


# -- analytic models ------------------------------------------------------------------------


def owner_broadcast_traffic(param_bytes: Sequence[int], world_size: int) -> StepTraffic:
    """``ShardedOptimizer.step()``: one broadcast per trainable parameter in its groups, from the
    owner (frozen parameters are never changed, so never sent). Nothing when ``world_size == 1``."""
    if world_size == 1 or not param_bytes:
        return StepTraffic()
    return StepTraffic.from_dict({"broadcast": (len(param_bytes), sum(param_bytes))})


def flat_ddp_traffic(
    numels: Sequence[int], element_size: int, world_size: int, *, syncs: int = 1
) -> StepTraffic:
    """``FlatDDP``: per synchronisation one all-reduce of every gradient plus one flag per parameter."""
    if world_size == 1 or not numels:
        return StepTraffic()
    per = (sum(numels) + len(numels)) * element_size
    return StepTraffic.from_dict({"all_reduce": (syncs, syncs * per)})


def zero1_traffic(layout, element_size: int, *, syncs: int = 1) -> StepTraffic:
    """``Zero1``: per synchronisation one reduce-scatter per bucket and one all-reduce of the
    presence flags; per ``step()`` one all-gather per bucket. ``layout`` is a ``FlatLayout``."""
    if layout.world_size == 1 or not layout.buckets:
        return StepTraffic()
    nb = len(layout.buckets)
    padded = layout.padded_numel * element_size
    flags = len(layout.numels) * element_size
    return StepTraffic.from_dict(
        {
            "reduce_scatter": (nb * syncs, padded * syncs),
            "all_reduce": (syncs, flags * syncs),
            "all_gather": (nb, padded),
        }
    )


# -- recording ------------------------------------------------------------------------------


def _nbytes(t) -> int:
    return t.numel() * t.element_size()


def _list_bytes(ts) -> int:
    return sum(_nbytes(t) for t in ts)


# torch.distributed name -> (canonical name, argument holding the payload, how to size it)
_WRAPPED = {
    "all_reduce": ("all_reduce", "tensor", _nbytes),
    "broadcast": ("broadcast", "tensor", _nbytes),
    "reduce": ("reduce", "tensor", _nbytes),
    "reduce_scatter_tensor": ("reduce_scatter", "input", _nbytes),
    "reduce_scatter_single": ("reduce_scatter", "input", _nbytes),
    "reduce_scatter": (
        "reduce_scatter",
        "input_list",
        lambda ls: sum(_list_bytes(x) if isinstance(x, list) else _nbytes(x) for x in ls),
    ),
    "all_gather_into_tensor": ("all_gather", "output_tensor", _nbytes),
    "all_gather_single": ("all_gather", "output_tensor", _nbytes),
    "all_gather": ("all_gather", "tensor_list", _list_bytes),
    "all_to_all_single": ("all_to_all", "input", _nbytes),
    # Pickled objects: the payload is not known before pickling; counted as calls of 0 bytes.
    "all_gather_object": ("all_gather_object", None, None),
    "broadcast_object_list": ("broadcast_object_list", None, None),
}


class CollectiveRecorder:
    """What ``record_collectives`` saw: ``calls`` is a list of (canonical name, payload bytes)."""

    def __init__(self, group=None):
        self.group = group
        self.calls: list[tuple[str, int]] = []
        self._depth = threading.local()

    def traffic(self) -> StepTraffic:
        d: dict[str, tuple[int, int]] = {}
        for name, b in self.calls:
            c0, b0 = d.get(name, (0, 0))
            d[name] = (c0 + 1, b0 + b)
        return StepTraffic.from_dict(d)

    def _matches(self, group) -> bool:
        if self.group is None:
            return True
        import torch.distributed as dist

        if group is None:
            group = dist.group.WORLD
        return group is self.group

    def _wrap(self, name: str, original):
        canonical, arg, size = _WRAPPED[name]
        try:
            sig = inspect.signature(original)
        except (TypeError, ValueError):
            sig = None

        def wrapper(*args, **kwargs):
            depth = getattr(self._depth, "n", 0)
            if depth == 0 and sig is not None:
                # A collective that calls another public one (a deprecated alias forwarding to its
                # replacement) is counted once, at the outermost call.
                bound = sig.bind_partial(*args, **kwargs)
                if self._matches(bound.arguments.get("group")):
                    b = 0 if arg is None else size(bound.arguments[arg])
                    self.calls.append((canonical, b))
            self._depth.n = depth + 1
            try:
                return original(*args, **kwargs)
            finally:
                self._depth.n = depth

        wrapper.__wrapped__ = original
        return wrapper


@contextlib.contextmanager
def record_collectives(*, group=None) -> Iterator[CollectiveRecorder]:
    """Count every collective called through ``torch.distributed.<name>`` inside the block.

    ``group`` restricts the count to one process group (None: all groups). The public functions of
    the ``torch.distributed`` namespace are wrapped for the duration and restored on exit (even on
    error); code that bound a function before entering (``from torch.distributed import
    all_reduce``) bypasses the recorder, as do torch-internal calls between c10d functions, which
    is what makes a forwarding alias count once. Blocks nest.
    """
    import torch.distributed as dist

    rec = CollectiveRecorder(group)
    saved = {}
    try:
        for name in _WRAPPED:
            original = getattr(dist, name, None)
            if original is None:
                continue
            saved[name] = original
            setattr(dist, name, rec._wrap(name, original))
        yield rec
    finally:
        for name, original in saved.items():
            setattr(dist, name, original)
