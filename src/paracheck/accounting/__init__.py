"""Analytic memory and communication models, their one cost model, and the one recorder that
measures what ranks actually send and hold.

Exact quantities (optimizer-state bytes per rank, payload bytes per collective per step, live and
peak tensor bytes) are noise-free: properties and benchmarks compare them with what ranks measure,
bit for bit.

* ``memory``: optimizer state and training-step memory per rank, analytic;
* ``traffic``: payload bytes per step per design, analytic, and ``record_collectives``, the
  per-call payload records the check reads;
* ``cost``: Note [Bus bytes], what one collective costs on the wire;
* ``record``: ``Recorder``, the dispatch mode behind every measured quantity;
* ``schedule``: the communication schedule of a step (launch points, waits, device syncs) and
  its exposed-communication model.
"""

from paracheck.accounting.cost import bus_bytes, bus_factor
from paracheck.accounting.memory import (
    MemoryBreakdown,
    StateModel,
    flat_state_bytes,
    measured_state_bytes,
    sharded_state_bytes,
    state_model,
    training_memory,
    zero_construction_bytes,
)
from paracheck.accounting.record import COLLECTIVE_KINDS, CollectiveCall, Recorder
from paracheck.accounting.traffic import (
    RecordedCollectives,
    StepTraffic,
    flat_ddp_traffic,
    owner_broadcast_traffic,
    record_collectives,
    zero1_traffic,
)

__all__ = [
    "COLLECTIVE_KINDS",
    "CollectiveCall",
    "MemoryBreakdown",
    "RecordedCollectives",
    "Recorder",
    "StateModel",
    "StepTraffic",
    "bus_bytes",
    "bus_factor",
    "flat_ddp_traffic",
    "flat_state_bytes",
    "measured_state_bytes",
    "owner_broadcast_traffic",
    "record_collectives",
    "sharded_state_bytes",
    "state_model",
    "training_memory",
    "zero_construction_bytes",
    "zero1_traffic",
]
