"""The body of one rank process of a ``World``. Private: the driver is ``paracheck.world.World``.

Protocol (driver -> rank over a Pipe):
``("run", job_id, world_size, generation, fn_path, payload, memory_cap_bytes)``,
``("reset",)`` or ``("stop",)``. The rank (re)creates its default process group when the requested
world size or generation changes (Note [One default group per world size]), calls ``fn(payload)``
if its rank is below the world size, and answers ``(job_id, "ok", result, output)`` or
``(job_id, "error", text, output, called_on)``, where ``output`` is what the job printed (Note
[Captured output]) and ``called_on`` whose objects a library raised on (Note [Raised on the
target's objects] in ``paracheck.world._blame``). ``("reset",)`` drops the process group without an answer: a rank that finished a job
whose peers are stuck in a collective closes its connections, so their collective fails at once
(Note [Definite deadlock] in ``paracheck.world._watch``).

While a job runs, the rank's collectives are counted into ``<stack_dir>/rank<r>.status``
(``paracheck.world._collectives``). Its stdout/stderr go to ``<stack_dir>/rank<r>.out`` for the
whole life of the process (Note [Captured output]). A watchdog thread stops the rank when its
driver is gone (Note [Cleaning up] in ``paracheck.world._processes``) and when its job's
resident memory exceeds the cap the job was sent with (Note [Rank memory cap] in
``paracheck.world._memory``).
"""

from __future__ import annotations

import faulthandler
import gc
import importlib
import json
import os
import pickle
import shutil
import signal
import sys
import threading
import time
import traceback
import warnings
from datetime import timedelta
from typing import Any

# Note [One default group per world size]
#   CS336-style targets call collectives on the default group and read dist.get_world_size(), so a
#   case of world size w must run with a *default* group of exactly w ranks. The ranks therefore
#   keep their processes and the store, and re-create the default group (ranks 0..w-1 only) when a
#   case asks for another size, under a fresh store prefix so no key of an earlier group is reused.
#   Measured: 10-20 ms per re-creation with gloo, versus 3-14 s to spawn a new world.

# Note [Captured output]
#   A target's prints belong to the case that made them, and one target printed hundreds of lines
#   per case. torch and gloo print too (warnings, connection messages), and not only inside a
#   case: at import, while a process group is created or destroyed, when garbage is collected, at
#   exit. So a rank points its file descriptors 1 and 2 at its ``rank<r>.out`` file for the whole
#   life of the process, before torch is imported (dup2, so prints from C extensions are caught
#   too): nothing a rank prints reaches the driver's terminal. Just before a job calls the target,
#   whatever the file holds (printed outside any case since the rank's last answer) is marked as
#   such; the answer carries the head and tail of the file, which is then emptied. The driver shows
#   it only with a failure, and reads the file itself for a rank that hangs or dies. Python's
#   warnings are reset for each job (``warnings.catch_warnings``), so a case shows the warnings it
#   triggers even where an earlier case triggered them first (torch's C++ warnings that print once
#   per process show with the first case of a process only). faulthandler's stack dumps go to
#   their own file (the ``.stack`` file) and are unaffected.
_HEAD_LINES, _TAIL_LINES, _LINE_CHARS = 15, 15, 300


def _clip(text: str) -> str:
    lines = [
        ln if len(ln) <= _LINE_CHARS else ln[:_LINE_CHARS] + " ..." for ln in text.splitlines()
    ]
    if len(lines) > _HEAD_LINES + _TAIL_LINES:
        dropped = len(lines) - _HEAD_LINES - _TAIL_LINES
        lines = lines[:_HEAD_LINES] + [f"... ({dropped} more lines) ..."] + lines[-_TAIL_LINES:]
    return "\n".join(lines)


def read_output(path: str, limit: int = 1 << 20) -> str:
    """What a job printed so far, clipped to its head and tail (see Note [Captured output])."""
    try:
        with open(path, "rb") as f:
            data = f.read(limit)
    except OSError:
        return ""
    return _clip(data.decode("utf-8", "replace"))


_OUTSIDE = b"[printed outside any case, before this one]\n"
_INSIDE = b"[printed by this case]\n"


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a target may have closed or replaced the streams
            pass


