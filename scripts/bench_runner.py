"""Cases per second: the persistent runner versus a fresh process group per case.

Same cases for both (small 3-step MLP DDP cases, FlatDDP, float64, gloo); each case is the full
check (ranks train, oracle trains, comparison). The persistent World is started once (its start-up
is reported separately, not amortised into the rate); the fresh variant starts and tears down a
World for every case, as a per-case ``mp.spawn`` + ``init_process_group`` would.

    python scripts/bench_runner.py [--world-sizes 2,4] [--cases 60] [--fresh-cases 4]
"""

from __future__ import annotations

import argparse
import time

from paracheck.cases import Case, GroupSpec, OptimizerSpec
from paracheck.check.run import run_case
from paracheck.check.targets import resolve_target
from paracheck.workloads import MLPSpec
from paracheck.world import World


def small_cases(w: int, n: int) -> list[Case]:
    return [
        Case(
            model=MLPSpec(in_features=4, widths=(5, 3), bias=True),
            world_size=w,
            batch_sizes=(2,) * w,
            steps=3,
            optimizer=OptimizerSpec(
                name="sgd", groups=(GroupSpec(params=(), lr=0.05, momentum=0.9),)
            ),
            seed=i,
        )
        for i in range(n)
    ]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--world-sizes", default="2,4")
    ap.add_argument("--cases", type=int, default=60)
    ap.add_argument("--fresh-cases", type=int, default=4)
    args = ap.parse_args()
    target = resolve_target("flat")
    rows = []
    for w in (int(s) for s in args.world_sizes.split(",")):
        cases = small_cases(w, args.cases)
        t0 = time.perf_counter()
        world = World(w, timeout=60)
        start = time.perf_counter() - t0
        run_case(world, target, cases[0])  # warm: imports and first group creation
        t0 = time.perf_counter()
        for c in cases:
            assert run_case(world, target, c).ok
        persistent = len(cases) / (time.perf_counter() - t0)
        world.close()
        t0 = time.perf_counter()
        for c in cases[: args.fresh_cases]:
            with World(w, timeout=60) as fresh:
                assert run_case(fresh, target, c).ok
        fresh_rate = args.fresh_cases / (time.perf_counter() - t0)
        rows.append((w, start, persistent, fresh_rate))
        print(
            f"W={w}: start {start:.1f} s, persistent {persistent:.1f} cases/s, fresh {fresh_rate:.3f} cases/s",
            flush=True,
        )
    print()
    print(
        "| W | pool start (s) | persistent (cases/s) | fresh group per case (cases/s) | speed-up |"
    )
    print("| --- | --- | --- | --- | --- |")
    for w, start, p, f in rows:
        print(f"| {w} | {start:.1f} | {p:.1f} | {f:.3f} | {p / f:.0f}x |")


if __name__ == "__main__":
    main()
