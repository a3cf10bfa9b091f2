"""The nightly false-failure count: every built-in design checked on many generated cases, several
checks at once, and a table of what each one ran and found.

    python scripts/nightly.py [--precision mixed] [--per-target 1250] [--jobs 8]
        [--targets naive,flat,...] [--properties +repeatability] [--json out.json]

Each design is one ``paracheck check NAME --precision P --max-examples N --seed S --no-database``
(gloo, world sizes 1,2,3,4, a seeded search rather than the derandomised ci sequence, so any
failure replays with its row's seed), run as a process of its own, ``--jobs`` at a time; a
correct design must pass every one. Prints one row per
design (cases run, verdict, seconds, worst relative error, the failing properties) and the totals,
and exits 1 if any design failed. The default is the built-ins that take every precision (the loop
references compute in their parameters' dtype: ``--precision bf16`` or ``fp32`` checks them).
Needs about 4 ranks' processes per job: on a machine of C cores, ``--jobs`` about C / 2.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

WRAPPERS = "naive,flat,overlapped,bucketed,torch-ddp,sharded,zero1,torch-zero,fsdp"


def _one(job: tuple[int, str], args, out_dir: str) -> dict:
    index, name = job
    seed = args.seed + index
    path = os.path.join(out_dir, f"{index}-{name.replace(os.sep, '_').replace(':', '_')}.json")
    cmd = [
        sys.executable,
        "-m",
        "paracheck.cli",
        "check",
        name,
        "--precision",
        args.precision,
        "--max-examples",
        str(args.per_target),
        "--seed",
        str(seed),
        "--no-database",
        "--world-sizes",
        args.world_sizes,
        "--json",
        path,
        "--budget",
        "0",  # every row of the verdict table, however long it takes
    ]
    if args.properties:
        cmd += ["--properties", args.properties]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.monotonic() - t0
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        verdict = data["targets"][0]
    except (OSError, ValueError, KeyError, IndexError):
        verdict = {"passed": False, "cases_run": 0, "failed_properties": ["no verdict"]}
    failures = [
        {
            "property": f.get("property"),
            "detail": f.get("detail"),
            "replay": f.get("replay"),
            "case": f.get("case"),
        }
        for f in verdict.get("failures", [])
    ]
    return {
        "target": name,
        "seed": seed,
        "failures": failures,
        "passed": bool(verdict.get("passed")) and proc.returncode == 0,
        "cases": verdict.get("cases_run", 0),
        "seconds": seconds,
        "worst": verdict.get("worst_relative_error", float("nan")),
        "failed": verdict.get("failed_properties", []),
        "exit": proc.returncode,
        "stderr": proc.stderr[-2000:] if proc.returncode not in (0, 1) else "",
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--precision", default="mixed", choices=["fp64", "fp32", "bf16", "fp16", "mixed"]
    )
    p.add_argument("--per-target", type=int, default=1250, help="cases per design (default 1250)")
    p.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    p.add_argument("--targets", default=WRAPPERS, help=f"comma-separated (default {WRAPPERS})")
    p.add_argument("--world-sizes", default="1,2,3,4")
    p.add_argument("--properties", default=None, help="as paracheck check --properties")
    p.add_argument("--json", default=None, help="write the rows as JSON to this path")
    p.add_argument(
        "--seed",
        type=int,
        default=None,
        help="the first check's Hypothesis seed, the next one's + 1, ... (default: drawn and "
        "printed): a failure is replayed with its row's seed",
    )
    p.add_argument(
        "--repeat", type=int, default=1, help="run each design this many times, seeds apart"
    )
    args = p.parse_args(argv)
    if args.per_target < 1:
        p.error(f"--per-target={args.per_target} must be >= 1")
    if args.jobs < 1:
        p.error(f"--jobs={args.jobs} must be >= 1")
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1, 2**31)
    names = [n.strip() for n in args.targets.split(",") if n.strip()] * args.repeat
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as out_dir, ThreadPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(lambda job: _one(job, args, out_dir), enumerate(names)))
    wall = time.monotonic() - t0
    print(
        f"{'target':12} {'seed':>11} {'verdict':8} {'cases':>6} {'seconds':>8} {'worst':>9}  failed"
    )
    for r in rows:
        print(
            f"{r['target']:12} {r['seed']:>11} {'pass' if r['passed'] else 'FAIL':8} "
            f"{r['cases']:>6} {r['seconds']:>8.1f} {r['worst']:>9.1e}  {','.join(r['failed'])}"
        )
        for f in r["failures"]:
            print(f"    {f['property']}: {f['detail']}\n    replay: {f['replay']}")
        if r["stderr"]:
            print(r["stderr"], file=sys.stderr)
    total = sum(r["cases"] for r in rows)
    failed = [r["target"] for r in rows if not r["passed"]]
    print(
        f"\n{total} cases, precision {args.precision}, {len(rows)} designs, {args.jobs} at a time, "
        f"{wall:.0f} s wall on {os.cpu_count()} cores; failing designs: {failed or 'none'}"
    )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"rows": rows, "wall_s": wall, "precision": args.precision}, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
