"""A persistent pool of rank processes that runs one job (a picklable payload) at a time.

Starting W processes and a process group costs seconds; a property test wants hundreds of
examples. ``World`` starts its ranks once and keeps them. Each job names a module-level function
(``"package.module:function"``) that every rank of the job's world size calls with the payload;
the per-rank return values come back as a list.

Failures are results, not crashes of the driver:

* a rank that raises -> ``RankError`` with every failing rank's traceback; the pool stays usable;
* a job that does not finish within ``timeout`` of its last rank starting the job's code (Note
  [Started ranks]) -> ``RankHang`` naming every rank's Python stack,
  the collective it is blocked in and how many of each collective every rank issued; ranks that
  do not recover are killed and restarted. A deadlock that is certain (Note [Definite deadlock])
  is reported as soon as it is, without waiting for the timeout;
* a rank that dies (signal, ``os._exit``) -> ``RankDied`` with the signal or exit code and what
  it printed, then the dead ranks are replaced;
* a rank whose resident memory exceeds ``rank_memory`` GB -> ``RankOverMemory``: "rank r
  exceeded N GB at step s" (Note [Rank memory cap]).

Nothing outlives the World: its temporary directory is removed when it is closed or collected,
and its rank processes exit when the driver process dies (Note [Cleaning up]).

No fixed ports: the driver owns a ``TCPStore`` bound to port 0 (the kernel picks a free port),
so pools in several pytest-xdist workers never collide.

This module holds the ``World``: its jobs. Its ranks are a pool behind an interface
(``paracheck.world._pool.Pool``): ``paracheck.world._local.LocalPool`` starts, replaces and
stops processes on this machine (forked by a zygote: ``paracheck.world._processes``);
``paracheck.world.attached.AgentPool`` attaches to agents torchrun started. Beside it, one concern
a file: ``paracheck.world._collect`` collects a job's answers and gives its verdict (deaths,
hangs, stalls, timeouts); ``paracheck.world._watch`` reads the ranks' statuses while a job is late
and says what they disagree on; ``paracheck.world._memory`` holds the memory cap;
``paracheck.world._failures`` the failures and their exceptions. The code that runs inside a rank
is ``paracheck.world._rank``.
"""

from __future__ import annotations

import time

from paracheck.world._collect import JobLimits, Ticket, collect_once
from paracheck.world._failures import (
    PeerFailed,
    PoolLost,
    RankDied,
    RankError,
    RankFailure,
    RankHang,
    RankOverMemory,
    WorldError,
    WorldStartError,
)
from paracheck.world._local import LocalPool
from paracheck.world._memory import default_rank_memory
from paracheck.world._pool import Pool, group_timeout
from paracheck.world._rank import send
from paracheck.world._watch import OUTSIDE as OUTSIDE  # for the check's hang reports

__all__ = [
    "World",
    "WorldError",
    "RankError",
    "RankHang",
    "RankDied",
    "RankOverMemory",
    "RankFailure",
    "WorldStartError",
    "PeerFailed",
    "default_rank_memory",
]


