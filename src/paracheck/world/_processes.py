"""The World's processes on this machine: how they start, how the zygote forks them, how they
are waited for and how they leave nothing behind (Note [Cleaning up], Note [Forked ranks])."""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from multiprocessing.connection import Listener

from paracheck.world._rank import recv


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
def remove_dir(path: str, lock: int) -> None:
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
        yield conn, recv(conn)


def describe_exit(code: int | None) -> str:
    if code is None:
        return "did not exit"
    if code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name} ({-code})"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


def rank_env(authkey: bytes) -> dict:
    """The environment of a rank process or the zygote: the driver's, with its import path, one
    OpenMP thread unless set, the key of the driver's listener and the driver's pid."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([p for p in sys.path if p] + [env.get("PYTHONPATH", "")])
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PARACHECK_AUTHKEY"] = authkey.hex()
    env["PARACHECK_PARENT"] = str(os.getpid())  # Note [Cleaning up]
    return env


@contextlib.contextmanager
def sigint_blocked():
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


def wait_code(p) -> int | None:
    try:
        return p.wait(timeout=2)
    except subprocess.TimeoutExpired:
        return None


# Note [Forked ranks]
#   A rank that dies, or hangs where its peers cannot free it, is replaced by a new process,
#   and a new process spends seconds importing torch (5-8 s on a loaded 2-core machine: the
#   whole cost of such a case, and shrinking one runs several). So a gloo World starts a
#   zygote: a process that has imported torch once and forks a new rank on request (tens of
#   milliseconds). The pool itself is forked from it too: six ranks that each imported torch
#   took 7.6 s to start on two idle cores, forked 3.7 s, and every World a test suite or a
#   command starts pays that. Its children are not the driver's, so ``Forked`` stands in for
#   ``subprocess.Popen`` and the zygote writes their exit status to a file. The listener the
#   ranks connect to has a backlog for all of them: forked ranks connect at once.
class Zygote:
    """The process that forks a gloo World's ranks (Note [Forked ranks]); ready once it has
    imported torch. CPU only: a process forked after torch is imported must not be used with
    CUDA devices by a parent that might have touched them; NCCL worlds start new processes."""

    def __init__(self, stack_dir: str):
        self._dir = stack_dir
        self._ready = os.path.join(stack_dir, "zygote.ready")
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def start(self) -> None:
        """Start the zygote, unless one runs."""
        if self._proc is None or self._proc.poll() is not None:
            with sigint_blocked():
                self._proc = subprocess.Popen(
                    [sys.executable, "-m", "paracheck.world._entry", "zygote", self._dir],
                    env=rank_env(b""),
                    stdin=subprocess.PIPE,
                )

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def exited(self) -> bool:
        """Whether the zygote was started and has exited since."""
        return self._proc is not None and self._proc.poll() is not None

    def ready(self) -> bool:
        return self.running() and os.path.exists(self._ready)

    def await_ready(self, timeout: float) -> None:
        """Wait for a zygote that is still importing torch: forking from it once it is ready
        costs the rest of its import, a new process the whole of one (measured under load 20 on
        two cores: a stalled first case took 67 s to replace its rank that way, 4 s later on)."""
        deadline = time.monotonic() + timeout
        while self.running() and not self.ready() and time.monotonic() < deadline:
            time.sleep(0.05)

    def fork(self, args: list) -> None:
        """Fork a rank: ``args`` are ``paracheck.world._rank.rank_main``'s, then the authkey."""
        assert self._proc is not None and self._proc.stdin is not None  # started, stdin=PIPE
        self._proc.stdin.write((json.dumps(args) + "\n").encode())
        self._proc.stdin.flush()

    def stop(self) -> None:
        """Kill the zygote; its exit reaps (and reports) the ranks it forked."""
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.kill()
            wait_code(self._proc)
            self._proc = None
            try:
                os.remove(self._ready)
            except OSError:
                pass


class Forked:
    """The part of ``subprocess.Popen`` the World uses, for a rank forked by the zygote."""

    def __init__(self, pid: int, stack_dir: str):
        self.pid = pid
        self._exit = os.path.join(stack_dir, f"exit.{pid}")
        self.returncode = None

    def poll(self):
        if self.returncode is None and os.path.exists(self._exit):
            self.returncode = int(read_text(self._exit) or -1)
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
                    int(read_text(self._exit) or -signal.SIGKILL)
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


def file_size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def read_text(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""
