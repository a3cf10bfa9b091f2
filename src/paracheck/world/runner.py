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

This module holds the ``World``: its pool's lifecycle and its jobs. Beside it, one concern a
file: ``paracheck.world._collect`` collects a job's answers and gives its verdict (deaths, hangs,
stalls, timeouts); ``paracheck.world._watch`` reads the ranks' statuses while a job is late and
says what they disagree on; ``paracheck.world._processes`` starts, forks (the zygote) and cleans
up the processes; ``paracheck.world._memory`` holds the memory cap; ``paracheck.world._failures``
the failures and their exceptions. The code that runs inside a rank is ``paracheck.world._rank``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import weakref
from datetime import timedelta
from multiprocessing.connection import Listener, wait
from typing import TYPE_CHECKING

from paracheck.world import _collect
from paracheck.world._collectives import read_status
from paracheck.world._failures import (
    PeerFailed,
    RankDied,
    RankError,
    RankFailure,
    RankHang,
    RankOverMemory,
    WorldError,
    WorldStartError,
)
from paracheck.world._memory import _exceeded, _gb, default_rank_memory, memory_record
from paracheck.world._processes import (
    _describe_exit,
    _Forked,
    _read,
    _remove_dir,
    _sigint_blocked,
    _size,
    _wait_code,
    _Zygote,
    rank_env,
)
from paracheck.world._processes import hellos as hellos  # for paracheck.world.attached
from paracheck.world._rank import _recv, _send, hold_lock, read_output
from paracheck.world._watch import OUTSIDE as OUTSIDE  # for the check's hang reports
from paracheck.world._watch import process_activity

