"""``AttachedWorld("HOST:PORT")``: a ``World`` whose ranks torchrun started, on any number of nodes.

Its pool is an ``AgentPool`` (``paracheck.world._pool.Pool``): the agents' connections, answered
by each agent's control thread where a ``LocalPool`` reads its processes' files.

``torchrun ... -m paracheck.agent`` starts the agents (``paracheck.world._agent``); the driver
attaches through torchrun's own rendezvous store at ``MASTER_ADDR:MASTER_PORT`` and then runs
jobs on them exactly as on a ``World``: same ``run``/``submit``/``collect``, same failures
(``RankError``, ``RankHang`` with every rank's stack and what the ranks disagree on,
``RankDied``), same default group re-created per world size (ranks above a job's world size
wait). Hypothesis runs in this one process only (Note [Attached ranks]).
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from datetime import timedelta
from multiprocessing.connection import Listener

from paracheck.world._agent import DRIVER_KEY, POOL_KEY, agent_key
from paracheck.world._failures import PoolLost, RankFailure
from paracheck.world._pool import group_timeout
from paracheck.world._processes import hellos
from paracheck.world._rank import recv, send
from paracheck.world.runner import World

__all__ = ["AgentPool", "AttachedWorld", "PoolLost", "parse_address", "pool_of"]

# Note [Attached ranks]
#   A multi-node check needs ranks on every node, and on a cluster the processes are started by
#   the cluster's launcher, torchrun (under Slurm or not), not by paracheck. So the ranks are
#   agents that torchrun starts, and the driver attaches to them; nothing else is started or
#   addressed: the driver finds the agents, and they find the driver, through the rendezvous
#   store torchrun runs anyway (MASTER_ADDR:MASTER_PORT). Hypothesis runs in the driver alone:
#   running it on every rank in lock-step cannot work, since each process shrinks on its own
#   timings and deadlines, so the ranks would soon run different cases; paracheck refuses to be
#   started that way (``paracheck.world._agent.launched_by_torchrun``).
#   The planes are apart: each job's default process group (the data plane, NCCL or gloo) is
#   created per world size under the session's prefix of the store, exactly as a World's rank
#   does it, with the same code (``paracheck.world._rank._serve``): a Case gives bitwise the
#   same records attached as on one host. The control plane is a second connection per agent,
#   served by a thread that answers while the job's thread is blocked in a collective: its
#   collective counts (polled for Note [Definite deadlock]), its stack, its output, and an
#   interrupt. A hang is reported like a World's; recovery is the World's (ranks that finished
#   drop their group, so a peer blocked with them fails at once), then an interrupt for a rank
#   stuck in Python, then, on NCCL, an abort of the stuck ranks' group from their control thread
#   (an NCCL collective waits on the GPU, where neither an interrupt nor a peer's leaving reaches
#   it; the agents also keep NCCL's watchdog from ending the process at the group's timeout),
#   then the group's timeout (a little over the job's) for a rank blocked in a gloo collective
#   that no peer will join. A rank freed drops its group, and the next job creates a new one.
#   The agents are never restarted from here: torchrun owns them (Note [A lost pool]).


def parse_address(address: str) -> tuple[str, int]:
    """``"HOST:PORT"`` -> (host, port); a clear error naming the value otherwise."""
    host, sep, port = str(address).rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(
            f"attach={address!r} must be HOST:PORT (torchrun's MASTER_ADDR:MASTER_PORT)"
        )
    return host, int(port)


def _facing(host: str, port: int) -> str:
    """This machine's address on the route to ``host``: the one the agents can connect back to."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((socket.gethostbyname(host), port))  # no packet is sent
        return s.getsockname()[0]


# Note [A lost pool]
#   A World replaces a rank that died or stayed stuck; attached agents cannot be replaced from the
#   driver, and torchrun ends the whole job when one of its workers dies (gloo aborts a process
#   whose peer sent a collective of another size). From then on the pool is lost: the case that
#   lost it has already been judged (a hang or a death, with its stacks), and every later job is
#   refused with ``PoolLost``. A check stops where it is and reports what it found: its search
#   shrinks no further (uncached candidates count as passing, as when a hang's shrinking budget
#   runs out), the failure being labelled keeps the features tried so far, and the target's
#   report says the check stopped there; a target with nothing found yet has no verdict
#   (``check_target`` raises ``PoolLost``). ``paracheck check`` prints the verdicts it has and
#   one line saying the torchrun job must be started again, and checks no further target.