class _Output:
    """This process's file descriptors 1 and 2, pointed at ``path`` for the rest of its life
    (Note [Captured output])."""

    def __init__(self, path: str):
        self.path = path
        _flush()
        # O_APPEND: writes land at the end of the file even after take() empties it.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)

    def begin(self) -> None:
        """A job is about to call the target: mark what was printed since the last answer."""
        _flush()
        try:
            with open(self.path, "rb") as f:
                before = f.read(1 << 20)
        except OSError:
            return
        if before:
            os.truncate(self.path, 0)
            os.write(1, _OUTSIDE + before.rstrip(b"\n") + b"\n" + _INSIDE)

    def take(self) -> str:
        """What was printed since the last answer, clipped; the file is emptied."""
        _flush()
        text = read_output(self.path)
        try:
            os.truncate(self.path, 0)
        except OSError:
            pass
        return text


def resident_bytes() -> int:
    """This process's resident anonymous memory in bytes (its own tensors and objects: RSS less
    the pages of files and shared memory; Note [Rank memory cap]); the peak RSS where /proc is
    missing."""
    try:
        with open("/proc/self/statm", "rb") as f:
            fields = f.read().split()
        return (int(fields[1]) - int(fields[2])) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024


def memory_record_path(stack_dir: str, rank: int) -> str:
    return os.path.join(stack_dir, f"rank{rank}.memory")


class _Watchdog(threading.Thread):
    """Every ``interval`` seconds: write the collective counts that changed (Note [Counting costs
    the step nothing] in ``paracheck.world._collectives``); exit when the parent process is gone
    (the driver, or the zygote that forked this rank: Note [Cleaning up]); while a job runs with a
    memory cap, stop this process once its resident memory exceeds the cap (Note [Rank memory
    cap])."""

    interval = 0.05

    def __init__(self, rank: int, parent: int, stack_dir: str, lock: int, counter):
        super().__init__(name="paracheck-watchdog", daemon=True)
        self.rank, self.parent, self.stack_dir, self.lock = rank, parent, stack_dir, lock
        self.counter = counter
        self.cap = 0  # bytes; 0: none (set per job)
        # Held while this thread judges the job and by the main thread while it ends one: without
        # it, a rank found over the cap as its job ended answered the job, was stopped after, and
        # the driver found it dead in the next job with a record naming the previous one (read as
        # a death, not the cap: seen once in a full test run on two busy cores).
        self.guard = threading.Lock()
        self._stopping = threading.Lock()  # held by the one thread that stops the process
        counter.on_step = self.at_step

    def run(self) -> None:
        while True:
            time.sleep(self.interval)
            self.counter.flush()  # Note [Counting costs the step nothing]
            if os.getppid() != self.parent:
                orphaned(self.stack_dir, self.lock)
            if self.cap and self.counter.active:
                with self.guard:
                    if self.counter.active:
                        rss = resident_bytes()
                        if rss > self.cap:
                            self._stop(rss, self.counter.step)

    def at_step(self, step: int) -> None:
        """The job starts step ``step``: a step that ended over the cap is named, not the next
        one, which the polling thread could otherwise see first (Note [Rank memory cap])."""
        if self.cap and self.counter.active:
            rss = resident_bytes()
            if rss > self.cap:
                self._stop(rss, self.counter.step)

    def _stop(self, rss: int, step: int | None) -> None:
        # One writer: the main thread (at_step) and this one can find the cap passed at the same
        # moment, and two writers of the one temporary file could leave a record that does not
        # parse, read by the driver as a plain SIGKILL. The second waits here for the kill.
        self._stopping.acquire()
        record = {"job": self.counter.job, "rss": rss, "cap": self.cap, "step": step}
        path = memory_record_path(self.stack_dir, self.rank)
        with open(path + ".tmp", "w") as f:
            json.dump(record, f)
        os.replace(path + ".tmp", path)
        os.kill(os.getpid(), signal.SIGKILL)


