"""Bytes communicated per step: analytic models per design, and the per-call records of what was
sent.

Two measures, both per rank and per step:

* **payload bytes**: the size of the tensor each collective call is given, the quantity
  ``record_collectives`` counts exactly. Convention: ``all_reduce`` / ``broadcast``: the tensor;
  ``reduce_scatter``: the full input (``W`` chunks); ``all_gather``: the full output.
* **bus bytes** (``StepTraffic.bus_bytes``): the payloads costed by Note [Bus bytes] in
  ``paracheck.accounting.cost``, what the busiest link carries with ring algorithms, the usual
  model for comparing designs (Note [Owner broadcast versus ZeRO-1]).

Note [Owner broadcast versus ZeRO-1]
    Let Psi be the bytes of the trainable parameters and W > 1 the world size. Per rank and step,
    in bus bytes (Note [Bus bytes]): all-reduce 2(W-1)/W Psi, reduce-scatter (W-1)/W Psi,
    all-gather (W-1)/W Psi, and a broadcast of every parameter from its owner Psi (each broadcast
    is a chain whose busiest link carries the whole message, whichever rank is the root).

    * DDP:             all-reduce                    = 2(W-1)/W Psi
    * ZeRO-1:          reduce-scatter + all-gather   = 2(W-1)/W Psi' (Psi' = Psi plus padding to
                       a multiple of W per bucket: at most (W-1) elements per bucket)
    * owner broadcast: all-reduce + broadcast        = (3W-2)/W Psi

    The owner-broadcast ``ShardedOptimizer`` therefore costs W/(2(W-1)) + 1 times what ZeRO-1 costs
    (2x at W = 2, 5/3 at W = 4, tending to 1.5x); in bytes *received* per rank the broadcasts of a
    balanced partition are (W-1)/W Psi (a rank receives every parameter it does not own), and the
    ratio is 1.5x at every W. Either way the owner broadcast sends more than ZeRO-1, at least 1.5x
    as much; the payload bytes, by contrast, are 2 Psi for both designs, which is why a count of
    "tensor bytes handed to NCCL" alone does not show the difference. Both paracheck designs also
    reduce one presence flag per trainable parameter (Note [Gradients that exist on some ranks
    only] in ``paracheck.ddp._common``): n * element_size bytes, counted exactly below.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from paracheck.accounting.cost import bus_bytes
from paracheck.accounting.record import Recorder

__all__ = [
    "RecordedCollectives",
    "StepTraffic",
    "flat_ddp_traffic",
    "owner_broadcast_traffic",
    "record_collectives",
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

    def bus_bytes(self, world_size: int) -> float:
        """Bus bytes of every call (Note [Bus bytes] in ``paracheck.accounting.cost``)."""
        return sum(bus_bytes(k, b, world_size) for k, _, b in self.entries)


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

# Kinds that carry no data: not traffic, and not recorded by the check (a barrier in a step would
# otherwise break the traffic property of a design that sends exactly its model's bytes).
_NOT_TRAFFIC = frozenset({"barrier"})


class RecordedCollectives:
    """What ``record_collectives`` saw: ``calls`` lists (kind, payload bytes) per collective call,
    in call order (Note [Exact quantities] in ``paracheck.accounting.record`` for the sizes)."""

    def __init__(self, recorder: Recorder, group=None, control: bool = True):
        self._recorder = recorder
        self.group = group
        self.control = control

    def _matches(self, call) -> bool:
        if not self.control and call.is_control:
            return False
        # call.group is None only on a torch that cannot unbox the group: kept, as unknown.
        return self.group is None or call.group is None or call.group is self.group

    @property
    def calls(self) -> list[tuple[str, int]]:
        return [
            (c.kind, c.payload_bytes)
            for c in self._recorder.calls
            if c.kind not in _NOT_TRAFFIC and self._matches(c)
        ]

    @property
    def typed_calls(self) -> list[tuple[str, str, int]]:
        """``calls`` with each payload's element type: (kind, dtype, payload bytes)."""
        return [
            (c.kind, c.dtype, c.payload_bytes)
            for c in self._recorder.calls
            if c.kind not in _NOT_TRAFFIC and self._matches(c)
        ]

    def traffic(self) -> StepTraffic:
        d: dict[str, tuple[int, int]] = {}
        for name, b in self.calls:
            c0, b0 = d.get(name, (0, 0))
            d[name] = (c0 + 1, b0 + b)
        return StepTraffic.from_dict(d)


@contextlib.contextmanager
def record_collectives(*, group=None, control: bool = True) -> Iterator[RecordedCollectives]:
    """Record every collective operator dispatched inside the block, one payload size per call.

    ``group`` restricts the records to one process group (None: all groups). ``control=False``
    leaves out the reductions by max, min, product or a bitwise operation
    (``CollectiveCall.is_control``): agreements between the ranks, never a gradient average.

    A thin view of a ``paracheck.accounting.record.Recorder`` that tracks no memory: it sees every call however it
    was made (through a function bound before the block, from C++ as torch DDP's reducer does,
    asynchronously, on a view), a forwarding alias once, and a coalesced call
    (``_coalescing_manager``, ``all_reduce_coalesced``) as the one message it is. Blocks nest.
    """
    with Recorder(track_memory=False) as rec:
        yield RecordedCollectives(rec, group, control)
