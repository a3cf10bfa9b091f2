"""How close correct computations come to the float64 bound (Note [A bound against the float64
gradient] in ``paracheck.oracle.exact``): draws cases of a precision, trains each with the
matched-precision oracle (a correct computation of the case's program: on the CPU, or with its
local gradients on ``--device``), and compares every synchronised gradient of every step with the
float64 gradient at the same parameters, as |difference| / bound per element.

    python scripts/bound_soundness.py --precision mixed --cases 10000 [--seed 0] [--device cuda]
        [--json out.json]

Prints, per workload, the elements judged, the worst and 99th-percentile ratios, and the number
above 1 (each one a false failure the bound would cause); exits 1 if any.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch
from hypothesis import HealthCheck, Phase, given, settings

from paracheck.check.properties.float64_bound import oracle_ratios
from paracheck.oracle.exact import judged_here
from paracheck.strategies import cases


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--precision", default="mixed", choices=["fp32", "bf16", "fp16", "mixed"])
    ap.add_argument("--cases", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu", help="where the local gradients are computed")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.cases < 1:
        ap.error(f"--cases={args.cases} must be >= 1")
    on = torch.device(args.device).type
    ratios: dict[str, list[float]] = {}
    over: list[dict] = []
    counts = {"cases": 0, "judged_cases": 0}
    t0 = time.monotonic()

    @settings(
        max_examples=args.cases,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=cases(precision=args.precision, world_sizes=[1, 2, 3, 4]))
    def run(case):
        counts["cases"] += 1
        if counts["cases"] % 1000 == 0:
            print(f"{counts['cases']} cases, {time.monotonic() - t0:.0f} s", file=sys.stderr)
        if judged_here(case, "ddp") is not None:
            return
        counts["judged_cases"] += 1
        for k, i, r in oracle_ratios(case, None if on == "cpu" else args.device):
            ratios.setdefault(case.model.kind, []).append(r)
            if not r <= 1.0:
                over.append({"ratio": r, "step": k, "param": i, "case": repr(case)})

    torch.manual_seed(args.seed)
    run._hypothesis_internal_use_seed = args.seed  # type: ignore[attr-defined]
    run()
    seconds = time.monotonic() - t0
    rows = []
    for kind, rs in sorted(ratios.items()):
        rs = sorted(rs)
        rows.append(
            {
                "workload": kind,
                "tensors_judged": len(rs),
                "worst": rs[-1],
                "p99": rs[int(0.99 * (len(rs) - 1))],
                "median": rs[len(rs) // 2],
                "above_1": sum(r > 1.0 for r in rs),
            }
        )
    print(
        f"precision {args.precision}, device {args.device}, seed {args.seed}: {counts['cases']} "
        f"cases drawn, {counts['judged_cases']} judged, {seconds:.0f} s"
    )
    print("| workload | tensors judged | median | p99 | worst | above 1 |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for row in rows:
        print(
            f"| {row['workload']} | {row['tensors_judged']} | {row['median']:.3g} | "
            f"{row['p99']:.3g} | {row['worst']:.3g} | {row['above_1']} |"
        )
    for o in over[:5]:
        print("ABOVE 1:", o, file=sys.stderr)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {**vars(args), **counts, "seconds": seconds, "rows": rows, "over": over},
                f,
                indent=1,
            )
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
