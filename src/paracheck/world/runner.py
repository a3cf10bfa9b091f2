"""A persistent pool of rank processes that runs one job (a picklable payload) at a time.

Starting W processes and a process group costs seconds; a property test wants hundreds of
examples. ``World`` starts its ranks once and keeps them. Each job names a module-level function
(``"package.module:function"``) that every rank of the job's world size calls with the payload;
the per-rank return values come back as a list.

Failures are results, not crashes of the driver:

* a rank that raises -> ``RankError`` with every failing rank's traceback; the pool stays usable;
* a job that does not finish within ``timeout`` -> ``RankHang`` naming every rank's Python stack,
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
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import weakref
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.connection import Listener, wait
from typing import TYPE_CHECKING

from paracheck.errors import ParacheckError
from paracheck.world._collectives import read_status
from paracheck.world._rank import _recv, _send, hold_lock, memory_record_path, read_output

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

_COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "broadcast",
    "reduce",
    "barrier",
    "all_to_all",
    "all_to_all_single",
    "gather",
    "scatter",
    "send",
    "recv",
    "wait",
    "monitored_barrier",
    "all_gather_object",
    "broadcast_object_list",
)


@dataclass
class RankFailure:
    rank: int
    kind: str  # "raised" | "hung" | "died" | "memory" (over its memory cap)
    detail: str  # traceback, stack, or exit description
    collective: str | None = None
    output: str = ""  # what the rank printed during the job, clipped (Note [Captured output])
    status: dict | None = None  # its collective counts (paracheck.world._collectives), where read


class WorldError(ParacheckError):
    """A job failed on one or more ranks; ``failures`` holds each rank's view."""

    kind = "failed"

    def __init__(self, message: str, failures: list[RankFailure]):
        super().__init__(message)
        self.failures = failures
        self.disagreement = ""  # RankHang: what the ranks disagree on, in one sentence

    def report(self) -> str:
        parts = [str(self)]
        for f in self.failures:
            where = f" in collective {f.collective}" if f.collective else ""
            parts.append(f"--- rank {f.rank} {f.kind}{where} ---\n{f.detail.rstrip()}")
            if f.output:
                parts.append(f"--- rank {f.rank} printed ---\n{f.output.rstrip()}")
        return "\n".join(parts)


class WorldStartError(ParacheckError, RuntimeError):
    """The World's rank processes did not start (or restart): no case was judged."""


class RankError(WorldError):
    kind = "raised"


class RankHang(WorldError):
    kind = "hung"

    def __init__(
        self,
        message: str,
        failures: list[RankFailure],
        *,
        disagreement: str = "",
        definite: bool = False,
        stalled: bool = False,
        seconds: float = 0.0,
    ):
        super().__init__(message, failures)
        self.disagreement = disagreement
        self.definite = definite  # a deadlock by the collective counts, not only a timeout
        # No rank still in the job ran or issued a collective for ``World.stall_seconds``
        # (Note [Timeout verdicts]).
        self.stalled = stalled
        self.rerun = False  # the verdict of a second run on fresh ranks (Note [Timeout verdicts])
        self.seconds = seconds  # from submission to the verdict

    @property
    def confirmed(self) -> bool:
        """Whether the ranks' own state proves the hang (a deadlock, or a stall), so that running
        the job again could not end otherwise (Note [Timeout verdicts])."""
        return self.definite or self.stalled


class RankDied(WorldError):
    kind = "died"


class RankOverMemory(RankDied):
    """A rank's resident memory exceeded the World's ``rank_memory`` cap during the job, on fresh
    rank processes (Note [Rank memory cap]); the rank was stopped and replaced. ``summary`` says
    which rank, the cap and the step, e.g. "rank 1 exceeded 0.5 GB at step 3"."""

    kind = "memory"

    def __init__(self, message: str, failures: list[RankFailure], *, summary: str):
        super().__init__(message, failures)
        self.summary = summary


# Note [Rank memory cap]
#   A target that keeps tensors alive (a list appended every step) grows without limit in a
#   persistent rank until the kernel's OOM killer kills some process: reported as "killed by
#   signal SIGKILL", or as flaky where the replayed case ran on a fresh process and survived. So
#   each rank watches its own resident memory while a job runs (a thread reads /proc/self/statm
#   every 50 ms; RLIMIT_AS does not work with torch, which reserves far more address space than
#   it touches) and stops itself with SIGKILL past the cap the job was sent with, after writing
#   the memory, the cap and the step its job is in (``set_step``, called by the check's training
#   loops) to ``rank<r>.memory``. The driver reports that as ``RankOverMemory``, "rank r
#   exceeded N GB at step s": a resource failure, not a wrong result. ``set_step`` also checks
#   the memory at each step's start, so that a step that ended over the cap is the one named:
#   the thread alone could see it only after the next step began.
#   What is watched is resident *anonymous* memory (RSS less the pages of files and shared
#   memory): a rank's tensors and objects. The pages of torch's libraries are not the target's,
#   and they differ between processes: a rank forked by the zygote maps 130 MB fewer of them
#   than a started one (measured: RSS 0.23 against 0.36 GB, anonymous 0.22 GB for both), so with
#   RSS the step at which a case passes the cap depended on how its rank was started.
#   Memory a process kept from earlier jobs (a module-level list, a cache, freed memory the
#   allocator kept) counts too, but is not the job's doing, and a job's verdict must not depend
#   on the jobs before it. So a job that exceeds the cap on a process that served earlier jobs
#   is run once more with every rank of it on a fresh process, and only a job over the cap from
#   fresh processes is reported: the same case replayed is over it again, at the same step.
#   The default cap (``default_rank_memory``) is an equal share of the machine's memory (the
#   physical memory, or the cgroup's limit where lower) among the ranks and the driver,
#   total / (size + 1), and at least 1 GiB (a rank holds about 0.22 GB of its own once torch is
#   imported): a rank past it, were its peers the same, would leave the machine without memory,
#   while a check's cases need a few MB each.