# How a refused --attach says what to start.
_START_AGENTS = (
    "start them with torchrun --nnodes N --node-rank K --nproc-per-node G --master-addr {host} "
    "--master-port {port} -m paracheck.agent, one command per node (a driver's end stops the "
    "agents it used: each driver needs a torchrun job of its own)"
)


def _in_thread(fn, deadline: float):
    """``fn()``'s value, computed in a daemon thread while this one waits in slices of 0.1 s: a
    store's connect and wait block in C++, where Python runs no signal handler, so a Ctrl-C or
    SIGTERM would wait for them. TimeoutError past ``deadline`` (the thread is left to end at its
    own timeout)."""
    box: dict = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=run, name="paracheck-attach", daemon=True)
    thread.start()
    while thread.is_alive() and time.monotonic() < deadline:
        thread.join(min(0.1, max(0.0, deadline - time.monotonic())))
    if "error" in box:
        raise box["error"]
    if "value" not in box:
        raise TimeoutError
    return box["value"]


def _listening(host: str, port: int, deadline: float) -> None:
    """Return once something accepts connections at ``host:port``; TimeoutError at ``deadline``.
    Asked with a plain socket first: a store's client retries in C++ and prints a C++ stack trace
    for each attempt that finds nothing."""
    while True:
        try:
            socket.create_connection((host, port), timeout=1.0).close()
            return
        except socket.gaierror:
            raise
        except OSError:
            if time.monotonic() >= deadline:
                raise TimeoutError from None
            time.sleep(0.2)


def _pool(address: str, start_timeout: float):
    """The store at ``address``, the pool's record and each agent's, once every agent wrote it;
    a clear error within ``start_timeout`` seconds where there are none."""
    import torch.distributed as dist

    host, port = parse_address(address)
    deadline = time.monotonic() + start_timeout
    start = _START_AGENTS.format(host=host, port=port)
    where = f"attach={address!r}: "

    def left() -> timedelta:
        return timedelta(seconds=max(0.5, deadline - time.monotonic()))

    def connect():
        _listening(host, port, deadline)
        return dist.TCPStore(host, port, is_master=False, wait_for_workers=False, timeout=left())

    def registered(store):
        store.wait([POOL_KEY], left())
        pool = json.loads(store.get(POOL_KEY))
        nodes = []
        for r in range(pool["size"]):
            store.wait([agent_key(r)], left())
            nodes.append(json.loads(store.get(agent_key(r))))
        return pool, nodes, store.check([DRIVER_KEY])

    try:
        store = _in_thread(connect, deadline)
    except socket.gaierror as exc:
        raise RuntimeError(f"{where}cannot resolve {host!r} ({exc.strerror})") from None
    except (TimeoutError, RuntimeError, dist.DistError):
        raise RuntimeError(
            f"{where}no torchrun job answers there within {start_timeout:g} s (none started, or "
            f"its agents already ended): {start}"
        ) from None
    try:
        pool, nodes, claimed = _in_thread(lambda: registered(store), deadline)
    except (TimeoutError, RuntimeError, dist.DistError):
        raise RuntimeError(
            f"{where}a torchrun job answers there but no paracheck agents registered within "
            f"{start_timeout:g} s (is it running -m paracheck.agent?): {start}"
        ) from None
    if claimed:
        raise RuntimeError(
            f"{where}these agents already serve another driver (one driver per torchrun job: "
            "start another job for another driver)"
        )
    store.set_timeout(timedelta(seconds=start_timeout))
    return store, host, port, pool, nodes


def pool_of(address: str, start_timeout: float = 30.0) -> dict:
    """The size and backend of the pool of agents at ``address`` (``{"size": 4, "backend":
    "gloo"}``), without attaching to it."""
    return _pool(address, start_timeout)[3]


class _Agent:
    """The part of ``subprocess.Popen`` the World uses, for an agent on some node: alive until its
    connections end; never killed from here (torchrun owns it)."""

    def __init__(self, pid: int, node: dict):
        self.pid = pid
        self.node = node
        self.returncode: int | None = None

    def poll(self):
        return self.returncode

    def kill(self) -> None:
        pass

    def wait(self, timeout=None):
        return self.returncode


