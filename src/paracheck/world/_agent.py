"""The body of one agent: a rank that ``torchrun`` started, serving the jobs of one attached driver
(``paracheck.world.attached.AttachedWorld``). The command line is ``paracheck.agent``.

An agent is a ``World`` rank (``paracheck.world._rank``) whose process was started by torchrun
instead of by the driver, on any node: it serves the same protocol with the same code
(``_serve``), so a job's results are those of a rank of a ``World`` (Note [Attached ranks]).
What differs is how it finds the driver and how the driver sees into it:

* the rendezvous store that torchrun already runs (``MASTER_ADDR:MASTER_PORT``) is where the
  pool and the driver meet: agent 0 writes the pool's size and backend under ``paracheck/pool``,
  each agent its node and device under ``paracheck/agent/<r>``; the driver claims
  ``paracheck/driver`` with its address, an authentication key and a session name, and every
  agent connects to it twice: a job connection and a control connection;
* the control connection is served by a thread of its own, so it answers while the job's thread
  is blocked in a collective: the agent's collective counts, every thread's Python stack
  (``faulthandler``), what the job printed, and an interrupt that raises in a job's thread once
  it is back in Python (a job stuck in a Python loop, or whose collective timed out), and an
  abort of the job's NCCL group (``abort_group``: a collective no peer joins waits on the GPU,
  where no interrupt reaches it). On one host the driver reads files and sends signals for the
  same things, and replaces a stuck rank; across nodes it cannot.

Every process group a session creates lives under ``paracheck/<session>/`` in the store, so
a second driver attaching to the same agents never meets the first one's keys.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from datetime import timedelta
from typing import NoReturn

from paracheck.errors import ParacheckError
from paracheck.world._rank import (
    _Output,
    _serve,
    _Watchdog,
    hold_lock,
    read_output,
    recv,
    send,
)

POOL_KEY = "paracheck/pool"
DRIVER_KEY = "paracheck/driver"
_TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


class Interrupted(ParacheckError, RuntimeError):
    """Raised in an agent's job by the driver, after the job's timeout (Note [Attached ranks])."""


def agent_key(rank: int) -> str:
    return f"paracheck/agent/{rank}"


def launched_by_torchrun() -> bool:
    """Whether this process is a worker that torchrun (or torch.distributed.launch) started."""
    env = os.environ
    return "TORCHELASTIC_RUN_ID" in env or all(
        k in env for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK")
    )


def torchrun_env() -> dict:
    """This worker's rank, world size, local rank and rendezvous address, from torchrun's
    environment; a clear error where torchrun did not start it."""
    missing = [k for k in _TORCHRUN_ENV if k not in os.environ]
    if missing:
        raise SystemExit(
            "paracheck.agent: launch it with torchrun (torchrun --nnodes N --nproc-per-node G "
            f"... -m paracheck.agent): {', '.join(missing)} not set"
        )
    return {
        "rank": int(os.environ["RANK"]),
        "world_size": int(os.environ["WORLD_SIZE"]),
        "local_rank": int(os.environ["LOCAL_RANK"]),
        "host": os.environ["MASTER_ADDR"],
        "port": int(os.environ["MASTER_PORT"]),
        # torchrun's own agent hosts the store (torch >= 2.2); before, worker 0 did.
        "agent_store": os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True",
    }


class _Interrupt:
    """The job the driver asked to interrupt: set by the control thread, read by the handler of
    SIGUSR2 in the job's thread."""

    job: object = None


def _job_thread_first(dump: str, main: int) -> str:
    """A faulthandler dump taken by the control thread, as a signal handler in the job's thread
    would give it (a World's rank): the job's thread first, as the current one; the control
    thread's own stack left out."""
    blocks = [b for b in dump.strip("\n").split("\n\n") if b.strip()]
    ident = f"0x{main:016x}"
    job = [b for b in blocks if b.startswith(f"Thread {ident}")]
    rest = [b for b in blocks if not b.startswith(("Current thread", f"Thread {ident}"))]
    head = [b.replace(f"Thread {ident}", f"Current thread {ident}", 1) for b in job]
    return "\n\n".join(head + rest) + "\n"