if TYPE_CHECKING:
    from torch.distributed import TCPStore

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
    group's own timeout is set a little longer so that the driver sees a hang first, records the
    stacks, and the ranks then recover by themselves when their collectives time out.
    ``rank_memory`` caps each rank's resident memory during a job, in GB (2**30 bytes; default
    ``default_rank_memory(size)``; settable between jobs): Note [Rank memory cap].

    Close it (``close()``, or a ``with`` block); one that is garbage-collected, or whose driver
    process dies, leaves no process or temporary directory behind (Note [Cleaning up]).

    A pool whose ranks it did not start (``paracheck.world.attached.AttachedWorld``) overrides
    how the ranks are started, replaced and stopped (``_start``, ``_respawn``, ``restart``,
    ``_kill``, ``close``, ``kill``) and how the driver sees and frees a rank (the methods under
    "what the driver sees of a rank"); the jobs and their verdicts are this class's.
    """

    restarted_words = "the pool was restarted"  # what a restart() did, for a report

    # See Note [Timeout verdicts]: how long no rank still in a job may run before the job is a
    # stall (None: never judged so; the ranks' processes must be on this machine), how long a
    # rank that finished may take to answer past the World's timeout, and whether a timeout that
    # nothing proves is run again on fresh ranks.
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
        self.size = size
        self.backend = backend
        self.timeout = float(timeout)
        self.devices = devices
        self.start_timeout = start_timeout
        self.rank_memory = default_rank_memory(size) if rank_memory is None else rank_memory
        self._generation = 0
        self._last_world_size: int | None = None
        self._job = 0
        self._procs: list = []
        self._conns: list = []
        self._store: TCPStore | None = None
        self._served = [0] * size  # jobs each rank's process has run, this one included
        self._fresh = True  # the last job's ranks had run no job before it
        self._submitted: tuple = ()  # (fn, payload, world size, timeout) of the last job
        self._stack_dir = tempfile.mkdtemp(prefix="paracheck-world-")
        # The driver's lock keeps the ranks from removing the directory (Note [Cleaning up]).
        self._lock = hold_lock(self._stack_dir)
        self._cleanup = weakref.finalize(self, _remove_dir, self._stack_dir, self._lock)
        self.restarts = 0
        self.start_seconds = 0.0  # how long the last (re)start of the pool took
        self.spawn_seconds = 0.0  # how long the last start of single ranks took (0: none yet)
        self.last_outputs: dict[int, str] = {}
        self._submitted_at = 0.0
        self._rerunning = False  # collect() is running a job again (Note [Timeout verdicts])
        # Forks a gloo World's ranks (Note [Forked ranks]).
        self._zygote = _Zygote(self._stack_dir)
        self._exits: dict[int, RankFailure] = {}  # how the ranks _replace_dead found dead ended
        self._pg_timeout = self.timeout + max(1.0, 0.2 * self.timeout)
        try:
            self._start()
        except BaseException:
            self._zygote.stop()
            self._cleanup()
            raise

    @property
    def rank_memory(self) -> float:
        return self._rank_memory

    @rank_memory.setter
    def rank_memory(self, gb: float) -> None:
        if isinstance(gb, bool) or not isinstance(gb, (int, float)) or not gb > 0:
            raise ValueError(f"rank_memory={gb!r} must be a number of GB > 0")
        self._rank_memory = float(gb)

    def _cap_bytes(self) -> int:
        return 0 if self._rank_memory == float("inf") else int(self._rank_memory * 2**30)

    # -- lifecycle ------------------------------------------------------------------------
    def _start(self) -> None:
        import torch.distributed as dist

        t0 = time.monotonic()
        self._store = dist.TCPStore(
            "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60)
        )
        self._procs, self._conns = [None] * self.size, [None] * self.size
        # A gloo pool is forked whole by the zygote, which imports torch once (Note [Forked ranks]).
        if self.backend == "gloo":
            self._zygote.start()
            self._zygote.await_ready(self.start_timeout)
        try:
            self._spawn(list(range(self.size)), fork=self._zygote.ready())
        except BaseException:
            self._kill()
            raise
        self.start_seconds = time.monotonic() - t0
        self.spawn_seconds = self.spawn_seconds or self.start_seconds

    def _spawn(self, ranks: list[int], fork: bool = False) -> None:
        """Start the rank processes ``ranks`` (the store and the other ranks exist) and wait until
        each has connected; ``fork``: forked by the zygote (Note [Forked ranks])."""
        # Ranks are plain subprocesses (``python -m paracheck.world._rank``), not multiprocessing
        # children: nothing of the driver's __main__ is re-imported, so a World works from a
        # script, a REPL, stdin, pytest and pytest-xdist alike.
        store = self._store
        assert store is not None  # set by _start before any rank is spawned
        assert not fork or self._zygote.pid is not None  # fork is only asked for when it is ready
        authkey = os.urandom(16)
        # A backlog for every rank: forked ranks connect within milliseconds of each other, and
        # with multiprocessing's default of 1 a connection the full queue dropped left its rank
        # waiting for the handshake while the driver saw nothing to accept.
        listener = Listener(("127.0.0.1", 0), authkey=authkey, backlog=len(ranks) + 1)
        address = f"{listener.address[0]}:{listener.address[1]}"
        env = rank_env(authkey)
        for rank in ranks:
            device = self.devices[rank] if self.devices else ""
            if fork:
                self._zygote.fork(
                    [
                        rank,
                        "127.0.0.1",
                        store.port,
                        address,
                        self._stack_dir,
                        self.backend,
                        device or None,
                        self._pg_timeout,
                        authkey.hex(),
                    ]
                )
                self._procs[rank] = None
                continue
            args = [
                sys.executable,
                "-m",
                "paracheck.world._entry",
                str(rank),
                "127.0.0.1",
                str(store.port),
                address,
                self._stack_dir,
                self.backend,
                device,
                repr(self._pg_timeout),
            ]
            with _sigint_blocked():
                self._procs[rank] = subprocess.Popen(args, env=env, stdin=subprocess.DEVNULL)
        try:
            self._connect(ranks, listener, fork)
        finally:
            listener.close()

    def _connect(self, ranks: list[int], listener: Listener, fork: bool) -> None:
        """Wait until each of the new ranks ``ranks`` connected to ``listener`` and said hello;
        ``WorldStartError`` where one exits first or they take longer than ``start_timeout``."""
        deadline = time.monotonic() + self.start_timeout

        def give_up() -> None:
            dead = {
                r: _describe_exit(self._procs[r].poll())
                for r in ranks
                if self._procs[r] is not None and self._procs[r].poll() is not None
            }
            if fork and self._zygote.exited():
                raise RuntimeError("the zygote that forks replacement ranks exited")
            if dead or time.monotonic() > deadline:
                printed = "".join(
                    f"\n--- rank {r} printed ---\n{self._output(r)}"
                    for r in sorted(dead)
                    if self._output(r)
                )
                raise WorldStartError(
                    f"ranks failed to start: {dead}{printed}"
                    if dead
                    else f"ranks did not start within {self.start_timeout} s"
                )

        late = f"a rank connected but did not report within {self.start_timeout} s"
        connected = 0
        for conn, hello in hellos(listener, deadline, give_up, late):
            self._conns[hello[1]] = conn
            self._served[hello[1]] = 0
            if fork:
                self._procs[hello[1]] = _Forked(hello[2], self._stack_dir)
            connected += 1
            if connected == len(ranks):
                break

    def _respawn(self, ranks: list[int]) -> bool:
        """Kill ranks ``ranks`` and start new processes for them; every other rank has been told
        to drop its group. False if that did not work (then restart the pool)."""
        for r in ranks:
            if self._procs[r].poll() is None:
                self._procs[r].kill()
        if any(self._procs[r].poll() is not None for r in range(self.size) if r not in ranks):
            return False
        for r in ranks:
            _wait_code(self._procs[r])
            self._conns[r].close()
        t0 = time.monotonic()
        self._zygote.await_ready(self.start_timeout)
        try:
            self._spawn(list(ranks), fork=self._zygote.ready())
        except (RuntimeError, OSError):
            return False
        self.spawn_seconds = time.monotonic() - t0
        if self.backend == "gloo":  # a zygote that died is started again (Note [Forked ranks])
            self._zygote.start()
        self.restarts += 1
        self._generation += 1
        return True

    def _replace_dead(self, dead: list[int], pending: dict, also: tuple[int, ...] = ()) -> bool:
        """After ranks ``dead`` died in a job: let the survivors still in it fail out (their peers
        are gone, so their collectives fail), have every survivor drop its group, and start new
        processes for the dead ranks and the ranks ``also``; ranks found dead meanwhile are added
        to ``dead``. False if that did not work (then restart the pool)."""
        known = set(dead)
        waiting = {r: c for r, c in pending.items() if r not in dead}
        deadline = time.monotonic() + 3.0
        while waiting and time.monotonic() < deadline:
            for conn in wait(list(waiting.values()), timeout=max(0.0, deadline - time.monotonic())):
                rank = self._conns.index(conn)
                try:
                    msg = _recv(conn)
                except (EOFError, OSError):
                    dead.append(rank)  # a mismatched collective can abort every rank of the pair
                    waiting.pop(rank, None)
                    continue
                if msg[0] == self._job:
                    waiting.pop(rank, None)
        dead += [r for r in range(self.size) if r not in dead and self._procs[r].poll() is not None]
        self._exits = {r: self._death(r, self._job) for r in dead if r not in known}
        if waiting:
            return False
        for r in range(self.size):
            if r not in dead:
                _send(self._conns[r], ("reset",))
        return self._respawn(sorted(set(dead) | set(also)))

    def _kill(self) -> None:
        self._served = [0] * self.size
        self._procs = [p for p in self._procs if p is not None]
        for p in self._procs:
            if p.poll() is None:
                p.kill()
        for p in self._procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        for c in self._conns:
            if c is not None:
                c.close()
        self._procs, self._conns = [], []
        self._store = None

    def restart(self) -> None:
        self._kill()
        self.restarts += 1
        self._generation += 1
        self._start()

    def close(self) -> None:
        for conn in self._conns:
            try:
                _send(conn, ("stop",))
            except (BrokenPipeError, OSError):
                pass
        for p in self._procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        self._kill()
        self._zygote.stop()  # last: it reaps (and reports) the ranks it forked
        self._cleanup()

    def kill(self) -> None:
        """End every rank and the zygote now, inside a job or not (``close`` waits for a job to
        end): for a driver that was interrupted."""
        self._kill()
        self._zygote.stop()
        self.close()  # whatever else close releases; the ranks are gone already

    def __enter__(self) -> World:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self._kill()
            self._zygote.stop()
        except Exception:
            pass
        cleanup = getattr(self, "_cleanup", None)  # absent when __init__ refused its arguments
        if cleanup is not None:
            cleanup()

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    # -- jobs -----------------------------------------------------------------------------
    def run(
        self, fn: str, payload, *, world_size: int | None = None, timeout: float | None = None
    ) -> list:
        """Call ``fn(payload)`` on ranks 0..world_size-1; return their results in rank order."""
        return self.collect(self.submit(fn, payload, world_size=world_size, timeout=timeout))

    def submit(
        self, fn: str, payload, *, world_size: int | None = None, timeout: float | None = None
    ):
        """Start a job and return a ticket for ``collect``; the driver is free meanwhile (the
        check computes the oracle while the ranks train). One job at a time."""
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
        if any(p.poll() is not None for p in self._procs):
            self.restart()
        if w != self._last_world_size:
            # A new default group is built; its store prefix must never have been used before
            # (stale addresses of an earlier group under the same prefix make gloo connect to
            # dead ports), so every re-creation gets a fresh generation.
            self._generation += 1
            self._last_world_size = w
        self._job += 1
        job = self._job
        self._fresh = not any(self._served[:w])
        for r in range(w):
            self._served[r] += 1
        self._submitted = (fn, payload, w, timeout)
        cap = self._cap_bytes()
        for conn in self._conns:
            _send(conn, ("run", job, w, self._generation, fn, payload, cap))
        # The job's timeout counts from the moment its last rank started the job's code (Note
        # [Started ranks] in paracheck.world._watch), time the driver spends elsewhere included.
        self._submitted_at = time.monotonic()
        return (job, fn, w, self._submitted_at + timeout)

    def collect(self, ticket) -> list:
        """Wait for the job of ``ticket``; raise ``RankError``/``RankHang``/``RankDied``/
        ``RankOverMemory`` on failure. A job over the memory cap on processes that ran earlier jobs
        is run again on fresh ones first (Note [Rank memory cap]); so is a job past its timeout
        that nothing proves hung, with the World's whole timeout (Note [Timeout verdicts]).

        ``self.last_outputs`` then holds what each rank of the job printed (clipped)."""
        return _collect.collect(self, ticket)

    # -- what the driver sees of a rank, and how it frees one ------------------------------
    # The job collection (``paracheck.world._collect``) and its watch read a rank only through
    # these methods, ``_replace_dead``, ``_respawn`` and ``restart``; an ``AttachedWorld`` answers
    # them from its agents.
    def _output(self, rank: int) -> str:
        """What rank ``rank`` printed since its last answer (Note [Captured output])."""
        return read_output(os.path.join(self._stack_dir, f"rank{rank}.out"))

    def _death(self, rank: int, job: int) -> RankFailure:
        """How rank ``rank``, found dead during job ``job``, ended: over its memory cap (Note
        [Rank memory cap]), or its exit code or signal; with what it printed."""
        output = self._output(rank)
        record = memory_record(self._stack_dir, rank, job)
        code = _wait_code(self._procs[rank])
        if record is None:
            return RankFailure(rank, "died", _describe_exit(code), output=output)
        return RankFailure(
            rank,
            "memory",
            f"{_exceeded(record)} (resident memory {_gb(record['rss'])}); stopped by paracheck",
            output=output,
            status=record,
        )

    def _activity(self, rank: int) -> tuple[int, bool] | None:
        """Rank ``rank``'s process: the CPU time its threads used (ns), and whether one of them
        waits for a disk now (Note [Timeout verdicts]); None where unknown
        (not a local gloo rank, or /proc is missing)."""
        if self.backend != "gloo" or self.stall_seconds is None:
            return None
        return process_activity(self._procs[rank].pid)

    def _stacks(self, ranks: list[int]) -> dict[int, str]:
        """Every thread's Python stack of each of ``ranks``, dumped by faulthandler on SIGUSR1
        (it works while the rank is blocked inside a collective)."""
        for rank in ranks:
            try:
                os.kill(self._procs[rank].pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass
        # faulthandler writes from the signal handler: wait until every stack is there (at most 0.3 s).
        paths = {r: os.path.join(self._stack_dir, f"rank{r}.stack") for r in ranks}
        until = time.monotonic() + 0.3
        while time.monotonic() < until and not all(_size(p) > 0 for p in paths.values()):
            time.sleep(0.02)
        time.sleep(0.02)
        return {r: _read(p) for r, p in paths.items()}

    def _alive(self, rank: int) -> bool:
        return self._procs[rank].poll() is None

    def _status(self, rank: int) -> dict | None:
        """Rank ``rank``'s collective counts (``paracheck.world._collectives``)."""
        return read_status(os.path.join(self._stack_dir, f"rank{rank}.status"))

    def _abandon(self, stuck: list[int]) -> bool:
        """The stuck ranks' job is given up (nothing to do here: their processes are replaced
        if they do not answer); True where that may let them answer."""
        return False

    def _unstick(self, stuck: list[int], started: float) -> bool:
        """Ranks still stuck 2 s after their peers dropped the group: their collectives fail when
        the group's timeout expires; wait for that only when it is sooner than replacing their
        processes would take. True if they all answered."""
        remaining = started + self._pg_timeout + 1.0 - time.monotonic()
        return 0 < remaining < self.spawn_seconds and self._await_stuck(
            stuck, time.monotonic() + remaining
        )

    def _await_stuck(self, stuck: list[int], deadline: float) -> bool:
        """Wait until each of ``stuck`` answered the job (or its connection ended), at the latest
        until ``deadline``; True if they all did."""
        pending = {r: self._conns[r] for r in stuck}
        while pending and time.monotonic() < deadline:
            for conn in wait(list(pending.values()), timeout=max(0.0, deadline - time.monotonic())):
                rank = self._conns.index(conn)
                try:
                    msg = _recv(conn)
                except (EOFError, OSError):
                    pending.pop(rank, None)
                    continue
                if msg[0] == self._job:
                    pending.pop(rank, None)
        return not pending