# How long an agent's control thread may take to answer a question, to an interrupt while the
# driver is being stopped, and to an abort of an NCCL group; and how long stopping the agents
# waits for them to say they stopped.
_ASK_SECONDS = 2.0
_KILL_ASK_SECONDS = 0.5
_ABORT_SECONDS = 10.0
_STOP_SECONDS = 5.0


class AgentPool:
    """The agents of a torchrun job as a World's pool (``paracheck.world._pool.Pool``): found in
    the store at ``address`` (``_pool``), claimed for this driver when opened, never started,
    replaced or killed from here (Note [A lost pool]); a job they cannot finish is interrupted,
    and on NCCL their group aborted (Note [Attached ranks])."""

    replaces_ranks = False
    restarted_words = "the attached agents cannot run another case (torchrun owns them)"

    def __init__(self, address: str, *, start_timeout: float, group_timeout: float):
        store, host, port, info, nodes = _pool(address, start_timeout)
        self.address = f"{host}:{port}"
        self.size: int = info["size"]
        self.backend: str = info["backend"]
        self.nodes = nodes
        self.start_timeout = start_timeout
        self.group_timeout = group_timeout
        self.generation = 0
        self.restarts = 0
        self.start_seconds = self.spawn_seconds = 0.0
        self.served = [0] * self.size
        self.conns: list = []
        self._attach = (store, host, port)
        self._procs: list = []
        self._ctls: list = []
        self._seq = 0
        self._broken: str | None = None

    # -- lifecycle ------------------------------------------------------------------------
    def open(self) -> None:
        t0 = time.monotonic()
        store, host, port = self._attach
        authkey = os.urandom(16)
        listener = Listener((_facing(host, port), 0), authkey=authkey, backlog=64)
        claim = json.dumps(
            {
                "address": f"{listener.address[0]}:{listener.address[1]}",
                "authkey": authkey.hex(),
                "session": os.urandom(8).hex(),
                "pg_timeout": self.group_timeout,
            }
        )
        if store.compare_set(DRIVER_KEY, "", claim).decode() != claim:
            listener.close()
            raise RuntimeError(
                f"attach={self.address!r}: these agents already serve another driver (one driver "
                "per torchrun job: start another job for another driver)"
            )
        self._procs = [None] * self.size
        self.conns, self._ctls = [None] * self.size, [None] * self.size
        deadline = time.monotonic() + self.start_timeout

        def give_up() -> None:
            if time.monotonic() > deadline:
                missing = [r for r in range(self.size) if None in (self.conns[r], self._ctls[r])]
                raise RuntimeError(
                    f"attach={self.address!r}: agent(s) {missing} did not connect within "
                    f"{self.start_timeout:g} s"
                )

        late = f"attach={self.address!r}: an agent connected but did not report"
        try:
            for conn, (what, rank, pid) in hellos(listener, deadline, give_up, late):
                if what == "ready":
                    self.conns[rank] = conn
                    self._procs[rank] = _Agent(pid, self.nodes[rank])
                else:
                    self._ctls[rank] = conn
                if None not in self.conns + self._ctls:
                    break
        finally:
            listener.close()
        self.start_seconds = self.spawn_seconds = time.monotonic() - t0

    def replace(self, ranks: list[int]) -> bool:
        """Never: torchrun owns the agents."""
        return False

    def restart(self) -> None:
        """The agents cannot be started again from here: the pool is lost (Note [A lost pool])."""
        dead = [r for r, p in enumerate(self._procs) if p is not None and p.poll() is not None]
        self._broken = (
            f"the agents at {self.address} cannot run another case"
            + (
                f" (agent(s) {dead} are gone: torchrun ends its job when a worker dies)"
                if dead
                else " (an agent stayed stuck in its job)"
            )
            + ": start the torchrun job again"
        )

    @property
    def lost(self) -> str | None:
        """Why these agents cannot run another job (None while they can)."""
        if self._broken is None and any(p.poll() is not None for p in self._procs):
            self.restart()
        return self._broken

    def regroup(self) -> None:
        self.generation += 1

    def reset(self, ranks: list[int]) -> None:
        for r in ranks:
            if self._procs[r].poll() is None:
                try:
                    send(self.conns[r], ("reset",))
                except (BrokenPipeError, OSError):
                    pass

    def close(self) -> None:
        """Stop the agents (the torchrun job then ends)."""
        for conn in self.conns:
            try:
                send(conn, ("stop",))
            except (AttributeError, OSError):
                pass
        deadline = time.monotonic() + _STOP_SECONDS
        for conn in self.conns:
            try:
                while conn.poll(max(0.0, deadline - time.monotonic())):
                    if recv(conn)[0] == "stopped":
                        break
            except (AttributeError, EOFError, OSError):
                pass
        self._disconnect()

    def kill(self, job: int) -> None:
        """Interrupt the job the agents run, then stop them."""
        for r in range(self.size):
            self._ask(r, "interrupt", job, timeout=_KILL_ASK_SECONDS)
        self.close()

    def _disconnect(self) -> None:
        for c in list(self.conns) + list(self._ctls):
            if c is not None:
                c.close()
        self.conns, self._ctls, self._procs = [], [], []

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    # -- what the driver sees of a rank -----------------------------------------------------
    def _ask(self, rank: int, what: str, arg=None, timeout: float = _ASK_SECONDS):
        """The answer of agent ``rank``'s control thread (None if it does not answer in time)."""
        ctl = self._ctls[rank] if rank < len(self._ctls) else None
        if ctl is None:
            return None
        self._seq += 1
        seq = self._seq
        deadline = time.monotonic() + timeout
        try:
            send(ctl, (seq, what, arg))
            while ctl.poll(max(0.0, deadline - time.monotonic())):
                got, answer = recv(ctl)
                if got == seq:
                    return answer
        except (EOFError, OSError):
            self._procs[rank].returncode = 1
        return None

    def alive(self, rank: int) -> bool:
        return self._procs[rank].poll() is None

    def status(self, rank: int) -> dict | None:
        return self._ask(rank, "status")

    def output(self, rank: int) -> str:
        return self._ask(rank, "output") or ""

    def stacks(self, ranks: list[int]) -> dict[int, str]:
        return {r: self._ask(r, "stack") or "" for r in ranks}

    def death(self, rank: int, job: int) -> RankFailure:
        host = self.nodes[rank]["host"]
        return RankFailure(
            rank, "died", f"its connection ended: the agent on {host} exited, or its node is gone"
        )

    def activity(self, rank: int) -> tuple[int, bool] | None:
        """Never known: an agent's process is on another machine (Note [Timeout verdicts])."""
        return None

    def free(self, stuck: list[int], job: int) -> bool:
        """The other agents drop their group; the stuck ones are interrupted: a rank in Python
        raises at once, one blocked in a collective as soon as the collective returns; on NCCL
        their group is aborted, which frees a collective no peer will join (Note [Attached
        ranks])."""
        self.reset([r for r in range(self.size) if r not in stuck])
        for r in stuck:
            self._ask(r, "interrupt", job)
        if self.backend == "nccl":
            for r in stuck:
                self._ask(r, "abort", job, timeout=_ABORT_SECONDS)
        return True

    def unstick_deadline(self, started: float) -> float | None:
        """The group's timeout frees a rank blocked in a collective that no peer will join (Note
        [Attached ranks]): no agent can be replaced, so it is always waited for."""
        return started + self.group_timeout + 1.0


class AttachedWorld(World):
    """The agents of a torchrun job, attached at ``address`` (its ``MASTER_ADDR:MASTER_PORT``).

    ``size`` and ``backend`` are the pool's (``torchrun``'s world size, ``paracheck.agent
    --backend``); ``timeout`` bounds every job, as for a World. Closing it stops the agents, and
    the torchrun job ends."""

    def __init__(self, address: str, *, timeout: float = 30.0, start_timeout: float = 30.0):
        pool = AgentPool(
            address, start_timeout=start_timeout, group_timeout=group_timeout(float(timeout))
        )
        self.agents = pool
        super().__init__(
            pool.size,
            backend=pool.backend,
            timeout=timeout,
            devices=[n["device"] for n in pool.nodes] if pool.backend == "nccl" else None,
            start_timeout=start_timeout,
            rank_memory=float("inf"),
            pool=pool,
        )

    @property
    def address(self) -> str:
        return self.agents.address

    @property
    def lost(self) -> str | None:
        """Why these agents cannot run another job (None while they can): Note [A lost pool]."""
        return self.agents.lost

    @property
    def nodes(self) -> list[str]:
        """Each rank's host name."""
        return [n["host"] for n in self.agents.nodes]