def flight_record(since_ns: int, last: int = 6) -> str:
    """The last ``last`` entries of torch's flight recorder created since ``since_ns`` (the job's
    start), newest last: the collective a rank waits in, with its sizes and state. Empty where
    torch has no recorder or it records nothing (``TORCH_FR_BUFFER_SIZE`` unset)."""
    import pickle

    import torch._C._distributed_c10d as c10d

    dump = getattr(c10d, "_dump_fr_trace", None) or getattr(c10d, "_dump_nccl_trace", None)
    if dump is None:
        return ""
    try:
        entries = pickle.loads(dump(True, False, False)).get("entries", [])
    except Exception:  # noqa: BLE001 - a diagnosis only: never fail a hang report for it
        return ""
    mine = [e for e in entries if e.get("time_created_ns", 0) >= since_ns][-last:]
    lines = [
        f"  {e.get('profiling_name', '?')} #{e.get('collective_seq_id', '?')} on "
        f"{(e.get('process_group') or ('', '?'))[1]}, input sizes {e.get('input_sizes')}: "
        f"{e.get('state', '?')}"
        for e in mine
    ]
    return "torch's flight recorder, this job, newest last:\n" + "\n".join(lines) if lines else ""


def abort_group() -> bool:
    """Abort the job's default group from the control thread, while the job's thread is blocked in
    it: NCCL's communicators are aborted, so a collective no peer will join ends on the GPU and
    the job's thread raises once back in Python; ``_serve`` then drops the group, and the next
    job creates a new one (Note [Attached ranks]). Gloo's abort does nothing: there the group's
    timeout frees the rank. True if a group was aborted; False where none was, or the abort
    failed (then the group's timeout frees the rank, NCCL's watchdog aborting it)."""
    import torch.distributed as dist

    group = dist.distributed_c10d.GroupMember.WORLD
    if group is None:
        return False
    try:
        group.abort()
    except Exception:  # noqa: BLE001 - the control thread must go on answering
        return False
    return True


def _control(ctl, rank: int, stack_dir: str, counter, interrupt: _Interrupt, main: int) -> None:
    """Answer the driver's control requests until its connection ends: ``(seq, what, arg)`` ->
    ``(seq, answer)``."""
    from paracheck.world._collectives import read_status

    status_path = os.path.join(stack_dir, f"rank{rank}.status")
    out_path = os.path.join(stack_dir, f"rank{rank}.out")
    dump_path = os.path.join(stack_dir, f"rank{rank}.dump")
    while True:
        try:
            seq, what, arg = recv(ctl)
        except (EOFError, OSError):
            return
        answer: object = None
        if what == "status":
            answer = read_status(status_path)
        elif what == "output":
            answer = read_output(out_path)
        elif what == "stack":
            with open(dump_path, "w+") as f:
                faulthandler.dump_traceback(file=f, all_threads=True)
                f.seek(0)
                answer = _job_thread_first(f.read(), main)
            if counter.active:
                record = flight_record(counter.began_ns)
                answer += f"\n{record}\n" if record else ""
        elif what == "interrupt":
            answer = bool(counter.active and counter.job == arg)
            if answer:
                interrupt.job = arg
                signal.pthread_kill(main, signal.SIGUSR2)
        elif what == "abort":
            answer = bool(counter.active and counter.job == arg) and abort_group()
        try:
            send(ctl, (seq, answer))
        except (EOFError, OSError):
            return


