"""``LocalPool``: a World's rank processes on this machine, started, replaced and stopped here.

The ranks are plain subprocesses (``python -m paracheck.world._entry``) or, for gloo, forked by a
zygote (Note [Forked ranks]); each connects back to the driver's listener and serves jobs
(``paracheck.world._rank``). What they print, their status records and their stack dumps are
files in the pool's temporary directory, which nothing outlives (Note [Cleaning up]).
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
from multiprocessing.connection import Connection, Listener
from typing import TYPE_CHECKING

from paracheck.world._collectives import read_status
from paracheck.world._failures import RankFailure, WorldStartError
from paracheck.world._memory import exceeded, gb, memory_record
from paracheck.world._processes import (
    Forked,
    Zygote,
    describe_exit,
    file_size,
    hellos,
    rank_env,
    read_text,
    remove_dir,
    sigint_blocked,
    wait_code,
)
from paracheck.world._rank import hold_lock, read_output, send
from paracheck.world._watch import process_activity

if TYPE_CHECKING:
    from torch.distributed import TCPStore

__all__ = ["LocalPool"]

# How long a stack dump may take to appear after SIGUSR1 (faulthandler writes it from the signal
# handler), and how often to look.
_STACK_SECONDS = 0.3
_STACK_POLL = 0.02


class LocalPool:
    """``size`` rank processes on this machine (``paracheck.world._pool.Pool``): gloo on CPU, or
    NCCL with one CUDA device each from ``devices``. A rank that died or stays stuck is replaced
    by a new process; ``start_timeout`` bounds each start. Collected or closed, it leaves no
    process or directory behind (Note [Cleaning up])."""

    replaces_ranks = True
    restarted_words = "the pool was restarted"
    lost: str | None = None  # a local pool replaces its ranks: never lost

    def __init__(
        self,
        size: int,
        *,
        backend: str,
        devices: list[str] | None,
        start_timeout: float,
        group_timeout: float,
    ):
        self.size = size
        self.backend = backend
        self.devices = devices
        self.start_timeout = start_timeout
        self.group_timeout = group_timeout
        self.generation = 0
        self.restarts = 0
        self.start_seconds = 0.0
        self.spawn_seconds = 0.0
        self.served = [0] * size
        self.conns: list[Connection] = []
        self._procs: list = []
        self._store: TCPStore | None = None
        self._stack_dir = tempfile.mkdtemp(prefix="paracheck-world-")
        # The driver's lock keeps the ranks from removing the directory (Note [Cleaning up]).
        self._lock = hold_lock(self._stack_dir)
        self._cleanup = weakref.finalize(self, remove_dir, self._stack_dir, self._lock)
        # Forks a gloo pool's ranks (Note [Forked ranks]).
        self.zygote = Zygote(self._stack_dir)

    # -- lifecycle ------------------------------------------------------------------------
    def open(self) -> None:
        try:
            self._start()
        except BaseException:
            self.zygote.stop()
            self._cleanup()
            raise

    def _start(self) -> None:
        import torch.distributed as dist

        t0 = time.monotonic()
        self._store = dist.TCPStore(
            "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60)
        )
        self._procs = [None] * self.size
        self.conns = [None] * self.size  # type: ignore[list-item]  # filled as ranks connect
        # A gloo pool is forked whole by the zygote, which imports torch once (Note [Forked ranks]).
        if self.backend == "gloo":
            self.zygote.start()
            self.zygote.await_ready(self.start_timeout)
        try:
            self._spawn(list(range(self.size)), fork=self.zygote.ready())
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
        assert not fork or self.zygote.pid is not None  # fork is only asked for when it is ready
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
                self.zygote.fork(
                    [
                        rank,
                        "127.0.0.1",
                        store.port,
                        address,
                        self._stack_dir,
                        self.backend,
                        device or None,
                        self.group_timeout,
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
                repr(self.group_timeout),
            ]
            with sigint_blocked():
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
                r: describe_exit(self._procs[r].poll())
                for r in ranks
                if self._procs[r] is not None and self._procs[r].poll() is not None
            }
            if fork and self.zygote.exited():
                raise RuntimeError("the zygote that forks replacement ranks exited")
            if dead or time.monotonic() > deadline:
                printed = "".join(
                    f"\n--- rank {r} printed ---\n{self.output(r)}"
                    for r in sorted(dead)
                    if self.output(r)
                )
                raise WorldStartError(
                    f"ranks failed to start: {dead}{printed}"
                    if dead
                    else f"ranks did not start within {self.start_timeout} s"
                )

        late = f"a rank connected but did not report within {self.start_timeout} s"
        connected = 0
        for conn, hello in hellos(listener, deadline, give_up, late):
            self.conns[hello[1]] = conn
            self.served[hello[1]] = 0
            if fork:
                self._procs[hello[1]] = Forked(hello[2], self._stack_dir)
            connected += 1
            if connected == len(ranks):
                break

    def replace(self, ranks: list[int]) -> bool:
        for r in ranks:
            if self._procs[r].poll() is None:
                self._procs[r].kill()
        if any(self._procs[r].poll() is not None for r in range(self.size) if r not in ranks):
            return False
        for r in ranks:
            wait_code(self._procs[r])
            self.conns[r].close()
        t0 = time.monotonic()
        self.zygote.await_ready(self.start_timeout)
        try:
            self._spawn(list(ranks), fork=self.zygote.ready())
        except (RuntimeError, OSError):
            return False
        self.spawn_seconds = time.monotonic() - t0
        if self.backend == "gloo":  # a zygote that died is started again (Note [Forked ranks])
            self.zygote.start()
        self.restarts += 1
        self.generation += 1
        return True

    def restart(self) -> None:
        self._kill()
        self.restarts += 1
        self.generation += 1
        self._start()

    def regroup(self) -> None:
        self.generation += 1

    def reset(self, ranks: list[int]) -> None:
        for r in ranks:
            if self._procs[r].poll() is None:
                try:
                    send(self.conns[r], ("reset",))
                except (BrokenPipeError, OSError):
                    pass

    def _kill(self) -> None:
        self.served = [0] * self.size
        self._procs = [p for p in self._procs if p is not None]
        for p in self._procs:
            if p.poll() is None:
                p.kill()
        for p in self._procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        for c in self.conns:
            if c is not None:
                c.close()
        self._procs, self.conns = [], []
        self._store = None

    def close(self) -> None:
        for conn in self.conns:
            try:
                send(conn, ("stop",))
            except (BrokenPipeError, OSError):
                pass
        for p in self._procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        self._kill()
        self.zygote.stop()  # last: it reaps (and reports) the ranks it forked
        self._cleanup()

    def kill(self, job: int) -> None:
        """End every rank and the zygote now, whatever job they run (``close`` waits for a job to
        end)."""
        self._kill()
        self.zygote.stop()
        self.close()  # whatever else close releases; the ranks are gone already

    def __del__(self):
        try:
            self._kill()
            self.zygote.stop()
        except Exception:
            pass
        cleanup = getattr(self, "_cleanup", None)
        if cleanup is not None:
            cleanup()

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    # -- what the driver sees of a rank, and how it frees one ------------------------------
    def alive(self, rank: int) -> bool:
        return self._procs[rank].poll() is None

    def status(self, rank: int) -> dict | None:
        return read_status(os.path.join(self._stack_dir, f"rank{rank}.status"))

    def output(self, rank: int) -> str:
        return read_output(os.path.join(self._stack_dir, f"rank{rank}.out"))

    def stacks(self, ranks: list[int]) -> dict[int, str]:
        """Dumped by faulthandler on SIGUSR1 (it works while the rank is blocked inside a
        collective)."""
        for rank in ranks:
            try:
                os.kill(self._procs[rank].pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass
        # faulthandler writes from the signal handler: wait until every stack is there.
        paths = {r: os.path.join(self._stack_dir, f"rank{r}.stack") for r in ranks}
        until = time.monotonic() + _STACK_SECONDS
        while time.monotonic() < until and not all(file_size(p) > 0 for p in paths.values()):
            time.sleep(_STACK_POLL)
        time.sleep(_STACK_POLL)
        return {r: read_text(p) for r, p in paths.items()}

    def death(self, rank: int, job: int) -> RankFailure:
        """Over its memory cap (Note [Rank memory cap]), or its exit code or signal."""
        output = self.output(rank)
        record = memory_record(self._stack_dir, rank, job)
        code = wait_code(self._procs[rank])
        if record is None:
            return RankFailure(rank, "died", describe_exit(code), output=output)
        return RankFailure(
            rank,
            "memory",
            f"{exceeded(record)} (resident memory {gb(record['rss'])}); stopped by paracheck",
            output=output,
            status=record,
        )

    def activity(self, rank: int) -> tuple[int, bool] | None:
        """Read from /proc for a gloo rank; None for an NCCL rank, which may wait for its GPU
        without using a CPU (Note [Timeout verdicts])."""
        if self.backend != "gloo":
            return None
        return process_activity(self._procs[rank].pid)

    def free(self, stuck: list[int], job: int) -> bool:
        """The other ranks drop their group. A local rank's job is not interrupted: one that
        stays stuck is replaced by a new process (forked in tens of milliseconds: Note [Forked
        ranks]), so False."""
        self.reset([r for r in range(self.size) if r not in stuck])
        return False

    def unstick_deadline(self, started: float) -> float | None:
        """The group's timeout, where it expires sooner than replacing the ranks would take."""
        until = started + self.group_timeout + 1.0
        remaining = until - time.monotonic()
        return until if 0 < remaining < self.spawn_seconds else None
