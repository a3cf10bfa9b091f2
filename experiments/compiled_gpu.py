"""The compile row's cases on one GPU: each built-in DDP and torch DDP, compiled with aot_eager and
with the inductor (Triton kernels on CUDA), against the float64 oracle, on NCCL at world size 1.

Prints one line per (target, dtype, setting): the verdict, Dynamo's graphs and compile seconds
(rank 0's ``RankRecord.compiled``) and the case's wall seconds, and writes them as JSON lines.

    PYTHONPATH=src python experiments/compiled_gpu.py --json res.jsonl
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

import torch

from paracheck.cases import Case
from paracheck.check.run import run_case
from paracheck.check.targets import Target, resolve_target
from paracheck.world import World

# The pinned case of tests/property/test_compiled.py, at world size 1 (one GPU): MLP 5 -> 7 -> 3,
# two steps of two micro-steps under no_sync(), buckets of 0.0001 MB.
CASE = Case.from_json(
    """{"model": {"kind": "mlp", "in_features": 5, "widths": [7, 3], "bias": true, "frozen": [],
    "tied": false, "unused": "none", "buffer": false, "float32_layer": null}, "world_size": 1,
    "batch_sizes": [5], "steps": 2, "accumulation": 2, "no_sync": true, "optimizer": {"name":
    "sgd", "groups": [{"params": [], "lr": 0.01, "weight_decay": 0.0, "momentum": 0.0, "betas":
    [0.9, 0.99], "add_at_step": null}], "lr_decay": 1.0, "as_generator": false, "scheduler": null,
    "groups_as_generators": false}, "bucket_size_mb": 0.0001, "seed": 1, "rank_dependent_init":
    false, "set_to_none": true, "dtype": "float64"}"""
)
TARGETS = ("naive", "flat", "overlapped", "bucketed", "torch-ddp")
SETTINGS = ("aot_eager", "inductor", "inductor+optimize-ddp")


def _target(name: str) -> Target:
    """torch DDP as the tests' ``CompiledTorchDDP`` (the built-in declines compiled cases)."""
    target = resolve_target(name)
    if name != "torch-ddp":
        return target
    fresh = Path(__file__).parents[1] / "tests/property/_fresh_torch_ddp.py"
    return replace(target, path=f"{fresh}:CompiledTorchDDP")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--targets", default=",".join(TARGETS))
    ap.add_argument("--settings", default=",".join(SETTINGS))
    ap.add_argument("--backend", default="nccl", choices=("nccl", "gloo"))
    args = ap.parse_args()
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    print(torch.__version__, gpu, flush=True)
    with args.json.open("w") as out:
        for name in args.targets.split(","):
            # One World per target: torch DDP's second compiled case on a rank raised on torch
            # 2.13 (the test's fresh_world); a fresh World per target keeps targets apart.
            with World(1, backend=args.backend, timeout=600.0) as world:
                for dtype in ("float64", "float32"):
                    for setting in args.settings.split(","):
                        if name == "torch-ddp" and "optimize-ddp" in setting:
                            case = replace(CASE, bucket_size_mb=None, unbounded_bucket=True)
                        else:
                            case = CASE
                        case = replace(case, dtype=dtype, compiled=setting)
                        t0 = time.monotonic()
                        result = run_case(world, _target(name), case)
                        wall = time.monotonic() - t0
                        compiled = result.extra.get("compiled") or {}
                        row = {
                            "target": name,
                            "dtype": dtype,
                            "setting": setting,
                            "ok": result.ok,
                            "skipped": result.extra.get("skipped"),
                            "graphs": compiled.get("graphs"),
                            "compile_s": compiled.get("compile_s", compiled.get("seconds")),
                            "compiled": compiled,
                            "wall_s": round(wall, 2),
                            "why": None if result.ok else result.describe()[:600],
                        }
                        print(json.dumps(row, default=str), flush=True)
                        out.write(json.dumps(row, default=str) + "\n")


if __name__ == "__main__":
    main()
