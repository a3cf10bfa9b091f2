"""The DDP family on GPUs: every variant equals the oracle over NCCL, every DDP mutant is killed.

Run on a machine with >= 2 CUDA GPUs (torch >= 2.4; no install needed)::

    PYTHONPATH=src python scripts/gpu_ddp_check.py [--max-examples 40] [--dtypes float64,float32]

Targets naive, flat, overlapped, bucketed and torch-ddp are checked at world sizes 1 and 2 in each
dtype (the oracle always runs in float64 on the CPU; float32 uses the tolerance table of
``paracheck.oracle.tolerance``); every DDP mutant that does not hang is checked in float32 and
must be killed. Writes ``gpu_ddp_check.json`` to ``$OUT`` when set. Prints a markdown table last.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

TARGETS = ["naive", "flat", "overlapped", "bucketed", "torch-ddp"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-examples", type=int, default=40)
    ap.add_argument("--dtypes", default="float64,float32")
    ap.add_argument("--targets", default=",".join(TARGETS))
    ap.add_argument("--no-mutants", action="store_true")
    ap.add_argument("--timeout", type=float, default=60.0)
    args = ap.parse_args(argv)

    import torch

    from paracheck.check.property import check_target
    from paracheck.check.targets import Target, resolve_target
    from paracheck.mutants import MUTANTS
    from paracheck.world import World

    n_gpu = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if n_gpu < 2:
        print(f"needs 2 CUDA devices, found {n_gpu}", file=sys.stderr)
        return 2
    rows = []
    with World(2, backend="nccl", timeout=args.timeout) as world:
        for dtype in args.dtypes.split(","):
            for name in args.targets.split(","):
                t0 = time.monotonic()
                r = check_target(
                    resolve_target(name),
                    world,
                    world_sizes=(1, 2),
                    max_examples=args.max_examples,
                    seed=0,
                    dtype=dtype,
                )
                rows.append(
                    {
                        "what": name,
                        "role": "target",
                        "dtype": dtype,
                        "ok": r.passed,
                        "verdict": "pass" if r.passed else "FAIL",
                        "examples": r.examples,
                        "seconds": round(time.monotonic() - t0, 1),
                        "worst_ratio": r.worst_ratio,
                        "detail": "" if r.passed else r.failure.describe().splitlines()[0],
                        "case": None if r.passed else r.failure.case.to_json(),
                    }
                )
                print(rows[-1], flush=True)
        if not args.no_mutants:
            for m in MUTANTS.values():
                if m.kind != "ddp" or m.expect == "hang":
                    continue
                t0 = time.monotonic()
                target = Target(m.name, m.path, m.kind, resolve_target(m.path).takes_bucket)
                r = check_target(
                    target,
                    world,
                    world_sizes=(1, 2),
                    max_examples=args.max_examples,
                    seed=0,
                    dtype="float32",
                )
                rows.append(
                    {
                        "what": m.name,
                        "role": "mutant",
                        "dtype": "float32",
                        "ok": not r.passed,
                        "verdict": "killed" if not r.passed else "SURVIVED",
                        "examples": r.examples,
                        "seconds": round(time.monotonic() - t0, 1),
                        "worst_ratio": r.worst_ratio,
                        "detail": "" if r.passed else r.failure.describe().splitlines()[0],
                        "case": None,
                    }
                )
                print(rows[-1], flush=True)
    out = os.environ.get("OUT")
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "gpu_ddp_check.json"), "w") as f:
            json.dump(
                {"torch": torch.__version__, "device": torch.cuda.get_device_name(0), "rows": rows},
                f,
                indent=1,
            )
    print(
        f"\n{torch.cuda.get_device_name(0)} x2, torch {torch.__version__}, NCCL, world sizes 1,2, "
        f"{args.max_examples} examples, ci seed\n"
    )
    print("| target / mutant | dtype | verdict | examples | seconds | worst rel. error |")
    print("| --- | --- | --- | ---: | ---: | ---: |")
    for r in rows:
        print(
            f"| {r['what']} | {r['dtype']} | {r['verdict']} | {r['examples']} | {r['seconds']} | "
            f"{r['worst_ratio']:.1e} |"
        )
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
