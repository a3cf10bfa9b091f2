"""The body of one rank process of a ``World``. Private: the driver is ``paracheck.world.World``.

Protocol (driver -> rank over a Pipe): ``("run", job_id, world_size, generation, fn_path, payload)``
or ``("stop",)``. The rank (re)creates its default process group when the requested world size
or generation changes (Note [One default group per world size]), calls ``fn(payload)`` if its rank
is below the world size, and answers ``(job_id, "ok", result)`` or ``(job_id, "error", text)``.
"""

from __future__ import annotations

import faulthandler
import importlib
import os
import pickle
import signal
import sys
import traceback
from datetime import timedelta

# Note [One default group per world size]
#   CS336-style targets call collectives on the default group and read dist.get_world_size(), so a
#   case of world size w must run with a *default* group of exactly w ranks. The ranks therefore
#   keep their processes and the store, and re-create the default group (ranks 0..w-1 only) when a
#   case asks for another size, under a fresh store prefix so no key of an earlier group is reused.
#   Measured: 10-20 ms per re-creation with gloo, versus 3-14 s to spawn a new world.


def _resolve(path: str):
    module, _, name = path.partition(":")
    obj = importlib.import_module(module)
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def rank_main(rank: int, host: str, port: int, driver: str, stack_dir: str, backend: str, device: str | None,
              pg_timeout: float) -> None:
    from multiprocessing.connection import Client

    # faulthandler dumps every thread's Python stack from a C signal handler, so it works even
    # while the main thread is blocked inside a collective.
    stack_file = open(os.path.join(stack_dir, f"rank{rank}.stack"), "w+")
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    # Import before connecting: the driver accepts (and authenticates) one rank at a time and
    # waits for its "ready", so a rank that connected first and imported after made the ranks
    # start one after another (measured: one rank every ~4 s, 26 s for six, over the 120 s
    # start timeout on a busy machine); imported first, they import in parallel.
    import torch
    import torch.distributed as dist

    # Constructing the first torch.optim optimizer imports torch._dynamo (3 s on an idle core,
    # over 10 s with six ranks on two busy cores): paid here, at start, not inside the first
    # job's hang timeout, where it made a correct target "hang" on its first case.
    import torch._dynamo  # noqa: F401

    dhost, dport = driver.rsplit(":", 1)
    conn = Client((dhost, int(dport)), authkey=bytes.fromhex(os.environ["PARACHECK_AUTHKEY"]))
    torch.set_num_threads(1)
    if device is not None:
        torch.cuda.set_device(torch.device(device))
    store = dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=60))
    _send(conn, ("ready", rank, os.getpid()))
    _serve(rank, conn, store, stack_file, backend, device, pg_timeout)


def _serve(rank, conn, store, stack_file, backend, device, pg_timeout) -> None:
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
        _, job_id, world_size, generation, fn_path, payload = msg
        stack_file.seek(0)
        stack_file.truncate()
        try:
            if current != (world_size, generation):
                if dist.is_initialized():
                    dist.destroy_process_group()
                current = None
                if rank < world_size:
                    prefix = dist.PrefixStore(f"pg/{generation}", store)
                    kwargs = {"device_id": torch.device(device)} if backend == "nccl" else {}
                    dist.init_process_group(backend, store=prefix, rank=rank, world_size=world_size,
                                            timeout=timedelta(seconds=pg_timeout), **kwargs)
                current = (world_size, generation)
            if rank >= world_size:
                _send(conn, (job_id, "idle", None))
                continue
            fn = _resolve(fn_path)
            result = fn(payload)
            _send(conn, (job_id, "ok", result))
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
                _send(conn, (job_id, "error", text))
            except Exception:
                return



# Plain pickle over the connection: multiprocessing's ForkingPickler would hand torch tensors over
# as shared-memory file descriptors (torch.multiprocessing's reductions), which needs the
# multiprocessing authkey of a parent/child pair that these independent processes do not share.
def _send(conn, obj) -> None:
    conn.send_bytes(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


def _recv(conn):
    return pickle.loads(conn.recv_bytes())
