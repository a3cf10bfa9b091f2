"""The exact communication schedule of one training step, and what it implies for overlap.

``ScheduleWatch`` rides on a ``Recorder`` (``paracheck.accounting.record``): while a step runs it
lists, in order, every collective the step launches, every host wait on a collective and every
device-to-host synchronisation, each with the phase of the step and the share of the step's
gradient bytes already produced when it happened. Like the recorder it needs no cooperation from
the code it watches (paracheck's variants, torch DDP, a user's class).

The events, their quantities and the exposed-communication model are
``paracheck.accounting._schedule_model`` (Note [Communication schedule of a step], Note [Exposed
communication model]); the watch is ``paracheck.accounting._schedule_watch`` (Note [Device syncs
counted on the CPU], Note [Host calls per step]).
"""

from __future__ import annotations

from paracheck.accounting._schedule_model import (
    COMPUTE_FLOPS,
    LINKS,
    PHASES,
    SCHEDULE_QUANTITIES,
    Link,
    ScheduleEvent,
    StepSchedule,
    exposed_communication,
    schedule_changes,
)
from paracheck.accounting._schedule_watch import ScheduleWatch

__all__ = [
    "COMPUTE_FLOPS",
    "LINKS",
    "PHASES",
    "SCHEDULE_QUANTITIES",
    "Link",
    "ScheduleEvent",
    "ScheduleWatch",
    "StepSchedule",
    "exposed_communication",
    "schedule_changes",
]
