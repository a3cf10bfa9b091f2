"""``torchrun [--nnodes N --node-rank K ...] --nproc-per-node G -m paracheck.agent``: start a pool
of ranks, on any number of nodes, that one driver attaches to and checks targets on::

    paracheck check TARGET --attach MASTER_ADDR:MASTER_PORT
    pytest --paracheck-attach MASTER_ADDR:MASTER_PORT

or let agent 0 start the driver itself: ``torchrun ... -m paracheck.agent -- check TARGET``.
The agents exit when the driver closes the pool. See ``paracheck.world.attached``.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    driver_args: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, driver_args = argv[:cut], argv[cut + 1 :]
    parser = argparse.ArgumentParser(
        prog="torchrun ... -m paracheck.agent",
        description="One rank of a pool that a single paracheck driver attaches to.",
    )
    parser.add_argument(
        "--backend",
        choices=["gloo", "nccl"],
        default=None,
        help="the process groups of the jobs (default: nccl where CUDA is present, else gloo); "
        "nccl gives each agent the device cuda:LOCAL_RANK",
    )
    parser.add_argument(
        "--wait",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="how long to wait for a driver to attach before exiting (default %(default)s)",
    )
    args = parser.parse_args(argv)
    if not args.wait > 0:
        parser.error(f"--wait={args.wait!r} must be > 0 seconds")
    if driver_args and driver_args[0] != "check":
        parser.error(
            f"after '--': a 'paracheck check ...' command line for agent 0 to run, got "
            f"{' '.join(driver_args)!r}"
        )
    from paracheck.world._agent import agent_main

    agent_main(args.backend, args.wait, driver_args)


if __name__ == "__main__":
    sys.exit(main())