def hold_lock(stack_dir: str) -> int:
    """A shared lock on the World's directory, held for the life of the process (Note [Cleaning
    up]); each process opens the file itself (a lock belongs to an open file, which fork shares)."""
    import fcntl

    fd = os.open(os.path.join(stack_dir, "alive.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_SH)
    return fd


def orphaned(stack_dir: str, lock: int) -> None:
    """The driver is gone: remove the World's directory if this is the last of its processes,
    then exit (Note [Cleaning up])."""
    import fcntl

    try:
        fcntl.flock(lock, fcntl.LOCK_UN)
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        shutil.rmtree(stack_dir, ignore_errors=True)
    except OSError:
        pass  # another process still holds its lock: it is not the last
    os._exit(0)


def _resolve(path: str):
    module, _, name = path.partition(":")
    obj = importlib.import_module(module)
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def rank_main(
    rank: int,
    host: str,
    port: int,
    driver: str,
    stack_dir: str,
    backend: str,
    device: str | None,
    pg_timeout: float,
) -> None:
    """Serve jobs as rank ``rank`` until told to stop (a process of its own, or forked by
    ``zygote_main``)."""
    # First, before torch prints anything (Note [Captured output]).
    output = _Output(os.path.join(stack_dir, f"rank{rank}.out"))
    lock = hold_lock(stack_dir)
    parent = int(os.environ.get("PARACHECK_PARENT", os.getppid()))
    if os.getppid() != parent:
        orphaned(stack_dir, lock)  # the driver died while this rank started

    from multiprocessing.connection import Client

    from paracheck.world._collectives import CollectiveCounter, install

    counter = CollectiveCounter()
    watchdog = _Watchdog(rank, parent, stack_dir, lock, counter)
    watchdog.start()
    # Import before connecting: the driver accepts (and authenticates) one rank at a time and
    # waits for its "ready", so a rank that connected first and imported after made the ranks
    # start one after another (measured: one rank every ~4 s, 26 s for six, over the 120 s
    # start timeout on a busy machine); imported first, they import in parallel.
    import torch

    # Constructing the first torch.optim optimizer imports torch._dynamo (3 s on an idle core,
    # over 10 s with six ranks on two busy cores): paid here, at start, not inside the first
    # job's hang timeout, where it made a correct target "hang" on its first case.
    import torch._dynamo  # noqa: F401
    import torch.distributed as dist

    install(counter)  # before any target is imported: see paracheck.world._collectives

    dhost, dport = driver.rsplit(":", 1)
    conn = Client((dhost, int(dport)), authkey=bytes.fromhex(os.environ["PARACHECK_AUTHKEY"]))
    # faulthandler dumps every thread's Python stack from a C signal handler, so it works even
    # while the main thread is blocked inside a collective.
    stack_file = open(os.path.join(stack_dir, f"rank{rank}.stack"), "w+")
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    counter.attach(os.path.join(stack_dir, f"rank{rank}.status"))
    torch.set_num_threads(1)
    if device is not None:
        torch.cuda.set_device(torch.device(device))
    store = dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=60))
    send(conn, ("ready", rank, os.getpid()))
    if not _serve(
        rank, conn, store, stack_file, backend, device, pg_timeout, counter, output, watchdog
    ):
        orphaned(stack_dir, lock)  # the driver closed the connection without a "stop"
    # Told to stop: the group is destroyed and the driver answered. Ending the interpreter the
    # usual way costs ~2.3 s here (torch's and gloo's finalisers, measured with three ranks on
    # two cores), paid by every command that closes its World; nothing left needs it.
    for stream in (sys.stdout, sys.stderr, stack_file):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(0)


def zygote_main(stack_dir: str) -> None:
    """A process that imports what a rank needs once, then forks a rank per line read from stdin
    (Note [Forked ranks] in ``paracheck.world._processes``): ``json [rank_main args...,
    authkey]``.
    The exit status of each child goes to ``<stack_dir>/exit.<pid>`` (the driver is not its parent).
    The end of stdin means the driver is gone (it kills the zygote when it closes the World)."""
    import select

    _Output(os.path.join(stack_dir, "zygote.out"))  # Note [Captured output]
    lock = hold_lock(stack_dir)

    import torch  # noqa: F401
    import torch._dynamo  # noqa: F401
    import torch.distributed  # noqa: F401

    from paracheck.world import _collectives  # noqa: F401

    def reap():
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
            tmp = os.path.join(stack_dir, f"exit.{pid}.tmp")
            with open(tmp, "w") as f:
                f.write(str(code))
            os.replace(tmp, os.path.join(stack_dir, f"exit.{pid}"))

    # Reaped by polling, not from a SIGCHLD handler: torch's import starts threads, and a signal
    # delivered to one of them would wait for the main thread's next line of input.
    open(os.path.join(stack_dir, "zygote.ready"), "w").close()
    buf = b""
    while True:
        readable = select.select([0], [], [], 0.02)[0]
        reap()
        if not readable:
            continue
        chunk = os.read(0, 1 << 16)
        if not chunk:
            orphaned(stack_dir, lock)
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            args = json.loads(line)
            zygote = os.getpid()
            if os.fork() == 0:
                code = 1
                try:
                    os.close(lock)  # the rank holds a lock of its own (hold_lock)
                    devnull = os.open(os.devnull, os.O_RDONLY)
                    os.dup2(devnull, 0)
                    os.environ["PARACHECK_AUTHKEY"] = args[-1]
                    os.environ["PARACHECK_PARENT"] = str(zygote)
                    rank_main(*args[:-1])
                    code = 0
                finally:
                    os._exit(code)


