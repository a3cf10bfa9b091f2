"""Which mutants the float64-bound property kills alone, and by how much: each mutant of the
catalogue checked with only ``float64-bound`` selected, at a precision, on the ci profile's
derandomised cases (40), and its margin (error over the bound) on the case found first and on
the shrunk case (Note [Two margins] in ``paracheck.selftest``).

    python scripts/float64_bound_margins.py --precision fp32 [--only NAME ...] [--json out.json]

A mutant that survives is a bug the bound does not see at that precision (a wrong update, a
state or memory bug, or a gradient rounded within what the precision allows): the table says so.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace

from paracheck.check.property import check_target
from paracheck.mutants import MUTANTS
from paracheck.selftest import margin, margin_text, mutant_target
from paracheck.world import World

NAME = "float64-bound"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16", "mixed"])
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--max-examples", type=int, default=40)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    names = [
        n
        for n, m in MUTANTS.items()
        if m.kind != "loop" and m.expect == "diverge" and (not args.only or n in args.only)
    ]
    unknown = sorted(set(args.only or ()) - set(MUTANTS))
    if unknown:
        ap.error(f"--only: unknown mutants {unknown}")
    rows = []
    with World(4) as world:
        for name in names:
            target = replace(mutant_target(MUTANTS[name]), properties=frozenset({NAME}))
            t0 = time.monotonic()
            report = check_target(
                target,
                world,
                world_sizes=(1, 2, 3, 4),
                max_examples=args.max_examples,
                seed=0,
                precision=args.precision,
                first_failure=True,
                labels=False,
            )
            killed = bool(report.failures) and report.failures[0].property == NAME
            row = {
                "mutant": name,
                "kind": MUTANTS[name].kind,
                "killed": killed,
                "examples": report.examples,
                "margin_found": margin(report.failures[0], found=True) if killed else None,
                "margin_shrunk": margin(report.failures[0]) if killed else None,
                "other": [f.property for f in report.failures if f.property != NAME],
                "seconds": round(time.monotonic() - t0, 1),
            }
            rows.append(row)
            print(
                f"| `{name}` | {row['kind']} | "
                f"{'killed' if killed else 'survives'} | {row['examples']} | "
                f"{margin_text(row['margin_found'])} | {margin_text(row['margin_shrunk'])} |",
                flush=True,
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"precision": args.precision, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
