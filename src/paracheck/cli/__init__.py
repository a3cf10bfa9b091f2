"""``paracheck``: check data-parallel implementations against the single-process oracle.

    paracheck check [TARGET ...] [--world-sizes 1,2,4] [--max-examples N] [--seed N]
                    [--backend gloo|nccl] [--timeout S] [--kind ddp|sharded|zero] [--case JSON]
                    [--properties equivalence,state,state-consolidated,memory,balance,traffic]
                    [--adapters PATH_OR_MODULE] [--finish NAME] [--batch-start NAME] [--stub-cuda-timing]
                    [--first-failure] [--json PATH]
    paracheck selftest [--profile ci|dev] [--only NAME ...]
    paracheck bench | memory | gate | report ...   (speed and memory tracking)

Exit status: 0 every property holds; 1 a property failed (the shrunk case is printed as JSON
with a command that replays it); 2 usage errors (unknown target, a module that does not import,
a world size below 1 or above the GPUs present with nccl).
"""

from __future__ import annotations

import argparse
import sys

from paracheck.cli import check
from paracheck.cli._common import UsageError

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="paracheck", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command")
    check.add_parsers(sub)
    for name in ("bench", "memory", "gate", "report"):
        sp = sub.add_parser(name, help=f"speed and memory tracking: {name}", add_help=False)
        sp.add_argument("rest", nargs=argparse.REMAINDER)
    return p


def _delegate(name: str, rest: list[str]) -> int:
    try:
        import paracheck.bench as bench
    except ImportError as exc:
        raise UsageError(f"paracheck {name} needs the benchmark extras: {exc}") from None
    fn = getattr(bench, f"{name}_main", None)
    if fn is None:
        raise UsageError(f"paracheck {name} is not available in this version")
    return int(fn(rest) or 0)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in ("bench", "memory", "gate", "report"):
        # These parse their own options (paracheck.bench); argparse's REMAINDER would reject
        # an option that comes first.
        try:
            return _delegate(argv[0], argv[1:])
        except UsageError as exc:
            print(f"paracheck: error: {exc}", file=sys.stderr)
            return 2
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        if args.command in ("check", "selftest"):
            return args.run(args)
        return _delegate(args.command, args.rest)
    except UsageError as exc:
        print(f"paracheck: error: {exc}", file=sys.stderr)
        return 2
