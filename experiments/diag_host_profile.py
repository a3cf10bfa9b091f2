"""Where a data-parallel step's host time goes, per variant, on W GPUs (NCCL, one process per GPU
by ``mp.spawn``, no World): the host time of each phase (forward enqueued, ``backward()``
returned, synchronisation finished, optimizer step returned) against the step's wall time, the
device syncs ``torch.cuda.set_sync_debug_mode("warn")`` reports in one step, and a cProfile of
one step on rank 0 (the functions with the most own time).

    PYTHONPATH=src python experiments/diag_host_profile.py --size xl \\
        --variants local,torch-ddp,bucketed,overlapped,zero1,torch-zero --rounds 3 --profile bucketed,zero1
"""

import argparse
import cProfile
import io
import os
import pstats
import socket
import statistics
import sys
import time
import warnings

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))


def build(name, model, rank, bucket_mb):
    from paracheck.ddp import BucketedDDP, OverlappedDDP

    if "@" in name:
        name, bucket_mb = name.split("@")[0], float(name.split("@")[1])
    if name == "local":
        return model, (lambda: None), torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    if name in ("torch-ddp", "torch-zero"):
        from torch.nn.parallel import DistributedDataParallel

        ddp = DistributedDataParallel(model, device_ids=[rank], bucket_cap_mb=bucket_mb)
        if name == "torch-zero":
            from torch.distributed.optim import ZeroRedundancyOptimizer

            opt = ZeroRedundancyOptimizer(
                ddp.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-4, fused=True
            )
        else:
            opt = torch.optim.AdamW(ddp.parameters(), lr=1e-4, fused=True)
        return ddp, (lambda: None), opt
    if name in ("zero1", "zero2", "zero1-nocoal"):
        from paracheck.zero import Zero1, Zero2

        cls = Zero2 if name == "zero2" else Zero1
        z = cls(model, torch.optim.AdamW, bucket_size_mb=bucket_mb, lr=1e-4, fused=True)
        if name == "zero1-nocoal":  # one all-gather launch per bucket
            z._coalesce_gathers = False
        return z, z.finish_gradient_synchronization, z
    ddp = BucketedDDP(model, bucket_mb) if name == "bucketed" else OverlappedDDP(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    return ddp, ddp.finish_gradient_synchronization, opt


def rank_main(rank, world, args, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group(
        "nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank)
    )
    from paracheck.workloads import LMSpec, TransformerLM

    torch.backends.cuda.matmul.allow_tf32 = True
    spec = LMSpec.size(args.size)
    x = torch.randint(spec.vocab_size, (4, 256), device="cuda")
    y = torch.randint(spec.vocab_size, (4, 256), device="cuda")
    names = args.variants.split(",")
    profile = set(filter(None, args.profile.split(",")))
    rows = {n: [] for n in names}
    for r in range(args.rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            torch.manual_seed(0)
            with torch.device("cuda"):
                model = TransformerLM(spec)
            wrapper, finish, opt = build(name, model, rank, args.bucket_mb)

            def step(marks):
                opt.zero_grad(set_to_none=True)
                logits = wrapper(x)
                loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
                marks.append(time.perf_counter())
                loss.backward()
                marks.append(time.perf_counter())
                finish()
                marks.append(time.perf_counter())
                opt.step()
                marks.append(time.perf_counter())

            for _ in range(args.warmup):
                step([])
            torch.cuda.synchronize()
            if r == 0:
                dist.barrier()
                torch.cuda.synchronize()
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    torch.cuda.set_sync_debug_mode("warn")
                    step([])
                    torch.cuda.set_sync_debug_mode(0)
                syncs = [str(w.message)[:80] for w in caught if "synchroniz" in str(w.message)]
                torch.cuda.synchronize()
                if rank == 0:
                    print(
                        f"[{name}] device syncs in one step: {len(syncs)} {syncs[:3]}", flush=True
                    )
                if name in profile and rank == 0:
                    prof = cProfile.Profile()
                    prof.enable()
                    step([])
                    torch.cuda.synchronize()
                    prof.disable()
                    s = io.StringIO()
                    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(22)
                    print(f"[{name}] cProfile, one step, rank 0\n" + s.getvalue(), flush=True)
                elif name in profile:
                    step([])
                    torch.cuda.synchronize()
            phases = []
            for _ in range(args.steps):
                dist.barrier()
                torch.cuda.synchronize()
                marks = [time.perf_counter()]
                step(marks)
                torch.cuda.synchronize()
                marks.append(time.perf_counter())
                phases.append([(b - a) * 1e3 for a, b in zip(marks, marks[1:])])
            med = [statistics.median(c) for c in zip(*phases)]
            wall = statistics.median(sum(p) for p in phases)
            t = torch.tensor([wall, *med], device="cuda")
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            rows[name].append(t.tolist())
            wrapper = finish = opt = model = step = None  # freed before the next variant
            torch.cuda.empty_cache()
    if rank == 0:
        print(
            f"\n{args.size}, W={world}, {args.bucket_mb} MB buckets; ms, medians of {args.steps} "
            "steps, slowest rank; host: forward | backward() | finish | opt.step | wait for GPU"
        )
        base = rows.get("torch-ddp")
        for n in names:
            for k, v in enumerate(rows[n]):
                ratio = f" x{v[0] / base[k][0]:.3f}" if base else ""
                print(
                    f"{n:12s} r{k} step {v[0]:7.1f}{ratio}  host "
                    + " | ".join(f"{z:6.1f}" for z in v[1:])
                )
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--size", default="xl")
    p.add_argument("--variants", default="local,torch-ddp,bucketed,overlapped,zero1,torch-zero")
    p.add_argument("--profile", default="bucketed,zero1")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--bucket-mb", type=float, default=25.0)
    args = p.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(
        rank_main, args=(torch.cuda.device_count(), args, port), nprocs=torch.cuda.device_count()
    )


if __name__ == "__main__" and not os.environ.get("VERIFY"):
    main()


def _verify_rank(rank, world, port):
    """Each built-in with launches on the launcher thread against launches in the hooks, on NCCL:
    gradients and parameters after three steps, bit for bit."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group(
        "nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank)
    )
    from paracheck.ddp import BucketedDDP, OverlappedDDP, _launch
    from paracheck.workloads import LMSpec, TransformerLM
    from paracheck.zero import Zero1, Zero2

    spec = LMSpec.size("small")
    if os.environ.get("VERIFY_DETERMINISTIC"):
        torch.use_deterministic_algorithms(True, warn_only=True)

    def train(kind, enabled):
        _launch.ENABLED = enabled
        torch.manual_seed(0)
        with torch.device("cuda"):
            model = TransformerLM(spec)
        if kind in ("zero1", "zero2"):
            w = (Zero1 if kind == "zero1" else Zero2)(
                model, torch.optim.AdamW, bucket_size_mb=25.0, lr=1e-3
            )
            opt = w
        else:
            w = BucketedDDP(model, 25.0) if kind == "bucketed" else OverlappedDDP(model)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        assert kind == "overlapped" or w._off_thread is enabled, (kind, w._off_thread)
        out = []
        for step in range(3):
            torch.manual_seed(10 * step + rank)
            x = torch.randint(spec.vocab_size, (4, 256), device="cuda")
            w(x).float().logsumexp(-1).mean().backward()
            w.finish_gradient_synchronization()
            if kind in ("zero1", "zero2"):
                out = [g for g in w.full_gradients() if g is not None]
            else:
                out = [p.grad.clone() for p in model.parameters() if p.grad is not None]
            opt.step()
            opt.zero_grad(set_to_none=True)
        if kind == "overlapped":
            assert w._off_thread is enabled, (kind, w._off_thread)
        return out + [p.detach().clone() for p in model.parameters()]

    def same(a, b):
        equal = len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))
        worst = max(((x - y).abs().max().item() for x, y in zip(a, b)), default=0.0)
        return f"{equal} ({worst:.3g})"

    kinds = os.environ.get("VERIFY_KINDS", "bucketed,overlapped,zero1,zero2").split(",")
    for kind in kinds:
        # Twice each, interleaved: the hooks against themselves say how deterministic one
        # configuration is here (attention's backward may sum in any order).
        h1, t1, h2, t2 = (train(kind, e) for e in (False, True, False, True))
        if rank == 0:
            print(
                f"verify {kind}: equal bit for bit (max |diff|): hooks/hooks {same(h1, h2)}, "
                f"thread/thread {same(t1, t2)}, hooks/thread {same(h1, t1)} {same(h2, t2)}",
                flush=True,
            )
    dist.destroy_process_group()


if __name__ == "__main__" and os.environ.get("VERIFY"):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_verify_rank, args=(torch.cuda.device_count(), port), nprocs=torch.cuda.device_count())
