"""Analytic memory and communication models, and a recorder that counts what was actually sent.

Exact quantities (optimizer-state bytes per rank, payload bytes per collective per step) are
noise-free: properties and benchmarks compare them with what ranks measure, bit for bit.
"""

from paracheck.accounting.memory import (
    MemoryBreakdown,
    StateModel,
    flat_state_bytes,
    measured_state_bytes,
    sharded_state_bytes,
    state_model,
    training_memory,
)
from paracheck.accounting.traffic import (
    CollectiveRecorder,
    StepTraffic,
    flat_ddp_traffic,
    owner_broadcast_traffic,
    record_collectives,
    wire_bytes,
    zero1_traffic,
)

__all__ = [
    "CollectiveRecorder",
    "MemoryBreakdown",
    "StateModel",
    "StepTraffic",
    "flat_ddp_traffic",
    "flat_state_bytes",
    "measured_state_bytes",
    "owner_broadcast_traffic",
    "record_collectives",
    "sharded_state_bytes",
    "state_model",
    "training_memory",
    "wire_bytes",
    "zero1_traffic",
]
