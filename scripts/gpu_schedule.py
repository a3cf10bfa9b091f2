"""The exact communication schedule of a step on one GPU against the same step on the CPU.

Runs every built-in DDP variant (and torch DDP) for one step on W gloo ranks twice: with CPU
tensors and with CUDA tensors on GPU 0 (gloo moves CUDA tensors, so one GPU runs W ranks), and
compares the schedules event by event (Note [Communication schedule of a step] in
``paracheck.accounting.schedule``). On CUDA it also counts what
``torch.cuda.set_sync_debug_mode("warn")`` reports and compares it with the device syncs counted
(Note [Device syncs counted on the CPU]). Exit 0 when every schedule matches, 1 otherwise.

    python scripts/gpu_schedule.py [--variants naive,flat,overlapped,bucketed,torch-ddp]
        [--world-size 2] [--bucket-mb 0.001] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import sys

VARIANTS = ("naive", "flat", "overlapped", "bucketed", "torch-ddp")


def compare(cpu: dict, gpu: dict) -> list[str]:
    """What differs between two ranks' ``rank_account`` results' schedules (empty: the same)."""
    a, b = cpu["schedule"], gpu["schedule"]
    out = []
    for k in ("grad_bytes", "grad_elems", "tokens"):
        if a[k] != b[k]:
            out.append(f"{k}: cpu {a[k]}, cuda {b[k]}")
    # A collective launched from C++ on CUDA's autograd thread (torch DDP's reducer) has no
    # Python caller there: "?" matches whatever the CPU run named.
    ea = a["events"]
    eb = [
        dict(y, where=x["where"]) if y.get("where") == "?" else y for x, y in zip(ea, b["events"])
    ] + b["events"][len(ea) :]
    if len(ea) != len(eb):
        out.append(f"{len(ea)} events on the cpu, {len(eb)} on cuda")
    for i, (x, y) in enumerate(zip(ea, eb)):
        if x != y:
            out.append(f"event {i}: cpu {x}, cuda {y}")
            break
    if gpu.get("cuda_sync_warnings", -1) != gpu["device_syncs"]:
        out.append(
            f"set_sync_debug_mode warned {gpu['cuda_sync_warnings']} times, "
            f"{gpu['device_syncs']} device syncs counted: {gpu.get('cuda_sync_messages')}"
        )
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--bucket-mb", type=float, default=0.001)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    import torch

    from paracheck.bench.step import StepSpec
    from paracheck.workloads.lm import LMSpec
    from paracheck.world import World

    if not torch.cuda.is_available():
        print("gpu_schedule: no CUDA device", file=sys.stderr)
        return 2
    tiny = LMSpec(vocab_size=16, context_length=4, d_model=8, d_ff=16, num_layers=1, num_heads=2)
    record, failed = {}, False
    with World(args.world_size, backend="gloo", timeout=300) as world:
        for v in args.variants.split(","):
            spec = StepSpec(v, tiny, world_size=args.world_size, batch=2, bucket_mb=args.bucket_mb)
            runs = {}
            for device in ("cpu", "cuda"):
                runs[device] = world.run(
                    "paracheck.bench.step:rank_account",
                    {**spec.to_dict(), "device": device},
                    world_size=args.world_size,
                )
            diffs = [
                d for r in range(args.world_size) for d in compare(runs["cpu"][r], runs["cuda"][r])
            ]
            record[v] = {"diffs": diffs, **{d: runs[d][0] for d in runs}}
            g = runs["cuda"][0]
            print(
                f"{v}: {'SAME' if not diffs else 'DIFFERENT'}: {len(g['schedule']['events'])} events, "
                f"{g['device_syncs']} device syncs, set_sync_debug_mode {g['cuda_sync_warnings']}"
            )
            for d in diffs[:5]:
                print(f"  {d}")
            failed |= bool(diffs)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