def _serve(
    rank, conn, store, stack_file, backend, device, pg_timeout, counter, output, watchdog
) -> bool:
    """Answer jobs until told to stop (True) or until the driver's connection ends (False)."""
    import torch
    import torch.distributed as dist

    current = None  # (world_size, generation) of the live default group
    while True:
        try:
            msg = recv(conn)
        except (EOFError, OSError):
            return False
        if msg[0] == "stop":
            if dist.is_initialized():
                dist.destroy_process_group()
            send(conn, ("stopped", rank))
            return True
        if msg[0] == "reset":
            current = None
            _drop_group(backend)
            gc.collect()  # a finished target's reference cycles can hold the group open
            continue
        _, job_id, world_size, generation, fn_path, payload, cap = msg
        stack_file.seek(0)
        stack_file.truncate()
        try:
            # Imported before the group's rendezvous, which every rank of the job joins: a rank
            # slow to import the job's function (its first job, on a loaded machine) then keeps
            # its peers in the rendezvous, not inside their first collective, whose timeout is
            # the group's (Note [Started ranks] in paracheck.world._watch).
            fn = _resolve(fn_path) if rank < world_size else None
            if current != (world_size, generation):
                if dist.is_initialized():
                    dist.destroy_process_group()
                current = None
                if rank < world_size:
                    prefix = dist.PrefixStore(f"pg/{generation}", store)
                    kwargs: dict[str, Any] = (
                        {"device_id": torch.device(device)} if backend == "nccl" else {}
                    )
                    dist.init_process_group(
                        backend,
                        store=prefix,
                        rank=rank,
                        world_size=world_size,
                        timeout=timedelta(seconds=pg_timeout),
                        **kwargs,
                    )
                current = (world_size, generation)
            if rank >= world_size:
                send(conn, (job_id, "idle", None))
                continue
            assert fn is not None  # resolved above for every rank of the job
            output.begin()
            watchdog.cap = cap
            counter.begin(job_id)
            state = "raised"
            try:
                with warnings.catch_warnings():  # Note [Captured output]
                    result = fn(payload)
                state = "returned"
            finally:
                with watchdog.guard:
                    counter.end(state)
            send(conn, (job_id, "ok", result, output.take()))
        except BaseException as exc:  # noqa: BLE001 - every failure goes back to the driver
            # A failed collective leaves the group unusable: drop it, the next job re-creates it.
            current = None
            _drop_group(backend)
            text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            try:
                from paracheck.world._blame import blame

                called_on = blame(exc)  # Note [Raised on the target's objects]
            except Exception:  # noqa: BLE001 - a reading of the frames must never lose the answer
                called_on = None
            try:
                send(conn, (job_id, "error", text, output.take(), called_on))
            except Exception:
                return False


def _drop_group(backend: str) -> None:
    """Leave the default group after a failed or abandoned job, whatever state it is in. An NCCL
    group is aborted, not destroyed: a destroy waits for the group's kernels to finish, which a
    collective that no peer joins never does, and on a group already aborted (by the watchdog
    at its timeout, or by an attached agent's control thread) it raises and leaves the group
    registered, so that every later job would fail creating its own."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return
    abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
    for leave in ([abort] if backend == "nccl" and abort is not None else []) + [
        dist.destroy_process_group
    ]:
        try:
            leave()
        except Exception:  # noqa: BLE001 - the group is being abandoned either way
            pass
        if not dist.is_initialized():
            return


# Plain pickle over the connection: multiprocessing's ForkingPickler would hand torch tensors over
# as shared-memory file descriptors (torch.multiprocessing's reductions), which needs the
# multiprocessing authkey of a parent/child pair that these independent processes do not share.
def send(conn, obj) -> None:
    conn.send_bytes(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


def recv(conn):
    return pickle.loads(conn.recv_bytes())
