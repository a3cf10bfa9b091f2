"""How long a hanging target takes to report: the first hang, and the whole check with every
failing property shrunk and labelled.

    PYTHONPATH=src python scripts/hang_figure.py [--target paracheck.mutants.ddp:SkipNoneGradDDP]
        [--world-sizes 1,2,3] [--max-examples 50] [--timeout 20]

Runs what ``paracheck check TARGET --world-sizes ... --max-examples ...`` runs (default settings:
seed 0, no example database), timing the pool start, each case, the first hang (from its
submission to the verdict, recovery included) against its case timeout, and the check. Prints
one line per failing case kind and the totals.
"""

from __future__ import annotations

import argparse
import collections
import time


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--target", default="paracheck.mutants.ddp:SkipNoneGradDDP")
    p.add_argument("--world-sizes", default="1,2,3")
    p.add_argument("--max-examples", type=int, default=50)
    p.add_argument("--timeout", type=float, default=20.0)
    args = p.parse_args()

    import paracheck.check.property as prop
    from paracheck.check.targets import resolve_target
    from paracheck.world import World

    sizes = tuple(int(s) for s in args.world_sizes.split(","))
    t_start = time.monotonic()
    world = World(max(sizes), timeout=args.timeout)
    pool_start = time.monotonic() - t_start

    run_case = prop.run_case
    kinds = collections.defaultdict(lambda: [0, 0.0])
    first_hang = {}

    def timed(world_, target, case, **kw):
        t0 = time.monotonic()
        result = run_case(world_, target, case, **kw)
        dt = time.monotonic() - t0
        kind = "pass" if result.ok else result.failed_properties[0]
        kinds[kind][0] += 1
        kinds[kind][1] += dt
        if kind == "hang" and not first_hang:
            first_hang.update(
                seconds=dt,
                timeout=kw.get("timeout"),
                at=time.monotonic() - t_check,
                definite=getattr(result.error, "definite", False),
            )
        return result

    prop.run_case = timed
    t_check = time.monotonic()
    try:
        report = prop.check_target(
            resolve_target(args.target),
            world,
            world_sizes=sizes,
            max_examples=args.max_examples,
            timeout=args.timeout,
            first_failure=False,
            labels=True,
        )  # as paracheck check does
    finally:
        prop.run_case = run_case
        world.close()
    check = time.monotonic() - t_check
    print(report.summary())
    for f in report.failures:
        print(
            f"  {f.property}: needs {f.needs}, fully shrunk {f.fully_shrunk}"
            + (f", found without {f.without}" if f.without else "")
        )
    for kind, (n, s) in sorted(kinds.items()):
        print(f"  {kind:10} {n:4d} cases {s:7.1f} s")
    if first_hang:
        print(
            f"first hang: {first_hang['seconds']:.2f} s from submission to verdict (case timeout "
            f"{first_hang['timeout']:.1f} s, deadlock proven by the counts: {first_hang['definite']}), "
            f"{first_hang['at']:.1f} s into the check"
        )
    print(
        f"pool start {pool_start:.1f} s; check {check:.1f} s; total {pool_start + check:.1f} s; "
        f"pool restarts/replacements {world.restarts}"
    )


if __name__ == "__main__":
    main()
