"""What one gloo rank costs on this machine: memory, time to start, and a small case's time.

For each world size W: start a ``World(W)`` (the pool start), read every rank's memory from
``/proc/<pid>/smaps_rollup`` (RSS; PSS, which divides shared pages among the processes sharing
them; USS, the pages only that rank holds), then run small 3-step MLP cases of world size W
(FlatDDP, float64, the full check with the oracle) and report their median and slowest time.
The figures behind Note [Gloo rank limit] in ``paracheck.check.limits`` (docs/measurements.md).

    PYTHONPATH=src python experiments/diag_rank_cost.py [--world-sizes 1,2,4,8] [--cases 10]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from paracheck.cases import Case, GroupSpec, OptimizerSpec
from paracheck.check.run import run_case
from paracheck.check.targets import resolve_target
from paracheck.workloads import MLPSpec
from paracheck.world import World


def _memory_mib(pid: int) -> dict[str, float]:
    fields = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 3 and parts[2] == "kB":
                fields[parts[0].rstrip(":")] = int(parts[1]) / 1024
    return {
        "rss": fields["Rss"],
        "pss": fields["Pss"],
        "uss": fields["Private_Clean"] + fields["Private_Dirty"],
    }


def _case(w: int, seed: int) -> Case:
    return Case(
        model=MLPSpec(in_features=4, widths=(5, 3), bias=True),
        world_size=w,
        batch_sizes=(2,) * w,
        steps=3,
        optimizer=OptimizerSpec(name="sgd", groups=(GroupSpec(params=(), lr=0.05, momentum=0.9),)),
        seed=seed,
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--world-sizes", default="1,2,4,8")
    ap.add_argument("--cases", type=int, default=10)
    args = ap.parse_args()
    target = resolve_target("flat")
    print(f"cpus {os.cpu_count()}, load average {os.getloadavg()}")
    print(
        "| W | pool start (s) | start per rank (s) | RSS per rank (MiB) | PSS | USS | case median (s) | case max (s) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for w in (int(s) for s in args.world_sizes.split(",")):
        t0 = time.perf_counter()
        world = World(w, timeout=60)
        start = time.perf_counter() - t0
        mem = [_memory_mib(pid) for pid in world.pids]
        times = []
        for i in range(args.cases):
            t0 = time.perf_counter()
            assert run_case(world, target, _case(w, i)).ok
            times.append(time.perf_counter() - t0)
        world.close()
        print(
            f"| {w} | {start:.1f} | {start / w:.2f} | {max(m['rss'] for m in mem):.0f} "
            f"| {max(m['pss'] for m in mem):.0f} | {max(m['uss'] for m in mem):.0f} "
            f"| {statistics.median(times):.3f} | {max(times):.3f} |",
            flush=True,
        )
    print(f"load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
