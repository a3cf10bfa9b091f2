"""``AttachedWorld("HOST:PORT")``: a ``World`` whose ranks torchrun started, on any number of nodes.

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
import time
from datetime import timedelta
from multiprocessing.connection import Listener

from paracheck.world._agent import DRIVER_KEY, POOL_KEY, agent_key
from paracheck.world._rank import _recv, _send
from paracheck.world.runner import RankFailure, World, hellos

__all__ = ["AttachedWorld", "parse_address", "pool_of"]

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
#   stuck in Python, then the group's timeout (a little over the job's) for a rank blocked in a
#   collective that no peer will join. The agents are never restarted from here: torchrun owns
#   them. An agent that dies ends the pool, said as much, and the next job is refused.


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


def _pool(address: str, start_timeout: float):
    """The store at ``address``, the pool's record and each agent's, once every agent wrote it."""
    import torch.distributed as dist

    host, port = parse_address(address)
    try:
        store = dist.TCPStore(
            host,
            port,
            is_master=False,
            wait_for_workers=False,
            timeout=timedelta(seconds=start_timeout),
        )
        store.wait([POOL_KEY], timedelta(seconds=start_timeout))
        pool = json.loads(store.get(POOL_KEY))
        nodes = []
        for r in range(pool["size"]):
            store.wait([agent_key(r)], timedelta(seconds=start_timeout))
            nodes.append(json.loads(store.get(agent_key(r))))
    except (RuntimeError, dist.DistStoreError) as exc:
        raise RuntimeError(
            f"attach={address!r}: no paracheck agents answered there within {start_timeout:g} s "
            f"(start them with torchrun ... -m paracheck.agent): {str(exc).splitlines()[0]}"
        ) from None
    return store, host, port, pool, nodes


def pool_of(address: str, start_timeout: float = 120.0) -> dict:
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


class AttachedWorld(World):
    """The agents of a torchrun job, attached at ``address`` (its ``MASTER_ADDR:MASTER_PORT``).

    ``size`` and ``backend`` are the pool's (``torchrun``'s world size, ``paracheck.agent
    --backend``); ``timeout`` bounds every job, as for a World. Closing it stops the agents, and
    the torchrun job ends."""

    def __init__(self, address: str, *, timeout: float = 30.0, start_timeout: float = 120.0):
        store, host, port, pool, nodes = _pool(address, start_timeout)
        self.address = f"{host}:{port}"
        self._attach = (store, host, port)
        self._nodes = nodes
        self._ctls: list = []
        self._seq = 0
        self._broken: str | None = None
        devices = [n["device"] for n in nodes] if pool["backend"] == "nccl" else None
        super().__init__(
            pool["size"],
            backend=pool["backend"],
            timeout=timeout,
            devices=devices,
            start_timeout=start_timeout,
            rank_memory=float("inf"),
        )

    # -- lifecycle ------------------------------------------------------------------------
    def _start(self) -> None:
        t0 = time.monotonic()
        store, host, port = self._attach
        authkey = os.urandom(16)
        listener = Listener((_facing(host, port), 0), authkey=authkey)
        claim = json.dumps(
            {
                "address": f"{listener.address[0]}:{listener.address[1]}",
                "authkey": authkey.hex(),
                "session": os.urandom(8).hex(),
                "pg_timeout": self._pg_timeout,
            }
        )
        if store.compare_set(DRIVER_KEY, "", claim).decode() != claim:
            listener.close()
            raise RuntimeError(
                f"attach={self.address!r}: these agents already serve another driver (one driver "
                "per torchrun job: start another job for another driver)"
            )
        self._store = store
        self._procs = [None] * self.size
        self._conns, self._ctls = [None] * self.size, [None] * self.size
        deadline = time.monotonic() + self.start_timeout

        def give_up() -> None:
            if time.monotonic() > deadline:
                missing = [r for r in range(self.size) if None in (self._conns[r], self._ctls[r])]
                raise RuntimeError(
                    f"attach={self.address!r}: agent(s) {missing} did not connect within "
                    f"{self.start_timeout:g} s"
                )

        late = f"attach={self.address!r}: an agent connected but did not report"
        try:
            for conn, (what, rank, pid) in hellos(listener, deadline, give_up, late):
                if what == "ready":
                    self._conns[rank] = conn
                    self._procs[rank] = _Agent(pid, self._nodes[rank])
                else:
                    self._ctls[rank] = conn
                if None not in self._conns + self._ctls:
                    break
        finally:
            listener.close()
        self.start_seconds = self.spawn_seconds = time.monotonic() - t0

    def _start_zygote(self) -> None:
        pass  # nothing is started from here

    def _respawn(self, ranks: list[int]) -> bool:
        return False

    # No process of the agents' is on this machine to watch, and none can be replaced to run a
    # late job again (Note [Timeout verdicts] in paracheck.world.runner).
    stall_seconds = None
    reruns_timeouts = False

    def restart(self) -> None:
        dead = [r for r, p in enumerate(self._procs) if p is not None and p.poll() is not None]
        self._broken = (
            f"the attached pool at {self.address} cannot be used any more"
            + (f" (agent(s) {dead} are gone)" if dead else " (agents that did not recover)")
            + ": torchrun owns its agents; start the torchrun job again"
        )

    restarted_words = "the attached pool is unusable (torchrun owns its agents)"

    def submit(
        self, fn: str, payload, *, world_size: int | None = None, timeout: float | None = None
    ):
        if self._broken is None and any(p.poll() is not None for p in self._procs):
            self.restart()
        if self._broken is not None:
            raise RuntimeError(self._broken)
        return super().submit(fn, payload, world_size=world_size, timeout=timeout)

    def close(self) -> None:
        for conn in self._conns:
            try:
                _send(conn, ("stop",))
            except (AttributeError, OSError):
                pass
        deadline = time.monotonic() + 5.0
        for conn in self._conns:
            try:
                while conn.poll(max(0.0, deadline - time.monotonic())):
                    if _recv(conn)[0] == "stopped":
                        break
            except (AttributeError, EOFError, OSError):
                pass
        self._kill()
        self._cleanup()

    def kill(self) -> None:
        """Interrupt the job the agents run, then stop them."""
        for r in range(self.size):
            self._ask(r, "interrupt", self._job, timeout=0.5)
        self.close()

    def _kill(self) -> None:
        for c in list(self._conns) + list(self._ctls):
            if c is not None:
                c.close()
        self._conns, self._ctls, self._procs = [], [], []

    @property
    def nodes(self) -> list[str]:
        """Each rank's host name."""
        return [n["host"] for n in self._nodes]

    # -- what the driver sees of a rank -----------------------------------------------------
    def _ask(self, rank: int, what: str, arg=None, timeout: float = 2.0):
        """The answer of agent ``rank``'s control thread (None if it does not answer in time)."""
        ctl = self._ctls[rank] if rank < len(self._ctls) else None
        if ctl is None:
            return None
        self._seq += 1
        seq = self._seq
        deadline = time.monotonic() + timeout
        try:
            _send(ctl, (seq, what, arg))
            while ctl.poll(max(0.0, deadline - time.monotonic())):
                got, answer = _recv(ctl)
                if got == seq:
                    return answer
        except (EOFError, OSError):
            self._procs[rank].returncode = 1
        return None

    def _status(self, rank: int) -> dict | None:
        return self._ask(rank, "status")

    def _output(self, rank: int) -> str:
        return self._ask(rank, "output") or ""

    def _stacks(self, ranks: list[int]) -> dict[int, str]:
        return {r: self._ask(r, "stack") or "" for r in ranks}

    def _abandon(self, stuck: list[int]) -> bool:
        """Interrupt the stuck ranks' job: a rank in Python raises at once, one blocked in a
        collective as soon as the collective returns (Note [Attached ranks])."""
        for r in stuck:
            self._ask(r, "interrupt", self._job)
        return True

    def _unstick(self, stuck: list[int], started: float) -> bool:
        """Wait for the group's timeout to free a rank blocked in a collective that no peer will
        join (Note [Attached ranks])."""
        return self._await_stuck(stuck, started + self._pg_timeout + 1.0)

    def _death(self, rank: int, job: int) -> RankFailure:
        host = self._nodes[rank]["host"]
        return RankFailure(
            rank, "died", f"its connection ended: the agent on {host} exited, or its node is gone"
        )
