"""Peak memory of optimizer-state sharding on the CS336 LM, measured against the analytic breakdown.

Two ranks spawned by this script for each design (``mp.spawn``, no torchrun; NCCL on GPUs, gloo on
CPU): every design is measured in fresh processes.
Designs, all with AdamW (fused on CUDA), fp32, 25 MB buckets:

* ``ddp``: paracheck ``BucketedDDP`` (gradients as bucket views, or where autograd put them for a
  parameter alone in its bucket) + AdamW, no sharding;
* ``sharded``: ``BucketedDDP`` + ``ShardedOptimizer`` (owner broadcast);
* ``zero1``: ``Zero1`` (reduce-scatter / shard step / all-gather);
* ``torch-ddp``: torch ``DistributedDataParallel`` + AdamW, no sharding;
* ``torch-zero``: torch DDP + ``ZeroRedundancyOptimizer(AdamW)``.

For each: build on the device, one warm-up step (creates the optimizer state), then one measured
step. Reported per rank, in GiB: the CUDA peak (``max_memory_allocated``) over construction
("init"), over forward + backward + gradient sync of the measured step ("before step", read
directly before ``step()``), and over the whole measured step ("after step", read directly after
``step()``); the memory allocated after the step; the analytic breakdown of
``paracheck.accounting.memory.training_memory`` (parameters, gradients, optimizer state,
communication buffers); "rest" = after-step peak minus the analytic total (activations, autograd
and optimizer temporaries, allocator slack). "state" compares the optimizer-state bytes the rank
holds (walking its optimizer's state) with the analytic value, exactly.

    PYTHONPATH=src python scripts/memory_xl.py                  # 2 GPUs, 'xl', batch 4, context 256
    PYTHONPATH=src python scripts/memory_xl.py --size small
    PYTHONPATH=src python scripts/memory_xl.py --size tiny --device cpu   # gloo smoke run, seconds

The markdown table is printed last; with ``$OUT`` set, it and a JSON of every number are written
there too.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

DESIGNS = ("ddp", "sharded", "zero1", "torch-ddp", "torch-zero")
GiB = 2**30
BUCKET_MB = 25.0


def _spec(args):
    from paracheck.workloads import LMSpec

    if args.size == "tiny":
        return LMSpec(
            vocab_size=512,
            context_length=args.context,
            d_model=64,
            d_ff=128,
            num_layers=2,
            num_heads=4,
        )
    return LMSpec.size(args.size, context_length=args.context)


def _build(design, spec, device, fused):
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel

    from paracheck.ddp.bucketed import BucketedDDP
    from paracheck.workloads import TransformerLM
    from paracheck.zero import ShardedOptimizer, Zero1

    torch.manual_seed(0)
    with torch.device(device):
        model = TransformerLM(spec)
    params = list(model.parameters())
    kw = {"lr": 1e-4, "weight_decay": 0.01, **({"fused": True} if fused else {})}
    adamw = torch.optim.AdamW
    ids = [device.index] if device.type == "cuda" else None
    if design == "ddp":
        wrapper = BucketedDDP(model, BUCKET_MB)
        return wrapper, adamw(params, **kw), lambda o: o.state
    if design == "sharded":
        wrapper = BucketedDDP(model, BUCKET_MB)
        return wrapper, ShardedOptimizer(params, adamw, **kw), lambda o: o.local_optimizer.state
    if design == "zero1":
        zero = Zero1(model, adamw, bucket_size_mb=BUCKET_MB, **kw)
        return zero, zero, lambda z: z.optimizer.local_optimizer.state
    wrapper = DistributedDataParallel(model, device_ids=ids, bucket_cap_mb=BUCKET_MB)
    if design == "torch-ddp":
        return wrapper, adamw(params, **kw), lambda o: o.state
    return wrapper, ZeroRedundancyOptimizer(params, adamw, **kw), lambda o: o.optim.state


def _step(wrapper, opt, x, y):
    logits = wrapper(x)
    F.cross_entropy(logits.flatten(0, 1), y.flatten()).backward()
    finish = getattr(wrapper, "finish_gradient_synchronization", None)
    if finish is not None:
        finish()


def _measure(design, spec, device, args) -> dict:
    from paracheck.accounting import measured_state_bytes

    cuda = device.type == "cuda"

    def peak():
        return torch.cuda.max_memory_allocated(device) if cuda else None

    def now():
        return torch.cuda.memory_allocated(device) if cuda else None

    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    base = now()
    wrapper, opt, local_state = _build(design, spec, device, args.fused and cuda)
    out = {"design": design, "base": base, "init_peak": peak(), "init_alloc": now()}
    g = torch.Generator().manual_seed(1 + dist.get_rank())
    tokens = torch.randint(
        0, spec.vocab_size, (args.batch, spec.context_length + 1), generator=g
    ).to(device)
    x, y = tokens[:, :-1], tokens[:, 1:]
    _step(wrapper, opt, x, y)  # warm-up: creates the optimizer state
    opt.step()
    opt.zero_grad(set_to_none=True)
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    _step(wrapper, opt, x, y)
    if cuda:
        torch.cuda.synchronize(device)
    out["before_peak"], out["before_alloc"] = peak(), now()
    opt.step()
    if cuda:
        torch.cuda.synchronize(device)
    out["after_peak"], out["after_alloc"] = peak(), now()
    out["step_s"] = time.perf_counter() - t0
    out["state_held"] = measured_state_bytes(local_state(opt))
    opt.zero_grad(set_to_none=True)
    del wrapper, opt
    return out


def _worker(rank, world_size, port, args, queue):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    if args.device == "cuda":
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        dist.init_process_group("nccl", rank=rank, world_size=world_size, device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
    import gc

    spec = _spec(args)
    rows = []
    try:
        for design in args.designs:
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
            rows.append(_measure(design, spec, device, args))
            dist.barrier()
        gathered = [None] * world_size
        dist.all_gather_object(gathered, rows)
        if rank == 0:
            queue.put(gathered)
        # Teardown in lockstep, with nothing left holding the group: a wrapper kept alive by a
        # reference cycle is otherwise destroyed at interpreter exit, with gloo's worker threads
        # still running, and one such rank died of SIGABRT ("terminate called without an active
        # exception") after its results were delivered.
        gc.collect()
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _analytic(design, spec, world_size, rank):
    from paracheck.accounting import state_model, training_memory
    from paracheck.workloads import TransformerLM

    with torch.device("meta"):
        model = TransformerLM(spec)
    numels = [p.numel() for p in model.parameters() if p.requires_grad]
    return training_memory(
        design,
        numels,
        4,
        world_size,
        rank=rank,
        model=state_model("adamw"),
        bucket_numel=int(BUCKET_MB * 2**20) // 4,
    )


def _table(gathered, spec, world_size) -> tuple[str, list[dict]]:
    largest = max(_analytic(m["design"], spec, world_size, 0).total for m in gathered[0])
    unit, scale = next(
        (u, v) for u, v in (("GiB", GiB), ("MiB", 2**20), ("KiB", 2**10), ("B", 1)) if largest >= v
    )

    def _gib(b):
        return "n/a" if b is None else f"{b / scale:.2f}"

    lines = [
        "| design | rank | init peak | before-step peak | after-step peak | allocated after step | "
        "params | grads | optimizer state | comm buffers | analytic total | rest | state held = analytic |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    records = []
    for k in range(len(gathered[0])):
        for rank, rows in enumerate(gathered):
            m = rows[k]
            a = _analytic(m["design"], spec, world_size, rank)
            base = m["base"] or 0
            rest = None if m["after_peak"] is None else m["after_peak"] - base - a.total
            exact = (
                "yes" if m["state_held"] == a.optimizer_state else f"NO ({m['state_held']} B held)"
            )
            sub = lambda v: None if v is None else v - base
            lines.append(
                f"| {m['design']} | {rank} | {_gib(sub(m['init_peak']))} | {_gib(sub(m['before_peak']))} | "
                f"{_gib(sub(m['after_peak']))} | {_gib(sub(m['after_alloc']))} | {_gib(a.params)} | {_gib(a.grads)} | "
                f"{_gib(a.optimizer_state)} | {_gib(a.comm)} | {_gib(a.total)} | {_gib(rest)} | {exact} |"
            )
            records.append(
                {
                    **m,
                    "rank": rank,
                    "analytic": {
                        "params": a.params,
                        "grads": a.grads,
                        "optimizer_state": a.optimizer_state,
                        "comm": a.comm,
                        "total": a.total,
                    },
                }
            )
    return "\n".join(lines), records, unit


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--size", default="xl", help="CS336 size (small, medium, large, xl, 2.7B) or 'tiny'"
    )
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument(
        "--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu"
    )
    p.add_argument(
        "--no-fused", dest="fused", action="store_false", help="AdamW without fused=True on CUDA"
    )
    p.add_argument(
        "--designs",
        default=",".join(DESIGNS),
        help=f"comma-separated subset of {','.join(DESIGNS)}",
    )
    args = p.parse_args(argv)
    args.designs = [d for d in args.designs.split(",") if d]
    for d in args.designs:
        if d not in DESIGNS:
            p.error(f"--designs: {d!r} is not one of {DESIGNS}")
    if args.device == "cuda" and torch.cuda.device_count() < args.world_size:
        p.error(
            f"--world-size {args.world_size} needs that many GPUs; {torch.cuda.device_count()} present"
        )
    spec = _spec(args)
    ctx = mp.get_context("spawn")
    t0 = time.monotonic()
    # Each design in fresh processes: measured one after another in the same processes, a design's
    # peaks were disturbed by what earlier designs left in the caching allocator and in NCCL (torch's
    # ZeroRedundancyOptimizer once read 17.13 GiB, less than the tensors it holds; alone, 28.1 GiB).
    gathered = [[] for _ in range(args.world_size)]
    designs = args.designs
    for design in designs:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        queue = ctx.SimpleQueue()
        args.designs = [design]
        mp.spawn(
            _worker, args=(args.world_size, port, args, queue), nprocs=args.world_size, join=True
        )
        for rank, rows in enumerate(queue.get()):
            gathered[rank].extend(rows)
    args.designs = designs
    table, records, unit = _table(gathered, spec, args.world_size)
    from paracheck.workloads import lm_parameter_count

    header = (
        f"LM '{args.size}' ({lm_parameter_count(spec):.4g} parameters), batch {args.batch}, context "
        f"{spec.context_length}, fp32, AdamW{' fused' if args.fused and args.device == 'cuda' else ''}, "
        f"{args.world_size} ranks on {args.device}, {BUCKET_MB:g} MB buckets; {unit} per rank; "
        f"{time.monotonic() - t0:.0f} s"
    )
    out = os.environ.get("OUT")
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "memory_xl.json"), "w") as f:
            json.dump({"header": header, "records": records}, f, indent=1)
        with open(os.path.join(out, "memory_xl.md"), "w") as f:
            f.write(header + "\n\n" + table + "\n")
    print(header)
    print()
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