def agent_main(backend: str | None, wait: float, driver_args: list[str]) -> NoReturn:
    env = torchrun_env()
    rank, size = env["rank"], env["world_size"]
    # torch's flight recorder: the hang report names the collective each rank waits in (read
    # when a process group is created; the older name is NCCL's).
    for name in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"):
        os.environ.setdefault(name, "256")
    # NCCL's watchdog, at a collective's timeout, aborts the communicators but leaves the process
    # alive (torch's default, 3, ends it: torchrun would then end the whole job). The driver
    # aborts the group itself as soon as it reports a hang (``abort_group``); this is the
    # fallback where it could not.
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2")
    import torch

    backend, device = _backend_and_device(backend, env["local_rank"])
    address = f"{env['host']}:{env['port']}"
    stack_dir = tempfile.mkdtemp(prefix=f"paracheck-agent{rank}-")
    # The terminal torchrun gave this process, kept for its own messages and the driver it may
    # start; jobs print into the captured file like any rank's (Note [Captured output]).
    terminal = os.dup(2)
    driver = None
    if driver_args and rank == 0:
        driver_env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK")}
        driver_env.pop("TORCHELASTIC_RUN_ID", None)
        driver = subprocess.Popen(
            [sys.executable, "-m", "paracheck.cli", *driver_args, "--attach", address],
            env=driver_env,
            stdin=subprocess.DEVNULL,
        )
    output = _Output(os.path.join(stack_dir, f"rank{rank}.out"))

    def say(text: str) -> None:
        os.write(terminal, f"paracheck.agent rank {rank}/{size}: {text}\n".encode())

    lock = hold_lock(stack_dir)
    from multiprocessing.connection import Client

    import torch._dynamo  # noqa: F401 - paid at start, not in the first job (paracheck.world._rank)
    import torch.distributed as dist

    from paracheck.world._collectives import CollectiveCounter, install

    counter = CollectiveCounter()
    interrupt = _Interrupt()
    watchdog = _Watchdog(rank, os.getppid(), stack_dir, lock, counter)
    watchdog.start()
    install(counter)
    counter.attach(os.path.join(stack_dir, f"rank{rank}.status"))
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    if device is not None:
        torch.cuda.set_device(torch.device(device))

    def interrupted(signum, frame):
        job = interrupt.job
        if job is not None and counter.active and counter.job == job:
            interrupt.job = None
            raise Interrupted(f"interrupted by the driver after job {job}'s timeout")

    signal.signal(signal.SIGUSR2, interrupted)
    store = dist.TCPStore(
        env["host"],
        env["port"],
        is_master=rank == 0 and not env["agent_store"],
        wait_for_workers=False,
        timeout=timedelta(seconds=60),
    )
    node = {"host": socket.gethostname(), "pid": os.getpid(), "device": device}
    store.set(agent_key(rank), json.dumps(node))
    if rank == 0:
        store.set(POOL_KEY, json.dumps({"size": size, "backend": backend}))
    say(f"{backend}, waiting for a driver (paracheck check TARGET --attach {address})")
    claim = _wait_for_a_driver(store, driver, wait, stack_dir, say)
    if "exit" in claim:
        say(f"the driver that agent 0 started exited ({claim['exit']}) before attaching")
        _leave(stack_dir, driver.wait() if driver is not None else claim["exit"])
    dhost, dport = claim["address"].rsplit(":", 1)
    authkey = bytes.fromhex(claim["authkey"])
    conn = Client((dhost, int(dport)), authkey=authkey)
    send(conn, ("ready", rank, os.getpid()))
    ctl = Client((dhost, int(dport)), authkey=authkey)
    send(ctl, ("control", rank, os.getpid()))
    threading.Thread(
        target=_control,
        args=(ctl, rank, stack_dir, counter, interrupt, threading.main_thread().ident),
        name="paracheck-control",
        daemon=True,
    ).start()
    stack_file = open(os.path.join(stack_dir, f"rank{rank}.stack"), "w+")
    say(f"serving the driver at {claim['address']}")
    session = dist.PrefixStore(f"paracheck/{claim['session']}", store)
    stopped = _serve(
        rank,
        conn,
        session,
        stack_file,
        backend,
        device,
        float(claim["pg_timeout"]),
        counter,
        output,
        watchdog,
    )
    say("stopped by the driver" if stopped else "the driver's connection ended without a stop")
    _leave(stack_dir, driver.wait() if driver is not None else 0 if stopped else 1)


def _backend_and_device(backend: str | None, local_rank: int) -> tuple[str, str | None]:
    """The backend (None: NCCL where CUDA is, else gloo) and this agent's device (NCCL: the GPU
    of its local rank; gloo: None)."""
    import torch

    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend != "nccl":
        return backend, None
    n = torch.cuda.device_count()
    if local_rank >= n:
        raise SystemExit(
            f"paracheck.agent: --backend nccl: local rank {local_rank} has no CUDA "
            f"device ({n} present on {socket.gethostname()}); start at most {n} per node"
        )
    return backend, f"cuda:{local_rank}"


def _wait_for_a_driver(store, driver, wait: float, stack_dir: str, say) -> dict:
    """The driver's claim on the pool, read from ``store`` (``{"exit": code}`` where the driver
    agent 0 started exited first); leaves after ``wait`` seconds without one."""
    import torch.distributed as dist

    deadline = time.monotonic() + wait
    claim = None
    while claim is None:
        if driver is not None and driver.poll() is not None:
            # Said to the other agents too, which would otherwise wait until --wait.
            store.compare_set(DRIVER_KEY, "", json.dumps({"exit": driver.returncode or 1}))
        left = deadline - time.monotonic()
        if left <= 0:
            say(f"no driver attached within {wait:g} s (--wait)")
            _leave(stack_dir, 1)
        try:
            store.wait([DRIVER_KEY], timedelta(seconds=min(1.0 if driver else 10.0, left)))
        except (RuntimeError, dist.DistStoreError):  # not yet
            continue
        claim = json.loads(store.get(DRIVER_KEY))
    return claim


def _leave(stack_dir: str, code: int) -> NoReturn:
    """Exit with ``code``, leaving no directory behind. As a World's rank, without the usual end
    of the interpreter: it would only run torch's finalisers."""
    import shutil

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    shutil.rmtree(stack_dir, ignore_errors=True)
    os._exit(code)
