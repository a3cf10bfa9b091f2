"""The built-in targets and the mutants under ``--contract cs336``: do the targets still pass, and
which mutants does the contract still kill? (``docs/measurements.md``, "The cs336 contract".)

A mutant whose bug needs a feature the contract does not draw is expected to survive: it is
correct under the CS336 interface. The rest should be killed as under the full contract.

    PYTHONPATH=src python experiments/contract_cs336.py [--max-examples N] [--world-sizes 1,2,3]
"""

from __future__ import annotations

import argparse
import time

from paracheck.check.features import features_off
from paracheck.check.kinds import KINDS
from paracheck.check.property import check_target
from paracheck.check.targets import BUILTIN_TARGETS, resolve_target
from paracheck.mutants import MUTANTS
from paracheck.selftest import mutant_target
from paracheck.world import World

# Mutants whose bug needs a feature cs336 does not draw (from their bug and their shrunk cases
# under the full contract): correct under the CS336 interface, expected to survive.
NEEDS_OFF_FEATURE = {
    "ddp-buffers-not-broadcast": "buffer",
    "ddp-skip-none-grad": "unused-some-ranks",
    "ddp-flags-averaged": "unused-some-ranks",
    "ddp-presence-from-hooks": "unused-some-ranks",
    "ddp-readiness-per-step": "accumulation / double-backward",
    "ddp-handles-per-step": "accumulation / double-backward",
    "ddp-round-starts-in-forward": "double-backward",
    "ddp-mixed-dtype-bucket": "float32-layer",
    "ddp-flat-buffer-first-dtype": "float32-layer",
    "sharded-lr-not-synced": "lr-changes / scheduler",
    "sharded-lr-synced-backwards": "scheduler",
    "sharded-group-generators-consumed": "groups-generators",
    "sharded-load-state-dict-skips-wrapped": "reload",
    "zero1-steps-unused": "unused-always",
    "zero1-accumulation-overwrites": "accumulation",
}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--max-examples", type=int, default=20)
    p.add_argument("--world-sizes", default="1,2,3")
    p.add_argument("--only", nargs="*", default=None)
    args = p.parse_args()
    sizes = tuple(int(s) for s in args.world_sizes.split(","))
    print(f"cs336 turns off: {', '.join(features_off('cs336'))}")
    items = [("target", n, resolve_target(n), None) for n in BUILTIN_TARGETS]
    items += [
        ("mutant", m.name, mutant_target(m), m.precision)
        for m in MUTANTS.values()
        if m.kind in KINDS
    ]
    world = World(max(sizes), timeout=10.0)
    try:
        for role, name, target, precision in items:
            if args.only and name not in args.only:
                continue
            t0 = time.monotonic()
            report = check_target(
                target,
                world,
                world_sizes=sizes,
                max_examples=args.max_examples,
                seed=0,
                timeout=10.0,
                contract="cs336",
                precision=precision,  # a mutant's own (None: float64)
                labels=False,
            )
            if role == "target":
                verdict = "pass" if report.passed else "FAIL"
            elif report.passed:
                why = NEEDS_OFF_FEATURE.get(name)
                verdict = f"survived (needs {why})" if why else "SURVIVED"
            else:
                verdict = f"killed ({report.failures[0].property})"
            print(
                f"{name:40} {role:7} {verdict:42} {report.examples:>4} {time.monotonic() - t0:6.1f}s",
                flush=True,
            )
    finally:
        world.close()


if __name__ == "__main__":
    main()
