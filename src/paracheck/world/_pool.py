"""What a ``World`` needs of its ranks: the ``Pool`` interface, and what every pool shares.

A ``World`` runs jobs and judges them (``paracheck.world.runner``, ``paracheck.world._collect``);
the ranks that run them belong to its pool. Two pools implement the interface:
``paracheck.world._local.LocalPool``, rank processes this machine started (and replaces), and
``paracheck.world.attached.AgentPool``, agents that torchrun started on any number of nodes (Note
[Attached ranks]). The World and its collection reach a rank only through the methods below.
"""

from __future__ import annotations

import time
from multiprocessing.connection import Connection, wait
from typing import Protocol

from paracheck.world._failures import RankFailure
from paracheck.world._rank import recv

__all__ = ["Pool", "await_answers", "group_timeout"]


def group_timeout(timeout: float) -> float:
    """The ranks' process-group timeout for a World whose jobs take at most ``timeout`` seconds:
    a little longer, so that the driver sees a hang first, records the stacks, and the ranks then
    recover by themselves when their collectives time out."""
    return timeout + max(1.0, 0.2 * timeout)


class Pool(Protocol):
    """The ranks of a ``World``: ``size`` of them, each with a connection that jobs go out on and
    answers come back on (``conns``), a status record, a stack and an output the driver can read.

    A pool owns the default process group's store and its ``generation`` (the store prefix under
    which the ranks create the next group: Note [One default group per world size]), and how a
    rank is started, replaced, freed and stopped. The World owns the jobs."""

    size: int
    backend: str
    # One per rank, in rank order: the job messages go out and the answers come back on it.
    conns: list[Connection]
    # Jobs each rank's process has run, the current one included (0: a fresh process).
    served: list[int]
    generation: int
    restarts: int  # how often the pool was restarted or some of its ranks replaced
    start_seconds: float  # how long the last (re)start of the pool took
    spawn_seconds: float  # how long the last start of single ranks took (0: none yet)
    group_timeout: float  # the ranks' process-group timeout (``group_timeout``)
    # Whether a rank that is stuck or dead can be replaced by a new process (then a timeout that
    # nothing proves is run again on fresh ranks: Note [Timeout verdicts]).
    replaces_ranks: bool
    restarted_words: str  # what ``restart()`` did, for a report

    @property
    def lost(self) -> str | None:
        """Why the pool cannot run another job (Note [A lost pool]); None while it can."""

    # -- lifecycle ------------------------------------------------------------------------
    def open(self) -> None:
        """Start the ranks (once, from the World's constructor); on failure release everything
        the pool holds and raise."""

    def replace(self, ranks: list[int]) -> bool:
        """Kill ranks ``ranks`` and start new processes for them (every other rank has been told
        to drop its group); False if that did not work (then restart the pool)."""

    def restart(self) -> None:
        """Replace every rank, or, where ranks cannot be replaced, mark the pool lost."""

    def regroup(self) -> None:
        """Have the ranks create a new default group for the next job (a fresh ``generation``):
        ranks that finished a failed job still hold the old one."""

    def reset(self, ranks: list[int]) -> None:
        """Tell ``ranks`` to drop their group (their peers' collectives with them then fail)."""

    def close(self) -> None:
        """Stop the ranks once their job ended, and release what the pool holds."""

    def kill(self, job: int) -> None:
        """End every rank now, inside job ``job`` or not (for a driver that was interrupted)."""

    @property
    def pids(self) -> list[int]: ...

    # -- what the driver sees of a rank, and how it frees one ------------------------------
    def alive(self, rank: int) -> bool: ...

    def status(self, rank: int) -> dict | None:
        """Rank ``rank``'s collective counts (``paracheck.world._collectives``)."""

    def output(self, rank: int) -> str:
        """What rank ``rank`` printed since its last answer (Note [Captured output])."""

    def stacks(self, ranks: list[int]) -> dict[int, str]:
        """Every thread's Python stack of each of ``ranks``, taken while it may be blocked."""

    def death(self, rank: int, job: int) -> RankFailure:
        """How rank ``rank``, found dead during job ``job``, ended, with what it printed."""

    def activity(self, rank: int) -> tuple[int, bool] | None:
        """The CPU time (ns) rank ``rank``'s threads used and whether one waits for a disk now
        (Note [Timeout verdicts]); None where the pool cannot see its process."""

    def free(self, stuck: list[int], job: int) -> bool:
        """Have every rank not in ``stuck`` drop its group (a peer blocked in a collective with
        one of them then fails out of it: measured on gloo, 1 s after the peer's
        destroy_process_group, against the group's timeout), and give up job ``job`` on the
        ``stuck`` ranks where the pool can reach into a rank; True where it did, which may let
        them answer."""

    def unstick_deadline(self, started: float) -> float | None:
        """Until when (monotonic) to wait for the group's timeout to free ranks still stuck in a
        job started at ``started`` after their peers dropped the group; None where replacing
        them is sooner (or the only way)."""


def await_answers(pool: Pool, ranks: list[int], job: int, deadline: float) -> bool:
    """Wait until each of ``ranks`` answered job ``job`` (or its connection ended), at the latest
    until ``deadline``; True if they all did."""
    pending = {r: pool.conns[r] for r in ranks}
    while pending and time.monotonic() < deadline:
        for conn in wait(list(pending.values()), timeout=max(0.0, deadline - time.monotonic())):
            rank = pool.conns.index(conn)  # type: ignore[arg-type]
            try:
                msg = recv(conn)
            except (EOFError, OSError):
                pending.pop(rank, None)
                continue
            if msg[0] == job:
                pending.pop(rank, None)
    return not pending
