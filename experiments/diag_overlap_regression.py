"""Why did the overlapped and bucketed DDPs lose against torch DDP on 2 GPUs between 9e54654 and
273d727? Interleaved rounds of one xl step loop per variant, each variant toggling one suspect:

* ``-old``: the 9e54654 sources of the variant, read from ``--old-tree`` (``git archive 9e54654
  src | tar -x -C .trees/9e54654``);
* ``+counter``: the rank's collective counter installed and active, as in a ``World`` rank:
  with ``--old-counter TREE`` the one of that tree (273d727's rewrote its status file on every
  collective and ``Work.wait``), else today's;
* ``-prehook``: today's variant with its round-boundary tensor hooks removed.

PYTHONPATH=src python experiments/diag_overlap_regression.py --size xl --rounds 3 \
    --old-tree .trees/9e54654 --old-counter .trees/273d727
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

VARIANTS = (
    "torch-ddp",
    "bucketed",
    "bucketed+counter",
    "bucketed-prehook",
    "bucketed-old",
    "bucketed-old+counter",
    "overlapped",
    "overlapped+counter",
    "overlapped-prehook",
    "overlapped-old",
    "zero1",
    "zero1+counter",
    "torch-zero",
    "torch-zero+counter",
)


def _load(name: str, path: str, rewrite=lambda text: text):
    """The module at ``path`` under ``name``, its source passed through ``rewrite`` first."""
    import types

    module = types.ModuleType(name)
    module.__file__ = path
    sys.modules[name] = module
    with open(path) as f:
        exec(compile(rewrite(f.read()), path, "exec"), module.__dict__)
    return module


def _old_ddp(tree: str) -> dict:
    """The DDP sources of ``tree`` (an archived commit) as modules of a package of their own,
    their ``paracheck.ddp`` imports pointed at it."""
    if "ddp_old" not in sys.modules:
        import types

        sys.modules["ddp_old"] = types.ModuleType("ddp_old")
        for name in ("_common", "plan", "overlapped", "bucketed"):
            _load(
                f"ddp_old.{name}",
                os.path.join(tree, "src/paracheck/ddp", f"{name}.py"),
                lambda text: text.replace("from paracheck.ddp.", "from ddp_old."),
            )
    return {n: sys.modules[f"ddp_old.{n}"] for n in ("overlapped", "bucketed")}


def build(name, model, rank, fused, old_tree):
    from paracheck.ddp import BucketedDDP, OverlappedDDP

    base = name.split("+")[0]
    if base == "torch-ddp" or base == "torch-zero":
        from torch.nn.parallel import DistributedDataParallel

        ddp = DistributedDataParallel(
            model,
            device_ids=None if model.lm_head.weight.device.type == "cpu" else [rank],
            bucket_cap_mb=25,
        )
        if base == "torch-zero":
            from torch.distributed.optim import ZeroRedundancyOptimizer

            opt = ZeroRedundancyOptimizer(
                ddp.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-4, fused=fused
            )
        else:
            opt = torch.optim.AdamW(ddp.parameters(), lr=1e-4, fused=fused)
        return ddp, (lambda: None), opt
    if base == "zero1":
        from paracheck.zero import Zero1

        z = Zero1(model, torch.optim.AdamW, bucket_size_mb=25.0, lr=1e-4, fused=fused)
        return z, z.finish_gradient_synchronization, z
    if base.endswith("-old"):
        old = _old_ddp(old_tree)
        cls = (
            old["bucketed"].BucketedDDP
            if base.startswith("bucketed")
            else old["overlapped"].OverlappedDDP
        )
    else:
        cls = BucketedDDP if base.startswith("bucketed") else OverlappedDDP
    ddp = cls(model, 25.0) if cls.__name__ == "BucketedDDP" else cls(model)
    if base.endswith("-prehook"):
        for h in ddp._pre_hooks:
            h.remove()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused)
    return ddp, ddp.finish_gradient_synchronization, opt


def rank_main(rank, world, args, port, tmp):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    cpu = args.cpu
    if not cpu:
        torch.cuda.set_device(rank)
    dist.init_process_group("gloo" if cpu else "nccl", rank=rank, world_size=world)
    dev = "cpu" if cpu else "cuda"
    sync = (lambda: None) if cpu else torch.cuda.synchronize
    from paracheck.workloads import LMSpec, TransformerLM

    if args.old_counter:  # another commit's counter (273d727's wrote on every call)
        _collectives = _load(
            "collectives_old", os.path.join(args.old_counter, "src/paracheck/world/_collectives.py")
        )
    else:
        from paracheck.world import _collectives

    counter = _collectives.CollectiveCounter(os.path.join(tmp, f"rank{rank}.status"))
    _collectives.install(counter)
    if hasattr(counter, "flush"):  # the rank's watchdog thread, as in a World rank
        import threading

        def flusher():
            while True:
                time.sleep(0.05)
                counter.flush()

        threading.Thread(target=flusher, daemon=True).start()
    torch.backends.cuda.matmul.allow_tf32 = True
    x = torch.randint(100 if cpu else 10000, (4, 16 if cpu else 256), device=dev)
    y = torch.randint(100 if cpu else 10000, (4, 16 if cpu else 256), device=dev)
    names = args.variants.split(",")
    times = {n: [] for n in names}
    for r in range(args.rounds):
        order = names if r % 2 == 0 else names[::-1]
        for name in order:
            torch.manual_seed(0)
            with torch.device(dev):
                model = TransformerLM(
                    LMSpec.size(args.size)
                    if not cpu
                    else LMSpec(
                        d_model=64,
                        d_ff=128,
                        num_layers=2,
                        num_heads=2,
                        vocab_size=100,
                        context_length=16,
                    )
                )
            wrapper, finish, opt = build(name, model, rank, not cpu, args.old_tree)
            if "+counter" in name:
                counter.begin(job=name)
            step_ms = []
            for i in range(args.warmup + args.steps):
                dist.barrier()
                sync()
                t = time.perf_counter()
                opt.zero_grad(set_to_none=True)
                logits = wrapper(x)
                loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1))
                loss.backward()
                del logits, loss
                finish()
                opt.step()
                sync()
                if i >= args.warmup:
                    step_ms.append((time.perf_counter() - t) * 1e3)
            if "+counter" in name:
                counter.end("done")
            med = torch.tensor(statistics.median(step_ms), device=dev)
            dist.all_reduce(med, op=dist.ReduceOp.MAX)
            times[name].append(med.item())
            del wrapper, finish, opt, model
            if not cpu:
                torch.cuda.empty_cache()
    if rank == 0:
        base = times.get("torch-ddp")
        print(
            f"\n{args.size}, W={world}, median step ms per round (slowest rank); ratio to torch-ddp of the same round"
        )
        for n in names:
            ratios = [t / b for t, b in zip(times[n], base)] if base else []
            rs = " ".join(f"{v:.3f}" for v in ratios)
            print(
                f"{n:24s} " + " ".join(f"{v:7.1f}" for v in times[n]) + (f"   x {rs}" if rs else "")
            )
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--size", default="xl")
    p.add_argument("--cpu", action="store_true", help="gloo, a tiny LM: code paths only")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--old-tree", default=".trees/9e54654", help="the -old variants' commit")
    p.add_argument("--old-counter", default=None, help="a commit's tree whose counter to use")
    args = p.parse_args()
    world = 2 if args.cpu else torch.cuda.device_count()
    tmp = tempfile.mkdtemp()
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(rank_main, args=(world, args, port, tmp), nprocs=world)


if __name__ == "__main__":
    main()
