"""The body of one rank process of a ``World``. Private: the driver is ``paracheck.world.World``.

Protocol (driver -> rank over a Pipe): ``("run", job_id, world_size, generation, fn_path, payload)``,
``("reset",)`` or ``("stop",)``. The rank (re)creates its default process group when the requested
world size or generation changes (Note [One default group per world size]), calls ``fn(payload)``
if its rank is below the world size, and answers ``(job_id, "ok", result, output)`` or
``(job_id, "error", text, output)``, where ``output`` is what the job printed (Note [Captured
output]). ``("reset",)`` drops the process group without an answer: a rank that finished a job
whose peers are stuck in a collective closes its connections, so their collective fails at once
(Note [Definite deadlock] in ``paracheck.world.runner``).

While a job runs, the rank's collectives are counted into ``<stack_dir>/rank<r>.status``
(``paracheck.world._collectives``) and its stdout/stderr go to ``<stack_dir>/rank<r>.out``.
"""

from __future__ import annotations

import faulthandler
import gc
import importlib
import os
import pickle
import signal
import sys
import traceback
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
#   per case. For the duration of a job the rank points its file descriptors 1 and 2 at its
#   ``rank<r>.out`` file (dup2, so prints from C extensions are caught too), then restores them and
#   sends the head and tail of what was written with its answer; the driver shows it only with a
#   failure, and reads the file itself for a rank that hangs. faulthandler's stack dumps go to their
#   own file descriptor (the ``.stack`` file) and are unaffected.
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


class _Capture:
    def __init__(self, path: str):
        self.path = path
        self._file = open(path, "wb+")
        self._saved = None

    def __enter__(self):
        sys.stdout.flush()
        sys.stderr.flush()
        self._file.seek(0)
        self._file.truncate()
        self._saved = (os.dup(1), os.dup(2))
        os.dup2(self._file.fileno(), 1)
        os.dup2(self._file.fileno(), 2)
        return self

    def __exit__(self, *exc):
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except Exception:  # noqa: BLE001 - a target may have closed or replaced the streams
            pass
        os.dup2(self._saved[0], 1)
        os.dup2(self._saved[1], 2)
        os.close(self._saved[0])
        os.close(self._saved[1])
        return False

    def clear(self) -> None:
        self._file.seek(0)
        self._file.truncate()

    def text(self) -> str:
        return read_output(self.path)


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
    from multiprocessing.connection import Client

    from paracheck.world._collectives import CollectiveCounter, install

    counter = CollectiveCounter()
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
    capture = _Capture(os.path.join(stack_dir, f"rank{rank}.out"))
    torch.set_num_threads(1)
    if device is not None:
        torch.cuda.set_device(torch.device(device))
    store = dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=60))
    _send(conn, ("ready", rank, os.getpid()))
    _serve(rank, conn, store, stack_file, backend, device, pg_timeout, counter, capture)


def zygote_main(stack_dir: str) -> None:
    """A process that imports what a rank needs once, then forks a rank per line read from stdin
    (Note [Forked ranks] in ``paracheck.world.runner``): ``json [rank_main args..., authkey]``.
    The exit status of each child goes to ``<stack_dir>/exit.<pid>`` (the driver is not its parent)."""
    import json
    import select

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
            return
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            args = json.loads(line)
            if os.fork() == 0:
                code = 1
                try:
                    devnull = os.open(os.devnull, os.O_RDONLY)
                    os.dup2(devnull, 0)
                    os.environ["PARACHECK_AUTHKEY"] = args[-1]
                    rank_main(*args[:-1])
                    code = 0
                finally:
                    os._exit(code)


def _serve(rank, conn, store, stack_file, backend, device, pg_timeout, counter, capture) -> None:
    import torch
    import torch.distributed as dist

    current = None  # (world_size, generation) of the live default group
    while True:
        try:
            msg = _recv(conn)
        except EOFError:
            return
        if msg[0] == "stop":
            if dist.is_initialized():
                dist.destroy_process_group()
            _send(conn, ("stopped", rank))
            return
        if msg[0] == "reset":
            current = None
            try:
                if dist.is_initialized():
                    dist.destroy_process_group()
            except Exception:  # noqa: BLE001 - the group is being abandoned either way
                pass
            gc.collect()  # a finished target's reference cycles can hold the group open
            continue
        _, job_id, world_size, generation, fn_path, payload = msg
        stack_file.seek(0)
        stack_file.truncate()
        capture.clear()
        try:
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
                _send(conn, (job_id, "idle", None))
                continue
            fn = _resolve(fn_path)
            counter.begin(job_id)
            state = "raised"
            try:
                with capture:
                    result = fn(payload)
                state = "returned"
            finally:
                counter.end(state)
            _send(conn, (job_id, "ok", result, capture.text()))
        except BaseException as exc:  # noqa: BLE001 - every failure goes back to the driver
            # A failed collective leaves the group unusable: drop it, the next job re-creates it.
            current = None
            try:
                if dist.is_initialized():
                    dist.destroy_process_group()
            except Exception:
                pass
            text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            try:
                _send(conn, (job_id, "error", text, capture.text()))
            except Exception:
                return


# Plain pickle over the connection: multiprocessing's ForkingPickler would hand torch tensors over
# as shared-memory file descriptors (torch.multiprocessing's reductions), which needs the
# multiprocessing authkey of a parent/child pair that these independent processes do not share.
def _send(conn, obj) -> None:
    conn.send_bytes(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


def _recv(conn):
    return pickle.loads(conn.recv_bytes())