def _machine_memory() -> int:
    """Bytes of memory this process may use: physical memory, or its cgroup's limit if lower."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    limits = []
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        lines = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # cgroup v2
            limits.append(f"/sys/fs/cgroup{path.rstrip('/')}/memory.max")
        elif "memory" in controllers.split(","):
            limits.append(f"/sys/fs/cgroup/memory{path.rstrip('/')}/memory.limit_in_bytes")
            limits.append("/sys/fs/cgroup/memory/memory.limit_in_bytes")
    for path in limits:
        try:
            with open(path) as f:
                total = min(total, int(f.read().strip()))
        except (OSError, ValueError):  # absent, or "max"
            pass
    return total


def default_rank_memory(size: int) -> float:
    """The default memory cap of each of ``size`` ranks, in GB (2**30 bytes): an equal share of
    the machine's memory among the ranks and the driver, at least 1 (Note [Rank memory cap])."""
    return max(1.0, _machine_memory() / (size + 1) / 2**30)


def _gb(n: float) -> str:
    return f"{n / 2**30:.3g} GB"


def _exceeded(record: dict) -> str:
    """The words "exceeded 0.5 GB at step 3", from a rank's memory record (Note [Rank memory
    cap])."""
    step = record.get("step")
    return f"exceeded {_gb(record.get('cap', 0))}" + (
        f" at step {step}" if step is not None else ""
    )


class PeerFailed(ParacheckError, RuntimeError):
    """Raised by rank code that stops because another rank failed (the other rank reports its own
    error). The runner lists such ranks after the rank whose own code failed."""


_DEATHS = ("died", "memory")  # a rank process that ended during a job


def _collective_of(stack: str) -> str | None:
    """The innermost torch.distributed collective in a faulthandler stack dump (most recent first)."""
    for line in stack.splitlines():
        m = re.search(r'File "([^"]+)", line \d+ in (\w+)', line)
        if (
            m
            and "torch/distributed" in m.group(1).replace("\\", "/")
            and m.group(2) in _COLLECTIVES
        ):
            return m.group(2)
    return None


# Note [Cleaning up]
#   A World leaves nothing behind: not its temporary directory (stack dumps, status files, the
#   ranks' output), not its processes. ``close()``, and the World's finalizer (garbage
#   collection, interpreter exit), stop the ranks and the zygote and remove the directory. When
#   the driver process dies without either (SIGKILL), its ranks notice: a rank whose parent
#   process changes (a watchdog thread polls ``os.getppid()`` every 50 ms; the parent is the
#   driver, or the zygote for a forked rank) or whose connection to the driver ends exits, and
#   so does the zygote when its stdin (a pipe from the driver) ends. The last process of the
#   World to exit removes the directory: each process, the driver included, holds a shared
#   ``flock`` on ``alive.lock`` in it; an exiting rank releases its own and removes the
#   directory only if it then gets the lock exclusively, which it does when no other process of
#   the World is left. (prctl's PR_SET_PDEATHSIG would tie a rank to the driver thread that
#   started it, not to the driver process, and exists on Linux only.)
def _remove_dir(path: str, lock: int) -> None:
    shutil.rmtree(path, ignore_errors=True)
    try:
        os.close(lock)
    except OSError:
        pass


