"""A CPU load for testing the merge gate under a busy machine: ``--per-core`` busy processes per
CPU this process may run on, for ``--seconds``, then it stops by itself.

    python scripts/load.py --per-core 4 --seconds 600 &
    paracheck gate --base main mypkg.ddp:MyDDP          # measured while the load runs

Each busy process spins on arithmetic (no memory traffic to speak of, no I/O) and checks the
clock itself, so the load ends on time even if this script is killed with SIGKILL; SIGINT or
SIGTERM stop it at once. A busy process also stops when its parent is gone. With 2 CPUs,
``--per-core 4`` starts 8 processes: a 2-rank gate job then gets about a fifth of each core.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time


def _spin(deadline: float, parent: int) -> None:
    x = 0
    while time.monotonic() < deadline:
        for _ in range(100_000):
            x = (x * 1103515245 + 12345) & 0xFFFFFFFF
        if os.getppid() != parent:
            return


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--per-core", type=int, default=4, help="busy processes per CPU available (default 4)"
    )
    p.add_argument(
        "--seconds", type=float, default=600.0, help="how long the load lasts (default 600)"
    )
    args = p.parse_args(argv)
    if args.per_core < 1:
        print(f"load: --per-core={args.per_core} must be >= 1", file=sys.stderr)
        return 2
    if not 0 < args.seconds <= 24 * 3600:
        print(f"load: --seconds={args.seconds} must be in (0, 86400]", file=sys.stderr)
        return 2
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    n = args.per_core * (cpus or 1)
    deadline = time.monotonic() + args.seconds
    me = os.getpid()
    children = []
    for _ in range(n):
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            try:
                _spin(deadline, me)
            finally:
                os._exit(0)
        children.append(pid)
    print(f"load: {n} busy processes on {cpus} CPUs for {args.seconds:g} s", flush=True)

    def stop(signum, frame):
        for pid in children:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    for pid in children:
        while True:
            try:
                os.waitpid(pid, 0)
                break
            except InterruptedError:
                continue
            except ChildProcessError:
                break
    return 0


if __name__ == "__main__":
    sys.exit(main())
