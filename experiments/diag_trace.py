"""Is a DDP variant's step GPU-bound or host-bound? Unsynchronised step time, host time per step,
and from a profiler trace of rank 0 the compute stream's busy and idle time and NCCL's busy time.

A step that the host takes longer to enqueue than the GPU takes to run is host-bound: the compute
stream then idles between kernels while Python runs (hooks run on autograd's thread, between the
launches of backward kernels).

    PYTHONPATH=src python experiments/diag_trace.py --variants naive,bucketed,torch-ddp --size xl
"""

import argparse
import json
import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F


def _union(intervals):
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def trace_summary(prof) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        events = json.load(open(f.name))["traceEvents"]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    nccl = [e for e in kernels if "nccl" in e["name"].lower()]
    other = [e for e in kernels if "nccl" not in e["name"].lower()]
    span = (max(e["ts"] + e["dur"] for e in kernels) - min(e["ts"] for e in kernels)) / 1e3
    busy = _union([(e["ts"], e["ts"] + e["dur"]) for e in other]) / 1e3
    comm = _union([(e["ts"], e["ts"] + e["dur"]) for e in nccl]) / 1e3
    by_name: dict[str, float] = {}
    for e in other:
        short = e["name"].split("(")[0].split("<")[0][:50]
        by_name[short] = by_name.get(short, 0.0) + e["dur"] / 1e3
    top = sorted(by_name.items(), key=lambda kv: -kv[1])[:6]
    return {
        "span_ms": round(span, 1),
        "compute_busy_ms": round(busy, 1),
        "compute_idle_ms": round(span - busy, 1),
        "nccl_busy_ms": round(comm, 1),
        "kernels": len(other),
        "nccl_kernels": len(nccl),
        "top_compute_ms": [(n, round(t, 1)) for n, t in top],
    }


def instrument(ddp, step, steps=3) -> dict:
    """Inclusive host ms per step spent in each of the wrapper's methods (and in dist calls)."""
    import collections
    import functools

    totals, counts = collections.Counter(), collections.Counter()

    def wrap(owner, name, label):
        f = getattr(owner, name)

        @functools.wraps(f)
        def timed(*a, **k):
            t0 = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                totals[label] += time.perf_counter() - t0
                counts[label] += 1

        setattr(owner, name, timed)
        return f

    saved = []
    for name in (
        "_grad_ready",
        "_adopt",
        "_launch",
        "_reduce",
        "_wait",
        "_settle_absent",
        "finish_gradient_synchronization",
    ):
        if hasattr(ddp, name):
            saved.append((ddp, name, wrap(ddp, name, name)))
    for name in ("all_reduce",):
        saved.append((dist, name, wrap(dist, name, f"dist.{name}")))
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    total = time.perf_counter() - t0
    torch.cuda.synchronize()
    for owner, name, f in saved:
        if owner is ddp:
            delattr(ddp, name)
        else:
            setattr(owner, name, f)
    out = {k: [round(1e3 * v / steps, 2), counts[k] // steps] for k, v in totals.items()}
    out["whole step (host)"] = round(1e3 * total / steps, 2)
    return out


def rank_main(rank, world, args, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group(
        "nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank)
    )
    from paracheck.check.targets import load_object, resolve_target
    from paracheck.workloads import LMSpec, TransformerLM

    torch.backends.cuda.matmul.allow_tf32 = True
    for spec in args.variants.split(","):
        name, option = (
            (spec[: -len(":keep-grads")], "keep-grads")
            if spec.endswith(":keep-grads")
            else (spec, "")
        )
        torch.manual_seed(0)
        with torch.device("cuda"):
            model = TransformerLM(LMSpec.size(args.size))
        t = resolve_target(name)
        cls = load_object(t.path)
        ddp = cls(model, args.bucket_mb) if t.takes_bucket else cls(model)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
        set_to_none = option != "keep-grads"
        x = torch.randint(10000, (4, 256), device="cuda")
        y = torch.randint(10000, (4, 256), device="cuda")

        def step():
            opt.zero_grad(set_to_none=set_to_none)
            loss = F.cross_entropy(ddp(x).flatten(0, 1), y.flatten())
            loss.backward()
            ddp.finish_gradient_synchronization()
            opt.step()

        for _ in range(3):
            step()
        torch.cuda.synchronize()
        if args.instrument:  # every rank runs the same steps (collectives must match)
            timed = instrument(ddp, step)
            if rank == 0:
                print(
                    json.dumps({"variant": spec, "host_ms_per_step_inclusive": timed}), flush=True
                )
        host, walls = [], []
        for _ in range(args.steps):
            t0 = time.perf_counter()
            step()
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            host.append(t1 - t0)
            walls.append(time.perf_counter() - t0)
        # Unsynchronised: the host may run ahead by up to the queue's depth.
        dist.barrier()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(args.steps):
            step()
        torch.cuda.synchronize()
        unsynced = (time.perf_counter() - t0) / args.steps
        prof = None
        if rank == 0:
            prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
            prof.__enter__()
        step()
        torch.cuda.synchronize()
        if rank == 0:
            prof.__exit__(None, None, None)
            out = {
                "variant": spec,
                "unsynced_step_ms": round(1e3 * unsynced, 1),
                "host_enqueue_ms": round(1e3 * statistics.median(host), 1),
                "synced_step_ms": round(1e3 * statistics.median(walls), 1),
                **trace_summary(prof),
            }
            print(json.dumps(out), flush=True)
        ddp = opt = model = None  # free before the next variant
        torch.cuda.empty_cache()
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--variants",
        default="naive,bucketed,torch-ddp",
        help="target names; 'name:keep-grads' zeroes with set_to_none=False",
    )
    ap.add_argument("--size", default="xl")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--bucket-mb", type=float, default=25.0)
    ap.add_argument(
        "--instrument",
        action="store_true",
        help="time the wrapper's own methods on the host (rank 0)",
    )
    args = ap.parse_args()
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    mp.spawn(rank_main, args=(2, args, port), nprocs=2)
