"""A persistent pool of rank processes that runs one job (a picklable payload) at a time.

Starting W processes and a process group costs seconds; a property test wants hundreds of
examples. ``World`` starts its ranks once and keeps them. Each job names a module-level function
(``"package.module:function"``) that every rank of the job's world size calls with the payload;
the per-rank return values come back as a list.

Failures are results, not crashes of the driver:

* a rank that raises -> ``RankError`` with every failing rank's traceback; the pool stays usable;
* a job that does not finish within ``timeout`` -> ``RankHang`` naming every rank's Python stack
  and the collective it is blocked in; ranks that do not recover are killed and restarted;
* a rank that dies (signal, ``os._exit``) -> ``RankDied`` with the signal or exit code, then the
  pool is restarted.

No fixed ports: the driver owns a ``TCPStore`` bound to port 0 (the kernel picks a free port),
so pools in several pytest-xdist workers never collide.
"""

from __future__ import annotations

import subprocess
import os
import re
import select
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.connection import Listener, wait

from paracheck.world._rank import _recv, _send

__all__ = ["World", "WorldError", "RankError", "RankHang", "RankDied", "RankFailure"]

_COLLECTIVES = (
    "all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor",
    "broadcast", "reduce", "barrier", "all_to_all", "all_to_all_single", "gather", "scatter",
    "send", "recv", "wait", "monitored_barrier", "all_gather_object", "broadcast_object_list",
)


@dataclass
class RankFailure:
    rank: int
    kind: str  # "raised" | "hung" | "died"
    detail: str  # traceback, stack, or exit description
    collective: str | None = None


class WorldError(Exception):
    """A job failed on one or more ranks; ``failures`` holds each rank's view."""

    kind = "failed"

    def __init__(self, message: str, failures: list[RankFailure]):
        super().__init__(message)
        self.failures = failures

    def report(self) -> str:
        parts = [str(self)]
        for f in self.failures:
            where = f" in collective {f.collective}" if f.collective else ""
            parts.append(f"--- rank {f.rank} {f.kind}{where} ---\n{f.detail.rstrip()}")
        return "\n".join(parts)


class RankError(WorldError):
    kind = "raised"


class RankHang(WorldError):
    kind = "hung"


class RankDied(WorldError):
    kind = "died"


