"""Where does a DDP variant's step time go on GPUs? Per-phase times and the top profiler ops.

PYTHONPATH=src python experiments/diag_phases.py --variants bucketed,torch-ddp --size large
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F


def rank_main(rank, world, args, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group(
        "nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank)
    )
    from paracheck.check.targets import load_object, resolve_target
    from paracheck.workloads import LMSpec, TransformerLM

    torch.backends.cuda.matmul.allow_tf32 = True
    for name in args.variants.split(","):
        torch.manual_seed(0)
        with torch.device("cuda"):
            model = TransformerLM(LMSpec.size(args.size))
        t = resolve_target(name)
        cls = load_object(t.path)
        if t.kind != "ddp":
            continue
        ddp = cls(model, 25.0) if t.takes_bucket else cls(model)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
        x = torch.randint(10000, (4, 256), device="cuda")
        y = torch.randint(10000, (4, 256), device="cuda")
        phases = {"fwd": [], "bwd": [], "finish": [], "step": []}

        def step(record):
            opt.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            loss = F.cross_entropy(ddp(x).flatten(0, 1), y.flatten())
            torch.cuda.synchronize()
            t1 = time.perf_counter()
            loss.backward()
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            ddp.finish_gradient_synchronization()
            torch.cuda.synchronize()
            t3 = time.perf_counter()
            opt.step()
            torch.cuda.synchronize()
            t4 = time.perf_counter()
            if record:
                for k, a, b in (
                    ("fwd", t0, t1),
                    ("bwd", t1, t2),
                    ("finish", t2, t3),
                    ("step", t3, t4),
                ):
                    phases[k].append(1000 * (b - a))

        for i in range(5):
            step(i >= 2)
        if rank == 0:
            print(
                name, {k: round(sorted(v)[len(v) // 2], 1) for k, v in phases.items()}, flush=True
            )
            with torch.profiler.profile(
                activities=[
                    torch.profiler.ProfilerActivity.CPU,
                    torch.profiler.ProfilerActivity.CUDA,
                ]
            ) as prof:
                step(False)
            print(
                prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12), flush=True
            )
            print(
                prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=8), flush=True
            )
        else:
            step(False)
        ddp = opt = model = None  # free before the next variant
        torch.cuda.empty_cache()
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", default="bucketed,torch-ddp")
    ap.add_argument("--size", default="large")
    args = ap.parse_args()
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    mp.spawn(rank_main, args=(2, args, port), nprocs=2)
