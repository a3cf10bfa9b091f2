"""The GPU tier's measurements, run directly (no asv): 2 GPUs, NCCL.

* step time (median of 8 steps after 2 warm-up steps, slowest rank) and CUDA peak memory at
  init / before / after the optimizer step, of every variant next to torch DDP and torch DDP +
  ZeroRedundancyOptimizer, for the CS336 LM sizes small..xl (batch 4 x 256 tokens per GPU, fp32
  with TF32 matmuls, fused AdamW, 25 MB buckets); ``local`` is one GPU with no communication;
  each (size, variant) from a clean state: its memory is above what the ranks held when its job
  started, printed beside it with what the job left behind (both 0.00 when nothing leaks: Note
  [Measuring from a clean state] in ``paracheck.bench.step``);
* the bucket sweep (1, 10, 100, 1000 MB) of bucketed DDP and torch DDP on xl;
* NCCL all-reduce time and bus bandwidth, 1 MB .. 1 GB;
* the share of NCCL kernel time hidden under compute (profiler) on 'large'.

Tables are printed as each part finishes; the last printed table is the summary (step time per
size and the xl peak per variant). Everything is also written to $OUT (gpu_bench.json for
``paracheck report --from-json``, gpu_bench.md) when OUT is set. Needs torch >= 2.4 and
``PYTHONPATH=src``; about 4-6 minutes on 2 H200s.

    PYTHONPATH=src python scripts/gpu_bench.py
    PYTHONPATH=src python scripts/gpu_bench.py --sizes small,xl --variants bucketed,torch-ddp --what step,bucket
    PYTHONPATH=src python scripts/gpu_bench.py --sizes large,xl --what step \
        --variants local,torch-ddp,zero1,zero2,torch-zero,fsdp,torch-fsdp     # the memory table
    PYTHONPATH=src python scripts/gpu_bench.py --smoke        # CPU/gloo, tiny model: code paths only
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))


class _Tee(io.TextIOBase):
    def __init__(self, *streams):
        self.streams = streams

    def write(self, s):
        for st in self.streams:
            st.write(s)
            st.flush()
        return len(s)


def main(argv=None) -> int:
    from paracheck.bench import suites
    from paracheck.bench.machine import machine_info
    from paracheck.cli.bench import WHAT, run_bench

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--sizes",
        default=",".join(suites.GPU_SIZES),
        help="LM sizes (default small,medium,large,xl)",
    )
    p.add_argument(
        "--variants",
        default="",
        help="comma-separated (default: every available one, local included)",
    )
    p.add_argument(
        "--what", default="step,bucket,allreduce,overlap", help=f"subset of {','.join(WHAT)}"
    )
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--buckets", default=",".join(str(b) for b in suites.BUCKET_MB))
    p.add_argument("--bucket-model", default="xl")
    p.add_argument("--overlap-model", default="large")
    p.add_argument("--allreduce-mb", default=",".join(str(m) for m in suites.ALLREDUCE_MB_GPU))
    p.add_argument(
        "--exact", action="store_true", help="also the exact traffic/memory accounting (slower)"
    )
    p.add_argument(
        "--smoke",
        action="store_true",
        help="CPU + gloo, the tiny 'gate' model: checks the code paths",
    )
    args = p.parse_args(argv)

    import torch

    device = "cpu" if args.smoke else "cuda"
    if not args.smoke and torch.cuda.device_count() < args.world_size:
        print(
            f"gpu_bench: {torch.cuda.device_count()} CUDA device(s), --world-size={args.world_size} needs more"
        )
        return 2
    ns = argparse.Namespace(
        device=device,
        world_size=args.world_size,
        batch=4,
        steps=args.steps,
        warmup=args.warmup,
        bucket_mb=25.0,
        timeout=600.0,
        exact=args.exact,
        what=tuple(w for w in args.what.split(",") if w),
        sizes=("gate",) if args.smoke else tuple(s for s in args.sizes.split(",") if s),
        variants=tuple(v for v in args.variants.split(",") if v),
        buckets=tuple(float(b) for b in args.buckets.split(",") if b),
        bucket_model="gate" if args.smoke else args.bucket_model,
        overlap_model="gate" if args.smoke else args.overlap_model,
        allreduce_mb=(1.0, 10.0)
        if args.smoke
        else tuple(float(m) for m in args.allreduce_mb.split(",") if m),
        allreduce_world_sizes=(args.world_size,),
    )
    out = os.environ.get("OUT")
    log = io.StringIO()
    record = {
        "machine": machine_info(device),
        "argv": sys.argv[1:],
        "step": [],
        "bucket": [],
        "allreduce": [],
        "lm": [],
        "overlap": [],
    }
    t0 = time.monotonic()
    print(
        f"gpu_bench: torch {torch.__version__}, {record['machine'].get('gpu', device)} x{args.world_size}",
        flush=True,
    )
    from paracheck.world import World

    with contextlib.redirect_stdout(_Tee(sys.stdout, log)):
        if "lm" in ns.what:
            from paracheck.cli.bench import run_lm

            run_lm(ns, record)
        with World(
            args.world_size, backend="gloo" if args.smoke else "nccl", timeout=600.0
        ) as world:
            run_bench(ns, world, record)
    summary = _summary(record, ns.sizes)
    print(f"\n### summary ({time.monotonic() - t0:.0f} s)\n\n{summary}", flush=True)
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "gpu_bench.json"), "w") as f:
            json.dump(record, f, indent=1)
        with open(os.path.join(out, "gpu_bench.md"), "w") as f:
            f.write(log.getvalue() + "\n### summary\n\n" + summary + "\n")
    return 0


def _summary(record: dict, sizes) -> str:
    """Step time (ms) and peak memory (GiB) per variant and size."""
    by = {}
    for r in record["step"]:
        if "error" in r:
            continue
        m = r["spec"]["model"]
        size = next((s for s in sizes if _matches(s, m)), f"d{m['d_model']}")
        by.setdefault(r["spec"]["variant"], {})[size] = r
    if not by:
        return "(no step measurements)"
    header = ["variant"] + [f"{s} ms" for s in sizes] + [f"{s} peak GiB" for s in sizes]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    for v, row in by.items():
        cells = [f"{row[s]['median'] * 1e3:.1f}" if s in row else "-" for s in sizes]
        for s in sizes:
            peak = row.get(s, {}).get("cuda_memory", {}).get("peak")
            cells.append(f"{peak / 2**30:.2f}" if peak else "-")
        lines.append(f"| {v} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _matches(size: str, model: dict) -> bool:
    from dataclasses import asdict

    from paracheck.bench.suites import model_for

    try:
        return asdict(model_for(size)) == model
    except ValueError:
        return False


if __name__ == "__main__":
    sys.exit(main())