def hellos(listener: Listener, deadline: float, give_up, late: str):
    """Each connection made to ``listener`` with its first message, for as long as the caller
    iterates; ``give_up()`` runs before each wait and raises to stop waiting, and a process that
    connects but says nothing before ``deadline`` is the error ``late``."""
    # Wait for pending connections with select() and never put a timeout on the listening
    # socket: a timeout there can also cut the authentication handshake of an accepted
    # connection short under load, leaving that rank blocked forever (seen under pytest on a
    # loaded 2-core machine: the driver's socket in CLOSE-WAIT, the rank waiting).
    # Listener's private socket is not in typeshed's stubs.
    sock = listener._listener._socket  # type: ignore[attr-defined]
    while True:
        give_up()
        if not select.select([sock], [], [], 0.5)[0]:
            continue
        conn = listener.accept()
        if not conn.poll(max(0.0, deadline - time.monotonic())):
            raise RuntimeError(late)
        yield conn, _recv(conn)


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "did not exit"
    if code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name} ({-code})"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


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
    """

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
        # Forks replacement ranks (Note [Forked ranks]).
        self._zygote: subprocess.Popen[bytes] | None = None
        self._exits: dict[int, RankFailure] = {}  # how the ranks _replace_dead found dead ended
        self._pg_timeout = self.timeout + max(1.0, 0.2 * self.timeout)
        try:
            self._start()
        except BaseException:
            self._stop_zygote()
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
            self._start_zygote()
            self._await_zygote()
        try:
            self._spawn(list(range(self.size)), fork=self._zygote_ready())
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
        zygote = self._zygote
        assert not fork or zygote is not None  # fork is only asked for when _zygote_ready()
        authkey = os.urandom(16)
        # A backlog for every rank: forked ranks connect within milliseconds of each other, and
        # with multiprocessing's default of 1 a connection the full queue dropped left its rank
        # waiting for the handshake while the driver saw nothing to accept.
        listener = Listener(("127.0.0.1", 0), authkey=authkey, backlog=len(ranks) + 1)
        env = self._env(authkey)
        for rank in ranks:
            device = self.devices[rank] if self.devices else ""
            if fork:
                line = [
                    rank,
                    "127.0.0.1",
                    store.port,
                    f"{listener.address[0]}:{listener.address[1]}",
                    self._stack_dir,
                    self.backend,
                    device or None,
                    self._pg_timeout,
                    authkey.hex(),
                ]
                assert zygote is not None and zygote.stdin is not None  # started with stdin=PIPE
                zygote.stdin.write((json.dumps(line) + "\n").encode())
                zygote.stdin.flush()
                self._procs[rank] = None
                continue
            args = [
                sys.executable,
                "-m",
                "paracheck.world._entry",
                str(rank),
                "127.0.0.1",
                str(store.port),
                f"{listener.address[0]}:{listener.address[1]}",
                self._stack_dir,
                self.backend,
                device,
                repr(self._pg_timeout),
            ]
            with _sigint_blocked():
                self._procs[rank] = subprocess.Popen(args, env=env, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + self.start_timeout

        def give_up() -> None:
            dead = {
                r: _describe_exit(self._procs[r].poll())
                for r in ranks
                if self._procs[r] is not None and self._procs[r].poll() is not None
            }
            if fork and zygote is not None and zygote.poll() is not None:
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
        try:
            connected = 0
            for conn, hello in hellos(listener, deadline, give_up, late):
                self._conns[hello[1]] = conn
                self._served[hello[1]] = 0
                if fork:
                    self._procs[hello[1]] = _Forked(hello[2], self._stack_dir)
                connected += 1
                if connected == len(ranks):
                    break
        finally:
            listener.close()

    def _env(self, authkey: bytes) -> dict:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [p for p in sys.path if p] + [env.get("PYTHONPATH", "")]
        )
        env.setdefault("OMP_NUM_THREADS", "1")
        env["PARACHECK_AUTHKEY"] = authkey.hex()
        env["PARACHECK_PARENT"] = str(os.getpid())  # Note [Cleaning up]
        return env

    def _output(self, rank: int) -> str:
        """What rank ``rank`` printed since its last answer (Note [Captured output])."""
        return read_output(os.path.join(self._stack_dir, f"rank{rank}.out"))

    def _death(self, rank: int, job: int) -> RankFailure:
        """How rank ``rank``, found dead during job ``job``, ended: over its memory cap (Note
        [Rank memory cap]), or its exit code or signal; with what it printed."""
        output = self._output(rank)
        record = None
        try:
            with open(memory_record_path(self._stack_dir, rank)) as f:
                record = json.load(f)
        except (OSError, ValueError):
            pass
        code = _wait_code(self._procs[rank])
        if record is None or record.get("job") != job:
            return RankFailure(rank, "died", _describe_exit(code), output=output)
        return RankFailure(
            rank,
            "memory",
            f"{_exceeded(record)} (resident memory {_gb(record['rss'])}); stopped by paracheck",
            output=output,
            status=record,
        )

    # Note [Forked ranks]
    #   A rank that dies, or hangs where its peers cannot free it, is replaced by a new process,
    #   and a new process spends seconds importing torch (5-8 s on a loaded 2-core machine: the
    #   whole cost of such a case, and shrinking one runs several). So a gloo World starts a
    #   zygote: a process that has imported torch once and forks a new rank on request (tens of
    #   milliseconds). The pool itself is forked from it too: six ranks that each imported torch
    #   took 7.6 s to start on two idle cores, forked 3.7 s, and every World a test suite or a
    #   command starts pays that. Its children are not the driver's, so ``_Forked`` stands in for
    #   ``subprocess.Popen`` and the zygote writes their exit status to a file. The listener the
    #   ranks connect to has a backlog for all of them: forked ranks connect at once.
    def _start_zygote(self) -> None:
        # CPU only: a process forked after torch is imported must not be used with CUDA devices
        # by a parent that might have touched them; NCCL worlds start new processes.
        if self.backend == "gloo" and (self._zygote is None or self._zygote.poll() is not None):
            env = self._env(b"")
            with _sigint_blocked():
                self._zygote = subprocess.Popen(
                    [sys.executable, "-m", "paracheck.world._entry", "zygote", self._stack_dir],
                    env=env,
                    stdin=subprocess.PIPE,
                )

    def _zygote_ready(self) -> bool:
        return (
            self._zygote is not None
            and self._zygote.poll() is None
            and os.path.exists(os.path.join(self._stack_dir, "zygote.ready"))
        )

    def _await_zygote(self) -> None:
        """Wait for a zygote that is still importing torch: forking from it once it is ready
        costs the rest of its import, a new process the whole of one (measured under load 20 on
        two cores: a stalled first case took 67 s to replace its rank that way, 4 s later on)."""
        deadline = time.monotonic() + self.start_timeout
        while (
            self._zygote is not None
            and self._zygote.poll() is None
            and not self._zygote_ready()
            and time.monotonic() < deadline
        ):
            time.sleep(0.05)

    def _stop_zygote(self) -> None:
        if self._zygote is not None:
            if self._zygote.poll() is None:
                self._zygote.kill()
            _wait_code(self._zygote)
            self._zygote = None
            try:
                os.remove(os.path.join(self._stack_dir, "zygote.ready"))
            except OSError:
                pass

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
        self._await_zygote()
        try:
            self._spawn(list(ranks), fork=self._zygote_ready())
        except (RuntimeError, OSError):
            return False
        self.spawn_seconds = time.monotonic() - t0
        self._start_zygote()
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

    restarted_words = "the pool was restarted"  # what a restart() did, for a report

    # See Note [Timeout verdicts]: how long no rank still in a job may run before the job is a
    # stall (None: never judged so; the ranks' processes must be on this machine), how long a
    # rank that finished may take to answer past the World's timeout, and whether a timeout that
    # nothing proves is run again on fresh ranks.
    stall_seconds: float | None = 3.0
    answer_seconds = 60.0
    reruns_timeouts = True

    def _activity(self, rank: int) -> tuple[int, bool] | None:
        """Rank ``rank``'s process: the CPU time its threads used (ns), and whether one of them
        waits for a disk now (Note [Timeout verdicts]); None where unknown
        (not a local gloo rank, or /proc is missing)."""
        if self.backend != "gloo" or self.stall_seconds is None:
            return None
        return process_activity(self._procs[rank].pid)

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
        self._stop_zygote()  # last: it reaps (and reports) the ranks it forked
        self._cleanup()

    def kill(self) -> None:
        """End every rank and the zygote now, inside a job or not (``close`` waits for a job to
        end): for a driver that was interrupted."""
        self._kill()
        self._stop_zygote()
        self.close()  # whatever else close releases; the ranks are gone already

    def __enter__(self) -> World:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self._kill()
            self._stop_zygote()
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
        # The timeout runs from submission: time the driver spends elsewhere counts.
        self._submitted_at = time.monotonic()
        return (job, fn, w, self._submitted_at + timeout)

    def collect(self, ticket) -> list:
        """Wait for the job of ``ticket``; raise ``RankError``/``RankHang``/``RankDied``/
        ``RankOverMemory`` on failure. A job over the memory cap on processes that ran earlier jobs
        is run again on fresh ones first (Note [Rank memory cap]); so is a job past its timeout
        that nothing proves hung, with the World's whole timeout (Note [Timeout verdicts]).

        ``self.last_outputs`` then holds what each rank of the job printed (clipped)."""
        try:
            return self._collect(ticket)
        except RankHang as hang:
            if hang.confirmed or self._rerunning or not self.reruns_timeouts:
                raise
            first = hang
        fn, payload, w, _ = self._submitted
        if not self._respawn(list(range(w))):
            self.restart()
        self._rerunning = True
        try:
            return self._collect(self.submit(fn, payload, world_size=w, timeout=self.timeout))
        except RankHang as again:
            again.rerun = True
            again.args = (
                f"{again.args[0]} (run again on fresh ranks with a limit of {self.timeout:g} s "
                f"after it first did not finish within {first.seconds:.1f} s)",
            )
            raise
        finally:
            self._rerunning = False

    def _collect(self, ticket) -> list:
        job, fn, w, deadline = ticket
        if job != self._job:
            raise RuntimeError(
                f"ticket for job {job} is stale (job {self._job} was submitted since)"
            )
        started = self._submitted_at
        hard = started + self.timeout  # a late case that still makes progress waits up to this
        results: dict[int, object] = {}
        failures: list[RankFailure] = []
        self.last_outputs = {}
        pending = dict(enumerate(self._conns))
        watch = _Watch(self, job, w)

        def receive(ready) -> None:
            for conn in ready:
                rank = self._conns.index(conn)
                try:
                    msg = _recv(conn)
                except (EOFError, OSError):
                    failures.append(self._death(rank, job))
                    del pending[rank]
                    continue
                if msg[0] != job:
                    continue  # a late answer to an earlier, abandoned job
                del pending[rank]
                output = msg[3] if len(msg) > 3 else ""
                if output:
                    self.last_outputs[rank] = output
                if msg[1] == "ok":
                    results[rank] = msg[2]
                elif msg[1] == "error":
                    failures.append(
                        RankFailure(rank, "raised", msg[2], _collective_of_tb(msg[2]), output)
                    )

        while pending:
            now = time.monotonic()
            if now >= deadline:
                # See Note [Timeout verdicts]: answers already sent are read before anything is
                # judged late (the driver may have been busy past the deadline), a rank that
                # finished is waited for, and the ranks are judged on what was watched.
                ready = wait(list(pending.values()), timeout=0)
                if ready:
                    receive(ready)
                    continue
                running = sorted(r for r in pending if r < w)
                watch.poll(running)
                if watch.answering(running) and now < hard + self.answer_seconds:
                    deadline = now + 0.1
                    continue
                if watch.watched_for() < 1.0:
                    deadline = now + 1.0 - watch.watched_for()
                    continue
                # A case past its timeout whose ranks still run or issue collectives is slow, not
                # hung (a loaded machine): give it another timeout's worth, up to the World's.
                if watch.progressed(within=1.0) and now < hard:
                    deadline = min(hard, now + (deadline - started))
                    continue
                break
            # Poll the ranks' collective counts while some have answered and others not (where a
            # deadlock shows), and in the last second before the deadline.
            polling = (
                (results and any(r < w for r in pending))
                or deadline - now < 1.5
                or now >= started + 0.5
            )
            ready = wait(
                list(pending.values()),
                timeout=min(deadline - now, 0.1 if polling else started + 0.5 - now),
            )
            receive(ready)
            if any(f.kind in _DEATHS for f in failures):
                break
            if polling:
                running = sorted(r for r in pending if r < w)
                watch.poll(running)
                if not failures and (
                    watch.deadlocked(sorted(results), running) or watch.stalled(running)
                ):
                    break  # Note [Definite deadlock], Note [Timeout verdicts]
        if any(f.kind in _DEATHS for f in failures):
            dead = [f for f in failures if f.kind in _DEATHS]
            ranks = sorted(f.rank for f in dead)
            # Read before the dead ranks are replaced (a new process truncates its status).
            mismatch = describe_death({r: watch.status(r) for r in range(w)}, ranks)
            over = [f for f in dead if f.kind == "memory"]
            # Over the cap after earlier jobs: every rank of the job is replaced and the job run
            # again (Note [Rank memory cap]).
            rerun = bool(over) and not self._fresh
            stale = tuple(r for r in range(w) if r not in ranks) if rerun else ()
            # Replacing only the dead ranks costs one process start instead of the pool's.
            known = set(ranks)
            replaced = self._replace_dead(ranks, pending, also=stale)
            dead += [
                self._exits.pop(r, RankFailure(r, "died", "died")) for r in ranks if r not in known
            ]
            over = [f for f in dead if f.kind == "memory"]
            if replaced:
                action = f"rank(s) {sorted(set(ranks) | set(stale))} were restarted"
            else:
                self.restart()
                action = self.restarted_words
            if rerun:
                fn, payload, w, timeout = self._submitted
                return self.collect(self.submit(fn, payload, world_size=w, timeout=timeout))
            dead.sort(key=lambda f: (f.kind != "memory", f.rank))
            if over:
                summary = f"rank {over[0].rank} {_exceeded(over[0].status or {})}"
                raise RankOverMemory(
                    f"{summary} during {fn} (world size {w}); {action}", dead, summary=summary
                )
            died = RankDied(
                f"{len(dead)} rank(s) died during {fn} (world size {w}): "
                + ", ".join(f"rank {f.rank} {f.detail}" for f in dead)
                + (f" ({mismatch})" if mismatch else "")
                + f"; {action}",
                dead,
            )
            died.disagreement = mismatch
            raise died
        stuck = sorted(r for r in pending if r < w)
        if stuck:
            self._handle_hang(fn, w, stuck, results, failures, watch)
        if failures:
            self._generation += (
                1  # ranks that finished still hold the old group: re-create everywhere
            )
            raise RankError(
                f"{len(failures)} rank(s) raised during {fn} (world size {w})",
                _order_failures(failures),
            )
        missing = [r for r in range(w) if r not in results]
        if missing:
            # Every rank of the job answered, raised, died or hung above; this says so if not.
            raise RankError(
                f"rank(s) {missing} gave no result for {fn} (world size {w}) and no failure: "
                f"paracheck's runner lost their answer",
                [RankFailure(r, "raised", "no answer recorded for this job") for r in missing],
            )
        return [results[r] for r in range(w)]

    def _handle_hang(self, fn, w, stuck: list[int], results, failures, watch: _Watch) -> None:
        started = self._submitted_at
        definite = watch.deadlocked(sorted(results), stuck)
        stalled = not definite and watch.stalled(stuck)
        stacks = self._stacks(stuck)
        statuses = {r: watch.status(r) for r in range(w)}
        seconds = time.monotonic() - started
        hung = []
        for r in stuck:
            stack = stacks.get(r) or "(no stack)"
            output = self._output(r)
            hung.append(
                RankFailure(r, "hung", stack, _collective_of(stack), output, statuses.get(r))
            )
        done = [
            RankFailure(
                r,
                "finished",
                "returned normally",
                None,
                self.last_outputs.get(r, ""),
                statuses.get(r),
            )
            for r in sorted(results)
        ]
        disagreement = describe_disagreement(statuses, stuck, sorted(results))
        # Recovery, fastest first: ranks that finished drop their process group, which closes their
        # connections, so a peer stuck in a collective with them fails out of it at once (measured
        # on gloo: 1 s after the peer's destroy_process_group, against the group's timeout).
        for r in range(self.size):
            if r not in stuck and self._procs[r].poll() is None:
                try:
                    _send(self._conns[r], ("reset",))
                except (BrokenPipeError, OSError):
                    pass
        # Only a peer that finished or raised can free a stuck rank by dropping its group, or an
        # interruption of its job.
        freed = self._abandon(stuck) or bool(results or failures)
        recovered = freed and self._await_stuck(stuck, time.monotonic() + 2.0)
        recovered = (recovered or self._unstick(stuck, started)) and all(
            p.poll() is None for p in self._procs
        )
        if recovered:
            self._generation += 1
            action = "ranks recovered"
        elif self._respawn(stuck):
            action = f"rank(s) {stuck} were killed and restarted"
        else:
            self.restart()
            action = self.restarted_words
        if definite:
            head = (
                f"{fn} (world size {w}) deadlocked on rank(s) {stuck} after {seconds:.1f} s: {disagreement}; "
                f"{action}"
            )
        elif stalled:
            head = (
                f"{fn} (world size {w}) stalled on rank(s) {stuck} after {seconds:.1f} s: none of "
                f"them ran or issued a collective for {self.stall_seconds:g} s"
                + (f"; {disagreement}" if disagreement else "")
                + f"; {action}"
            )
        else:
            head = (
                f"{fn} (world size {w}) did not finish within {seconds:.1f} s on rank(s) {stuck}"
                + (f": {disagreement}" if disagreement else "")
                + f"; {action}"
            )
        raise RankHang(
            head,
            hung + failures + done,
            disagreement=disagreement,
            definite=definite,
            stalled=stalled,
            seconds=seconds,
        )

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


# Note [Definite deadlock]
#   Every rank of a correct program issues the same sequence of collectives on a group. So when a
#   rank of the job has returned after issuing n collectives on the default group, and every rank
#   still running is blocked inside a collective (or a Work.wait) after issuing more than n, those
#   collectives can never complete: the job is deadlocked, whatever the timeout. The driver checks
#   this every 0.1 s while some ranks have answered, and needs it on two polls in a row (a wait
#   on an earlier, matched collective completes in between). It reports such a hang at once;
#   other late jobs (every rank still running, or a rank busy outside any collective) are reported
#   at their timeout. The counts are also what the hang report says the ranks disagree on.
#
#   The same holds, with no rank finished, when every rank of the job is inside the same
#   collective on the default group (its n-th, of one kind) and that collective is one whose
#   tensor must be the same on every rank (``SIZED``: all_reduce, broadcast, reduce) but the
#   ranks passed tensors of different sizes or dtypes: it cannot complete correctly on any
#   backend (gloo aborts a rank or waits; NCCL waits for the missing elements). Polled the same
#   way once a job has run for half a second.
# Note [Timeout verdicts]
#   A job is hung when its ranks can no longer finish it, not when a clock says so. Three things
#   made a correct case read as a hang on a loaded machine, and each is ruled out before a
#   timeout is judged:
#   * The driver computes the oracle between ``submit`` and ``collect`` and may itself be
#     descheduled, so it can reach ``collect`` after the deadline with every answer already in
#     the pipes (measured: a 1x1 MLP's first case, both ranks idle in their job loop, reported as
#     a hang when 20 checks shared 32 cores). Answers already sent are read first, and a job is
#     judged only on at least one second of the driver watching it.
#   * A rank whose status says it finished (``returned``, ``raised``) is still pickling and
#     sending its answer: it is waited for (up to ``answer_seconds`` past the World's timeout,
#     while its process lives).
#   * A rank busy outside any collective (a long backward at four ranks per core) changes no
#     collective count, so counts alone called it stuck: a rank that used a CPU (2% of one over
#     the last half second or more), or has a thread waiting for a disk when polled, is making
#     progress too, and a job that progresses waits up to the World's timeout.
#   Conversely, when no rank still in the job ran, issued a collective or changed state for
#   ``stall_seconds`` (3 s), nothing can end the job: every such rank sleeps or waits for a peer
#   that does. That is a stall, reported at once like a deadlock (Note [Definite deadlock])
#   whatever the timeout. An idle rank uses about 0.5% of a CPU (its watchdog thread; measured),
#   a rank that wants a CPU on two cores shared by 17 runnable processes gets about 12%. Only
#   local gloo ranks are judged so: an NCCL rank may wait for its GPU without using a CPU, and an
#   attached rank's process is on another machine.
#   A timeout that neither a deadlock nor a stall proves (a rank still spinning at the World's
#   timeout) is run once more on fresh rank processes with the World's whole timeout before it
#   is reported; a pass then is the case's verdict.
_RUNNING = 0.02  # the share of one CPU above which a rank counts as running


def process_activity(pid: int) -> tuple[int, bool] | None:
    """The CPU time (ns) the threads of process ``pid`` used, and whether one of them is in an
    uninterruptible wait (a disk) now; None where /proc cannot say. (Whether one is running is no
    sign: an idle rank's watchdog thread is seen running about once a second.)"""
    base = f"/proc/{pid}/task"
    try:
        tids = os.listdir(base)
    except OSError:
        return None
    ns, busy = 0, False
    for tid in tids:
        try:
            with open(f"{base}/{tid}/schedstat", "rb") as f:
                ns += int(f.read().split()[0])
            with open(f"{base}/{tid}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended meanwhile
        busy = busy or state == b"D"
    return ns, busy


class _Watch:
    """The ranks' collective counts and activity while one job is late (see Note [Definite
    deadlock], Note [Timeout verdicts])."""

    def __init__(self, world: World, job: int, w: int):
        self._world = world
        self.job = job
        self.w = w
        self._last: dict[int, tuple | None] = {}
        self._changed: dict[int, float] = {}
        self._suspect = 0
        self._first: float | None = None  # when the driver first polled the ranks
        # See Note [Timeout verdicts]: (time, rank -> CPU ns) of the last polls, and when a rank
        # still in the job was last seen running.
        self._cpu: list[tuple[float, dict[int, int]]] = []
        self._ran: float | None = None
        self._blind = False  # a rank's activity could not be read: never a stall

    def status(self, rank: int) -> dict | None:
        st = self._world._status(rank)
        return st if st is not None and st.get("job") == self.job else None

    def poll(self, ranks: list[int]) -> None:
        now = time.monotonic()
        if self._first is None:
            self._first = now
        cpu: dict[int, int] = {}
        for r in ranks:
            st = self.status(r)
            key = None if st is None else (st["total"], st["inside"], st["state"])
            if self._last.get(r) != key:
                self._last[r] = key
                self._changed[r] = now
            act = self._world._activity(r)
            if act is None:
                self._blind = True
                continue
            cpu[r] = act[0]
            if act[1]:
                self._ran = now
        # CPU time over the last half second or more: one poll's 0.1 s is too short to tell a
        # rank that waits for a CPU on a loaded machine from one that waits for nothing.
        older = [(t, c) for t, c in self._cpu if now - t >= 0.5]
        if older:
            t, before = older[-1]
            if any(c - before.get(r, c) >= _RUNNING * (now - t) * 1e9 for r, c in cpu.items()):
                self._ran = now
        self._cpu = [(t, c) for t, c in self._cpu if now - t < 1.0] + [(now, cpu)]

    def watched_for(self) -> float:
        return 0.0 if self._first is None else time.monotonic() - self._first

    def progressed(self, within: float) -> bool:
        """Whether a rank still in the job issued a collective, changed state or ran (used a CPU)
        within the last ``within`` seconds."""
        now = time.monotonic()
        ran = self._ran is not None and now - self._ran < within
        return ran or any(now - t < within for t in self._changed.values())

    def answering(self, running: list[int]) -> list[int]:
        """The ranks of ``running`` whose status says they finished the job: their answer is on
        its way (Note [Timeout verdicts])."""
        out = []
        for r in running:
            st = self.status(r)
            if st is not None and st["state"] != "running" and self._world._alive(r):
                out.append(r)
        return out

    def stalled(self, running: list[int]) -> bool:
        """Whether no rank of ``running`` (the ranks still in the job, one at least) ran, issued a
        collective or changed state for the World's ``stall_seconds`` (Note [Timeout verdicts])."""
        window = self._world.stall_seconds
        if window is None or self._blind or not running or self._first is None:
            return False
        if self.answering(running):
            return False
        now = time.monotonic()
        last = max([self._first, self._ran or 0.0] + [self._changed.get(r, 0.0) for r in running])
        return now - last >= window

    def deadlocked(self, finished: list[int], running: list[int]) -> bool:
        ok = self._past_the_finished(finished, running) or (
            bool(running)
            and sizes_differ([self.status(r) for r in finished + running], inside=False)
            and all(_inside_sized(self.status(r)) for r in running)
        )
        self._suspect = self._suspect + 1 if ok else 0
        return self._suspect >= 2

    def _past_the_finished(self, finished: list[int], running: list[int]) -> bool:
        if not finished or not running:
            return False
        done = [self.status(r) for r in finished]
        lows = [st["world_total"] for st in done if st is not None]
        ok = bool(lows)
        for r in running:
            st = self.status(r)
            ok = (
                ok and st is not None and st["inside"] is not None and st["world_total"] > min(lows)
            )
        return ok


def _inside_sized(st: dict | None) -> bool:
    """Whether ``st`` is inside its last ``SIZED`` collective on the default group."""
    if st is None or st.get("sized") is None:
        return False
    x = st["sized"]
    return bool(st["inside"] == x[0] and st["world_total"] == x[2])


def sizes_differ(statuses: list[dict | None], *, inside: bool = True) -> bool:
    """Every status's last ``SIZED`` collective on the default group is the same one (the same
    kind at the same count) and the tensors passed to it differ in size or dtype (Note [Definite
    deadlock]). With ``inside``, every rank must still be inside it."""
    known = [st for st in statuses if st is not None and st.get("sized") is not None]
    if len(statuses) < 2 or len(known) < len(statuses):
        return False
    sized = [st["sized"] for st in known]
    if inside and not all(_inside_sized(st) for st in statuses):
        return False
    if len({tuple(x[:3]) for x in sized}) > 1:
        return False
    return len({tuple(x[3:5]) for x in sized}) > 1


def _size_words(st: dict) -> str:
    """ " of N dtype elements" where ``st`` is inside its last SIZED collective."""
    if not _inside_sized(st):
        return ""
    x = st["sized"]
    root = f" from rank {x[5]}" if len(x) > 5 and x[0] == "broadcast" else ""
    root = f" to rank {x[5]}" if len(x) > 5 and x[0] == "reduce" else root
    return f" of {x[3]} {x[4]} element{'' if x[3] == 1 else 's'}{root}"


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _ranks(rs: list[int]) -> str:
    return ("rank " if len(rs) == 1 else "ranks ") + ", ".join(str(r) for r in rs)


def describe_disagreement(
    statuses: dict[int, dict | None], stuck: list[int], finished: list[int]
) -> str:
    """One sentence: which collective the stuck ranks are in and how many each rank issued, e.g.
    "rank 1 is in its 7th all_reduce; ranks 0, 2 finished after 6 all_reduce"; or, where they
    passed one collective tensors of different sizes, ``describe_sizes``."""
    if sizes_differ([statuses.get(r) for r in stuck + finished], inside=False):
        return describe_sizes({r: statuses[r] for r in stuck + finished}, [])
    known = [statuses.get(r) for r in stuck]
    if not finished and known and all(st is not None and st["inside"] is None for st in known):
        return (
            OUTSIDE
            + ": "
            + ", ".join(f"rank {r} after {statuses[r]['total']}" for r in stuck)  # type: ignore[index]
            + " collective(s); each is busy or blocked in its own code (its stack says where)"
        )
    parts = []
    op = None
    for r in stuck:
        st = statuses.get(r)
        if st is None:
            parts.append(f"rank {r} has not started the job's code")
            continue
        if st["inside"] is None:
            parts.append(f"rank {r} is outside any collective after {st['total']} collective(s)")
            continue
        op = op or st["inside"]
        parts.append(
            f"rank {r} is in its {_ordinal(st['inside_index'])} {st['inside']}"
            + _size_words(st)
            + (f" ({st['total']} collectives in all)" if st["total"] != st["inside_index"] else "")
        )
    groups: dict[tuple, list[int]] = {}
    for r in finished:
        st = statuses.get(r)
        if st is None:
            continue
        key = (st["counts"].get(op, 0) if op and op != "wait" else None, st["total"])
        groups.setdefault(key, []).append(r)
    for (n_op, total), rs in sorted(groups.items(), key=lambda kv: kv[1]):
        what = (
            f"{n_op} {op}" + (f" ({total} collectives in all)" if total != n_op else "")
            if n_op is not None
            else f"{total} collective(s)"
        )
        parts.append(f"{_ranks(rs)} finished after {what}")
    return "; ".join(parts)


# How ``describe_disagreement`` begins when no stuck rank is inside a collective: then the ranks
# do not disagree on their collectives, and the report says where they are instead.
OUTSIDE = "no rank is inside a collective"


_STATE_WORDS = {"running": "still in it", "raised": "raised", "returned": "returned"}


def describe_death(statuses: dict[int, dict | None], dead: list[int]) -> str:
    """``describe_sizes`` where the ranks' last sized collective explains a death, else empty."""
    ranks = sorted(statuses)
    if not sizes_differ([statuses[r] for r in ranks], inside=False):
        return ""
    return describe_sizes(statuses, dead)


def describe_sizes(statuses: dict[int, dict | None], dead: list[int]) -> str:
    """What each rank passed to its last ``SIZED`` collective, which ``sizes_differ`` found to be
    the same one with tensors of different sizes (gloo aborts a process on it,
    ``gloo::EnforceNotMet``, and raises on another, or one rank returns and another waits)."""
    known = {r: st for r, st in sorted(statuses.items()) if st is not None}
    kind, count = next(iter(known.values()))["sized"][:2]
    parts = []
    for r, st in known.items():
        n, dtype = st["sized"][3:5]
        how = "died" if r in dead else _STATE_WORDS.get(st.get("state", ""), "")
        parts.append(f"rank {r} ({how}) {n} {dtype} element{'' if n == 1 else 's'}")
    return f"their {_ordinal(count)} {kind} got tensors of different sizes: " + ", ".join(parts)


class _Forked:
    """The part of ``subprocess.Popen`` the World uses, for a rank forked by the zygote."""

    def __init__(self, pid: int, stack_dir: str):
        self.pid = pid
        self._exit = os.path.join(stack_dir, f"exit.{pid}")
        self.returncode = None

    def poll(self):
        if self.returncode is None and os.path.exists(self._exit):
            self.returncode = int(_read(self._exit) or -1)
        elif self.returncode is None:
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                # Reaped: the zygote writes the status right after; gone without one only if the
                # zygote died first.
                until = time.monotonic() + 2.0
                while not os.path.exists(self._exit) and time.monotonic() < until:
                    time.sleep(0.01)
                self.returncode = (
                    int(_read(self._exit) or -signal.SIGKILL)
                    if os.path.exists(self._exit)
                    else -signal.SIGKILL
                )
        return self.returncode

    def kill(self):
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def wait(self, timeout=None):
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired("rank", timeout)
            time.sleep(0.01)
        return self.returncode


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _collective_of_tb(text: str) -> str | None:
    frames = re.findall(r'File "([^"]+)", line \d+, in (\w+)', text)
    for path, name in reversed(frames):
        if "torch/distributed" in path.replace("\\", "/") and name in _COLLECTIVES:
            return name
    return None


def _order_failures(failures: list[RankFailure]) -> list[RankFailure]:
    # The rank whose own code raised comes first; peers that merely lost their connection after.
    def secondary(f: RankFailure) -> bool:
        if f"{PeerFailed.__name__}:" in f.detail:  # the exception's line of the traceback
            return True
        t = f.detail.lower()
        return any(
            s in t
            for s in ("connection closed", "connection reset", "timed out", "timeout", "gloo")
        )

    return sorted(failures, key=lambda f: (secondary(f), f.rank))


@contextlib.contextmanager
def _sigint_blocked():
    """SIGINT blocked in this thread while a rank or the zygote is started: the child inherits the
    mask, so a Ctrl-C during its interpreter's start stays pending until ``_entry`` ignores it
    (which discards it) instead of printing a KeyboardInterrupt from the middle of an import.
    Here a Ctrl-C is delivered when the mask is restored, not lost."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _wait_code(p) -> int | None:
    try:
        return p.wait(timeout=2)
    except subprocess.TimeoutExpired:
        return None
