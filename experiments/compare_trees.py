"""Step time of several source trees (commits) on the same GPUs, interleaved: each round runs
``scripts/gpu_bench.py --what step`` of every tree, in alternating order, and the table gives per
tree and variant the median step over rounds and the median (min-max) of the same-run ratios to a
peer (bucketed, overlapped, naive: torch-ddp; zero1, zero2: torch-zero; fsdp: torch-fsdp).

    PYTHONPATH=src python experiments/compare_trees.py --trees now=.,old=.trees/9e54654 \\
        --sizes xl --variants naive,overlapped,bucketed,torch-ddp --rounds 3

A tree is a folder with ``src/`` and ``scripts/gpu_bench.py`` (``git archive COMMIT src scripts``).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

PEERS = {
    "naive": "torch-ddp",
    "flat": "torch-ddp",
    "overlapped": "torch-ddp",
    "bucketed": "torch-ddp",
    "zero1": "torch-zero",
    "zero2": "torch-zero",
    "sharded": "torch-zero",
    "fsdp": "torch-fsdp",
    "torch-zero": "torch-ddp",
}


def run_tree(path: str, args) -> dict:
    out = tempfile.mkdtemp()
    pythonpath = os.pathsep.join([os.path.join(path, "src"), *args.pythonpath])
    env = dict(os.environ, PYTHONPATH=pythonpath, OUT=out, PYTHONUNBUFFERED="1")
    cmd = [sys.executable, os.path.join(path, "scripts", "gpu_bench.py"), "--what", "step"]
    cmd += ["--sizes", args.sizes, "--variants", args.variants]
    cmd += ["--steps", str(args.steps), "--warmup", str(args.warmup)]
    if args.smoke:
        cmd.append("--smoke")
    t = time.monotonic()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    if p.returncode != 0:
        print(p.stdout[-3000:], p.stderr[-3000:], flush=True)
        return {}
    with open(os.path.join(out, "gpu_bench.json")) as f:
        record = json.load(f)
    res = {}
    for r in record["step"]:
        if "error" in r:
            print(f"  {path}: {r['spec']['variant']}: {r['error'][:200]}", flush=True)
            continue
        d = r["spec"]["model"]["d_model"]
        res[(d, r["spec"]["variant"])] = r
    print(f"  {path}: {len(res)} measurements in {time.monotonic() - t:.0f} s", flush=True)
    return res


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--trees", required=True, help="name=path,...")
    p.add_argument("--sizes", default="xl")
    p.add_argument("--variants", default="naive,overlapped,bucketed,torch-ddp")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--timeout", type=float, default=500)
    p.add_argument("--json", default=None)
    p.add_argument(
        "--pythonpath",
        default="",
        type=lambda s: [os.path.abspath(x) for x in s.split(",") if x],
        help="folders for import-path variants (module:Class), comma separated; an import-path "
        "variant whose name has 'zero' is put against torch-zero, else torch-ddp",
    )
    p.add_argument("--smoke", action="store_true", help="gpu_bench --smoke: CPU, code paths only")
    args = p.parse_args()
    trees = [t.split("=", 1) for t in args.trees.split(",")]
    runs: dict[str, list[dict]] = {name: [] for name, _ in trees}
    for r in range(args.rounds):
        order = trees if r % 2 == 0 else trees[::-1]
        for name, path in order:
            print(f"round {r + 1}: {name}", flush=True)
            runs[name].append(run_tree(path, args))
    rows = []
    for name, _ in trees:
        keys = sorted({k for res in runs[name] for k in res})
        for d, v in keys:
            ms = [res[(d, v)]["median"] * 1e3 for res in runs[name] if (d, v) in res]
            peer = PEERS.get(v)
            if ":" in v:  # an import-path variant
                peer = "torch-zero" if "zero" in v.lower() else "torch-ddp"
            ratios = [
                res[(d, v)]["median"] / res[(d, peer)]["median"]
                for res in runs[name]
                if (d, v) in res and (d, peer) in res
            ]
            peaks = [
                res[(d, v)]["cuda_memory"].get("peak", 0) / 2**30
                for res in runs[name]
                if (d, v) in res
            ]
            rows.append(
                dict(
                    tree=name,
                    d_model=d,
                    variant=v,
                    ms=ms,
                    peer=peer,
                    ratios=ratios,
                    peak_gib=max(peaks) if peaks else None,
                )
            )
    print(
        "\n| tree | d_model | variant | step ms (per round) | / peer, median (min-max) | peak GiB |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for row in rows:
        rs = row["ratios"]
        ratio = (
            f"{statistics.median(rs):.3f} ({min(rs):.3f}-{max(rs):.3f}) vs {row['peer']}"
            if rs
            else "-"
        )
        ms = " / ".join(f"{m:.1f}" for m in row["ms"])
        peak = f"{row['peak_gib']:.2f}" if row["peak_gib"] else "-"
        print(f"| {row['tree']} | {row['d_model']} | {row['variant']} | {ms} | {ratio} | {peak} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