class World:
    """``size`` persistent ranks serving jobs of any world size 1..size.

    ``backend`` is ``"gloo"`` (CPU) or ``"nccl"`` (one CUDA device per rank, taken from
    ``devices``, default ``cuda:0..size-1``). ``timeout`` (seconds) bounds every job; the process
    group's own timeout is set a little longer (``paracheck.world._pool.group_timeout``) so that
    the driver sees a hang first, records the stacks, and the ranks then recover by themselves
    when their collectives time out. ``rank_memory`` caps each rank's resident memory during a
    job, in GB (2**30 bytes; default ``default_rank_memory(size)``; settable between jobs): Note
    [Rank memory cap].

    Close it (``close()``, or a ``with`` block); one that is garbage-collected, or whose driver
    process dies, leaves no process or temporary directory behind (Note [Cleaning up]).

    The ranks are its ``pool`` (``paracheck.world._pool.Pool``): by default rank processes this
    World starts on this machine (``paracheck.world._local.LocalPool``); ``AttachedWorld``
    passes agents that torchrun started. The jobs and their verdicts are this class's.
    """

    # See Note [Timeout verdicts]: how long no rank still in a job may run before the job is a
    # stall (None: never judged so; only ranks whose processes the pool can see are), how long a
    # rank that finished may take to answer past the World's timeout, and whether a timeout that
    # nothing proves is run again on fresh ranks (where the pool can replace its ranks).
    stall_seconds: float | None = 3.0
    answer_seconds = 60.0
    reruns_timeouts = True
    # How long every rank of a job may take to start the job's code before paracheck gives up on
    # the job (None: ``start_timeout``); the job's own timeout counts from then (Note [Started
    # ranks] in paracheck.world._watch).
    begin_timeout: float | None = None

    def __init__(
        self,
        size: int,
        *,
        backend: str = "gloo",
        timeout: float = 30.0,
        devices: list[str] | None = None,
        start_timeout: float = 120.0,
        rank_memory: float | None = None,
        pool: Pool | None = None,
    ):
        if not isinstance(size, int) or size < 1:
            raise ValueError(f"size={size!r} must be an int >= 1")
        if backend not in ("gloo", "nccl"):
            raise ValueError(f"backend={backend!r} must be 'gloo' or 'nccl'")
        if not timeout > 0:
            raise ValueError(f"timeout={timeout!r} must be > 0 seconds")
        if backend == "nccl":
            import torch

            available = torch.cuda.device_count()
            if devices is None:
                if size > available:
                    raise ValueError(
                        f"size={size} exceeds the {available} CUDA device(s) present (backend='nccl')"
                    )
                devices = [f"cuda:{i}" for i in range(size)]
            if len(devices) < size:
                raise ValueError(f"devices={devices} has fewer than size={size} entries")
        if pool is not None and (pool.size, pool.backend) != (size, backend):
            raise ValueError(
                f"pool of size {pool.size} on {pool.backend!r} does not match size={size}, "
                f"backend={backend!r}"
            )
        self.size = size
        self.backend = backend
        self.timeout = float(timeout)
        self.devices = devices
        self.start_timeout = start_timeout
        self.rank_memory = default_rank_memory(size) if rank_memory is None else rank_memory
        self._last_world_size: int | None = None
        self._job = 0
        self.last_outputs: dict[int, str] = {}
        self.pool: Pool = pool or LocalPool(
            size,
            backend=backend,
            devices=devices,
            start_timeout=start_timeout,
            group_timeout=group_timeout(self.timeout),
        )
        self.pool.open()

    @property
    def rank_memory(self) -> float:
        return self._rank_memory

    @rank_memory.setter
    def rank_memory(self, cap: float) -> None:
        if isinstance(cap, bool) or not isinstance(cap, (int, float)) or not cap > 0:
            raise ValueError(f"rank_memory={cap!r} must be a number of GB > 0")
        self._rank_memory = float(cap)

    def _cap_bytes(self) -> int:
        return 0 if self._rank_memory == float("inf") else int(self._rank_memory * 2**30)

    # -- lifecycle ------------------------------------------------------------------------
    @property
    def restarts(self) -> int:
        """How often the pool was restarted or some of its ranks replaced."""
        return self.pool.restarts

    @property
    def start_seconds(self) -> float:
        """How long the last (re)start of the pool took."""
        return self.pool.start_seconds

    @property
    def job(self) -> int:
        """The number of the last job submitted (its ranks' status records name it)."""
        return self._job

    def restart(self) -> None:
        self.pool.restart()

    def close(self) -> None:
        self.pool.close()

    def kill(self) -> None:
        """End every rank now, inside a job or not (``close`` waits for a job to end): for a
        driver that was interrupted."""
        self.pool.kill(self._job)

    def __enter__(self) -> World:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def pids(self) -> list[int]:
        return self.pool.pids

    # -- jobs -----------------------------------------------------------------------------
    def run(
        self, fn: str, payload, *, world_size: int | None = None, timeout: float | None = None
    ) -> list:
        """Call ``fn(payload)`` on ranks 0..world_size-1; return their results in rank order."""
        return self.collect(self.submit(fn, payload, world_size=world_size, timeout=timeout))

    def submit(
        self, fn: str, payload, *, world_size: int | None = None, timeout: float | None = None
    ) -> Ticket:
        """Start a job and return a ticket for ``collect``; the driver is free meanwhile (the
        check computes the oracle while the ranks train). One job at a time. ``PoolLost`` where
        the pool cannot run another job (Note [A lost pool])."""
        w = self.size if world_size is None else world_size
        if not isinstance(w, int) or not 1 <= w <= self.size:
            raise ValueError(
                f"world_size={w!r} must be an int in 1..{self.size} (this World's size)"
            )
        timeout = self.timeout if timeout is None else timeout
        if not 0 < timeout <= self.timeout:
            # The ranks' process-group timeout was fixed from World.timeout at start; a longer job
            # timeout would let collectives time out first and read as "raised", not "hung".
            raise ValueError(
                f"timeout={timeout!r} must be in (0, {self.timeout:g}] (this World's timeout)"
            )
        return self._submit(fn, payload, w, timeout, rerun=False)

    def _submit(self, fn: str, payload, w: int, timeout: float, *, rerun: bool) -> Ticket:
        pool = self.pool
        if pool.lost is None and not all(pool.alive(r) for r in range(self.size)):
            pool.restart()
        if pool.lost is not None:
            raise PoolLost(pool.lost)
        if w != self._last_world_size:
            # A new default group is built; its store prefix must never have been used before
            # (stale addresses of an earlier group under the same prefix make gloo connect to
            # dead ports), so every re-creation gets a fresh generation.
            pool.regroup()
            self._last_world_size = w
        self._job += 1
        fresh = not any(pool.served[:w])
        for r in range(w):
            pool.served[r] += 1
        cap = self._cap_bytes()
        for conn in pool.conns:
            send(conn, ("run", self._job, w, pool.generation, fn, payload, cap))
        # The job's timeout counts from the moment its last rank started the job's code (Note
        # [Started ranks] in paracheck.world._watch), time the driver spends elsewhere included.
        submitted = time.monotonic()
        return Ticket(
            self._job, fn, w, submitted + timeout, submitted, payload, timeout, fresh, rerun
        )

    def collect(self, ticket: Ticket) -> list:
        """Wait for the job of ``ticket``; raise ``RankError``/``RankHang``/``RankDied``/
        ``RankOverMemory`` on failure. A job over the memory cap on processes that ran earlier jobs
        is run again on fresh ones first (Note [Rank memory cap]); so is a job past its timeout
        that nothing proves hung, with the World's whole timeout (Note [Timeout verdicts]).

        ``self.last_outputs`` then holds what each rank of the job printed (clipped)."""
        if ticket.job != self._job:
            raise RuntimeError(
                f"ticket for job {ticket.job} is stale (job {self._job} was submitted since)"
            )
        try:
            return self._collect(ticket)
        except RankHang as hang:
            # A stall on an overloaded machine is run again too (Note [Too slow to judge]).
            if hang.definite or (hang.stalled and not hang.overloaded):
                raise
            if ticket.rerun or not self.reruns_timeouts:
                raise
            if not self.pool.replaces_ranks:
                raise
            first = hang
        w = ticket.world_size
        if not self.pool.replace(list(range(w))):
            self.pool.restart()
        again = self._submit(ticket.fn, ticket.payload, w, self.timeout, rerun=True)
        try:
            return self._collect(again)
        except RankHang as hang:
            hang.rerun = True
            hang.limit = self.timeout
            first_words = (
                f"stalled at {first.seconds:.1f} s on a machine with {first.load:.1f} runnable "
                "processes per CPU"
                if first.stalled and first.load is not None
                else f"did not finish within {first.seconds:.1f} s"
            )
            hang.args = (
                f"{hang.args[0]} (run again on fresh ranks with a limit of {self.timeout:g} s "
                f"after it first {first_words})",
            )
            raise

    def _collect(self, ticket: Ticket) -> list:
        """The results of the job of ``ticket``; one that went over the memory cap on processes
        that ran earlier jobs is run again, on fresh ones (Note [Rank memory cap])."""
        limits = JobLimits(
            timeout=self.timeout,
            begin_timeout=self.start_timeout if self.begin_timeout is None else self.begin_timeout,
            answer_seconds=self.answer_seconds,
            stall_seconds=self.stall_seconds,
        )
        while True:
            self.last_outputs = {}
            results = collect_once(self.pool, ticket, limits, self.last_outputs)
            if results is not None:
                return results
            ticket = self._submit(
                ticket.fn, ticket.payload, ticket.world_size, ticket.timeout, rerun=ticket.rerun
            )