def _collective_of(stack: str) -> str | None:
    """The innermost torch.distributed collective in a faulthandler stack dump (most recent first)."""
    for line in stack.splitlines():
        m = re.search(r'File "([^"]+)", line \d+ in (\w+)', line)
        if m and "torch/distributed" in m.group(1).replace("\\", "/") and m.group(2) in _COLLECTIVES:
            return m.group(2)
    return None


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
    """

    def __init__(self, size: int, *, backend: str = "gloo", timeout: float = 30.0,
                 devices: list[str] | None = None, start_timeout: float = 120.0):
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
                    raise ValueError(f"size={size} exceeds the {available} CUDA device(s) present (backend='nccl')")
                devices = [f"cuda:{i}" for i in range(size)]
            if len(devices) < size:
                raise ValueError(f"devices={devices} has fewer than size={size} entries")
        self.size = size
        self.backend = backend
        self.timeout = float(timeout)
        self.devices = devices
        self.start_timeout = start_timeout
        self._generation = 0
        self._last_world_size = None
        self._job = 0
        self._procs: list = []
        self._conns: list = []
        self._store = None
        self._stack_dir = tempfile.mkdtemp(prefix="paracheck-world-")
        self.restarts = 0
        self._start()

    # -- lifecycle ------------------------------------------------------------------------
    def _start(self) -> None:
        import torch.distributed as dist

        # Ranks are plain subprocesses (``python -m paracheck.world._rank``), not multiprocessing
        # children: nothing of the driver's __main__ is re-imported, so a World works from a
        # script, a REPL, stdin, pytest and pytest-xdist alike.
        self._store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                                    timeout=timedelta(seconds=60))
        authkey = os.urandom(16)
        listener = Listener(("127.0.0.1", 0), authkey=authkey)
        pg_timeout = self.timeout + max(1.0, 0.2 * self.timeout)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([p for p in sys.path if p] + [env.get("PYTHONPATH", "")])
        env.setdefault("OMP_NUM_THREADS", "1")
        env["PARACHECK_AUTHKEY"] = authkey.hex()
        self._procs, self._conns = [], [None] * self.size
        for rank in range(self.size):
            device = self.devices[rank] if self.devices else ""
            args = [sys.executable, "-m", "paracheck.world._entry", str(rank), "127.0.0.1",
                    str(self._store.port), f"{listener.address[0]}:{listener.address[1]}",
                    self._stack_dir, self.backend, device, repr(pg_timeout)]
            self._procs.append(subprocess.Popen(args, env=env, stdin=subprocess.DEVNULL))
        # Wait for pending connections with select() and never put a timeout on the listening
        # socket: a timeout there can also cut the authentication handshake of an accepted
        # connection short under load, leaving that rank blocked forever (seen under pytest on a
        # loaded 2-core machine: the driver's socket in CLOSE-WAIT, the rank waiting).
        sock = listener._listener._socket
        deadline = time.monotonic() + self.start_timeout
        try:
            connected = 0
            while connected < self.size:
                dead = {r: _describe_exit(p.poll()) for r, p in enumerate(self._procs) if p.poll() is not None}
                if dead or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"ranks failed to start: {dead}" if dead else f"ranks did not start within {self.start_timeout} s"
                    )
                if not select.select([sock], [], [], 0.5)[0]:
                    continue
                conn = listener.accept()
                if not conn.poll(max(0.0, deadline - time.monotonic())):
                    raise RuntimeError(f"a rank connected but did not report within {self.start_timeout} s")
                hello = _recv(conn)
                self._conns[hello[1]] = conn
                connected += 1
        except BaseException:
            self._kill()
            raise
        finally:
            listener.close()

    def _kill(self) -> None:
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

    def __enter__(self) -> "World":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self._kill()
        except Exception:
            pass

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    # -- jobs -----------------------------------------------------------------------------
    def run(self, fn: str, payload, *, world_size: int | None = None, timeout: float | None = None) -> list:
        """Call ``fn(payload)`` on ranks 0..world_size-1; return their results in rank order."""
        return self.collect(self.submit(fn, payload, world_size=world_size, timeout=timeout))

    def submit(self, fn: str, payload, *, world_size: int | None = None, timeout: float | None = None):
        """Start a job and return a ticket for ``collect``; the driver is free meanwhile (the
        check computes the oracle while the ranks train). One job at a time."""
        w = self.size if world_size is None else world_size
        if not isinstance(w, int) or not 1 <= w <= self.size:
            raise ValueError(f"world_size={w!r} must be an int in 1..{self.size} (this World's size)")
        timeout = self.timeout if timeout is None else timeout
        if not 0 < timeout <= self.timeout:
            # The ranks' process-group timeout was fixed from World.timeout at start; a longer job
            # timeout would let collectives time out first and read as "raised", not "hung".
            raise ValueError(f"timeout={timeout!r} must be in (0, {self.timeout:g}] (this World's timeout)")
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
        for conn in self._conns:
            _send(conn, ("run", job, w, self._generation, fn, payload))
        # The timeout runs from submission: time the driver spends elsewhere counts.
        return (job, fn, w, time.monotonic() + timeout)

    def collect(self, ticket) -> list:
        """Wait for the job of ``ticket``; raise ``RankError``/``RankHang``/``RankDied`` on failure."""
        job, fn, w, deadline = ticket
        if job != self._job:
            raise RuntimeError(f"ticket for job {job} is stale (job {self._job} was submitted since)")
        results: dict[int, object] = {}
        failures: list[RankFailure] = []
        pending = dict(enumerate(self._conns))
        while pending:
            ready = wait(list(pending.values()), timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            for conn in ready:
                rank = self._conns.index(conn)
                try:
                    msg = _recv(conn)
                except (EOFError, OSError):
                    failures.append(RankFailure(rank, "died", _describe_exit(_wait_code(self._procs[rank]))))
                    del pending[rank]
                    continue
                if msg[0] != job:
                    continue  # a late answer to an earlier, abandoned job
                del pending[rank]
                if msg[1] == "ok":
                    results[rank] = msg[2]
                elif msg[1] == "error":
                    failures.append(RankFailure(rank, "raised", msg[2], _collective_of_tb(msg[2])))
            if any(f.kind == "died" for f in failures):
                break
        if any(f.kind == "died" for f in failures):
            dead = [f for f in failures if f.kind == "died"]
            self.restart()
            raise RankDied(f"{len(dead)} rank(s) died during {fn} (world size {w}); the pool was restarted",
                           sorted(dead, key=lambda f: f.rank))
        if pending:
            self._handle_hang(fn, w, sorted(pending), results, failures)
        if failures:
            self._generation += 1  # ranks that finished still hold the old group: re-create everywhere
            raise RankError(f"{len(failures)} rank(s) raised during {fn} (world size {w})",
                            _order_failures(failures))
        return [results[r] for r in range(w)]

    def _handle_hang(self, fn, w, stuck: list[int], results, failures) -> None:
        stacks = {}
        for rank in stuck:
            try:
                os.kill(self._procs[rank].pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass
        time.sleep(0.3)  # faulthandler writes from the signal handler; give it a moment
        for rank in stuck:
            path = os.path.join(self._stack_dir, f"rank{rank}.stack")
            try:
                with open(path) as f:
                    stacks[rank] = f.read()
            except OSError:
                stacks[rank] = "(no stack)"
        hung = [RankFailure(r, "hung", stacks[r], _collective_of(stacks[r])) for r in stuck]
        done = [RankFailure(r, "finished", "returned normally") for r in sorted(results)]
        # Give the ranks the process-group timeout to fail out of their collectives by themselves;
        # a rank still busy after that (a Python-level loop, a deadlock) is killed with the pool.
        grace = self.timeout * 0.2 + 3.0
        deadline = time.monotonic() + grace
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
        recovered = not pending and all(p.poll() is None for p in self._procs)
        if recovered:
            self._generation += 1
        else:
            self.restart()
        action = "ranks recovered" if recovered else "the pool was killed and restarted"
        raise RankHang(
            f"{fn} (world size {w}) did not finish within {self.timeout:g} s on rank(s) {stuck}; {action}",
            hung + failures + done,
        )


def _collective_of_tb(text: str) -> str | None:
    frames = re.findall(r'File "([^"]+)", line \d+, in (\w+)', text)
    for path, name in reversed(frames):
        if "torch/distributed" in path.replace("\\", "/") and name in _COLLECTIVES:
            return name
    return None


def _order_failures(failures: list[RankFailure]) -> list[RankFailure]:
    # The rank whose own code raised comes first; peers that merely lost their connection after.
    def secondary(f: RankFailure) -> bool:
        t = f.detail.lower()
        return any(s in t for s in ("connection closed", "connection reset", "timed out", "timeout", "gloo",
                                    "raised on another rank"))

    return sorted(failures, key=lambda f: (secondary(f), f.rank))


def _wait_code(p) -> int | None:
    try:
        return p.wait(timeout=2)
    except subprocess.TimeoutExpired:
        return None
