"""Host microseconds per asynchronous NCCL all-reduce call on 2 GPUs, and what changes it.

BucketedDDP issues one ``dist.all_reduce(async_op=True)`` per bucket from backward hooks (243 per
xl step at 25 MB); on a host-bound step their host cost adds to the step. This times the call
itself (no synchronisation inside the loop) through ``dist.all_reduce`` and through the process
group's own ``allreduce``, with torch's defaults and with the NCCL flight recorder off
(``TORCH_NCCL_TRACE_BUFFER_SIZE=0``), each in fresh processes.

    PYTHONPATH=src python experiments/diag_allreduce_host.py
"""

import json
import os
import socket
import subprocess
import sys
import time

CHILD = r"""
import json, os, sys, time, torch, torch.distributed as dist
rank = int(os.environ["RANK"]); torch.cuda.set_device(rank)
dist.init_process_group("nccl", device_id=torch.device("cuda", rank))
t = torch.zeros(25 * 2**20 // 4, device="cuda")
pg = dist.distributed_c10d._get_default_group()
opts = dist.AllreduceOptions(); opts.reduceOp = dist.ReduceOp.SUM
out = {}
for name, call in (("dist.all_reduce", lambda: dist.all_reduce(t, async_op=True)),
                   ("ProcessGroup.allreduce", lambda: pg.allreduce([t], opts))):
    for rep in range(2):
        works = [call() for _ in range(20)]
        for w in works: w.wait()
        torch.cuda.synchronize(); dist.barrier()
        n = 200
        t0 = time.perf_counter()
        works = [call() for _ in range(n)]
        t1 = time.perf_counter()
        for w in works: w.wait()
        torch.cuda.synchronize()
        out[name] = round((t1 - t0) / n * 1e6, 1)
if rank == 0:
    print(json.dumps(out), flush=True)
dist.destroy_process_group()
"""


def run(extra_env: dict) -> dict:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    procs = []
    for rank in range(2):
        env = {
            **os.environ,
            **extra_env,
            "RANK": str(rank),
            "WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", CHILD], env=env, stdout=subprocess.PIPE, text=True
            )
        )
    outs = [p.communicate(timeout=300)[0] for p in procs]
    return json.loads(outs[0].strip().splitlines()[-1])


if __name__ == "__main__":
    for label, env in (
        ("torch defaults", {}),
        ("TORCH_NCCL_TRACE_BUFFER_SIZE=0", {"TORCH_NCCL_TRACE_BUFFER_SIZE": "0"}),
        ("torch defaults (again)", {}),
    ):
        t0 = time.perf_counter()
        print(label, run(env), f"({time.perf_counter() - t0:.0f} s)", flush=True)
