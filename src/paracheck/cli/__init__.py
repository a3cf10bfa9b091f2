"""``paracheck``: check data-parallel implementations against the single-process oracle.

    paracheck check [TARGET ...] [--world-sizes 1,2,4] [--max-examples N] [--seed N]
                    [--backend gloo|nccl] [--timeout S] [--kind ddp|sharded|zero] [--case JSON]
                    [--properties equivalence,state,state-consolidated,memory,balance,traffic]
                    [--adapters PATH_OR_MODULE] [--finish NAME] [--batch-start NAME] [--stub-cuda-timing]
                    [--contract full|cs336] [--features -name,+name]
                    [--database PATH | --no-database] [--first-failure] [--json PATH]
                    [--allow-large-world]
    paracheck selftest [--profile ci|dev] [--only NAME ...] [--allow-large-world]
    paracheck bench | memory | gate | report ...   (speed and memory tracking)

Exit status: 0 every property holds; 1 a property failed (the shrunk case is printed as JSON
with a command that replays it); 2 usage errors (unknown target, a module that does not import,
a world size below 1, above the GPUs present with nccl or above what the machine runs with gloo,
a constructor with required arguments paracheck does not supply); 3 INCOMPLETE: no property
failed but rows of a verdict table were not reached (``--incomplete pass`` makes it 0); 130
Ctrl-C, 143 SIGTERM (the verdicts of the targets finished so far are printed, the ranks ended).
"""

from __future__ import annotations

import argparse
import sys

import paracheck
from paracheck.cli import bench, check, gate, report
from paracheck.cli._common import UsageError, exit_code, join_dashed_values, signals_raise
from paracheck.errors import InvalidArgument

__all__ = ["main"]

# bench, memory, gate and report parse their arguments with their own subparser, called
# directly, rather than through the top-level parser: their usage errors name the subcommand
# (``paracheck gate: error: ...``) and gate takes TARGETs between options
# (``parse_intermixed_args``), as they did when each was a program of its own.
_OWN_SUBPARSER = ("bench", "memory", "gate", "report")

DESCRIPTION = (
    "Check data-parallel PyTorch training code (DDP, sharded optimizers, ZeRO, FSDP, training "
    "loops) against a single-process oracle, and track its speed and memory. "
    "'paracheck COMMAND --help' describes each command."
)


def _parser(
    only_check: bool = False,
) -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The whole command line: the top-level parser and its subparsers by name. ``only_check``:
    ``check`` and ``selftest`` alone, whose options import no torch, so that ``paracheck check``
    prints its first line at once (the gate's and the benchmarks' parsers import torch)."""
    p = argparse.ArgumentParser(prog="paracheck", description=DESCRIPTION)
    p.add_argument("--version", action="version", version=f"paracheck {paracheck.__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    check.add_parsers(sub)
    if not only_check:
        bench.add_parsers(sub)
        gate.add_parser(sub)
        report.add_parser(sub)
    return p, sub.choices


def main(argv: list[str] | None = None) -> int:
    from paracheck.world.runner import WorldStartError

    argv = sys.argv[1:] if argv is None else list(argv)
    parser, commands = _parser(only_check=bool(argv) and argv[0] in ("check", "selftest"))
    if argv and argv[0] in _OWN_SUBPARSER:
        own = commands[argv[0]]
        parse = own.parse_intermixed_args if argv[0] == "gate" else own.parse_args
        args = parse(argv[1:])
        args.argv = argv[1:]
    else:
        if argv and argv[0] == "check":
            argv = join_dashed_values(argv)
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help()
            return 2
    try:
        with signals_raise():
            return args.run(args)
    except UsageError as exc:
        print(f"paracheck: error: {exc}", file=sys.stderr)
        return 2
    except InvalidArgument as exc:  # an option a check cannot run with, named as its flag
        print(f"paracheck: error: {exc.text('--')}", file=sys.stderr)
        return 2
    except WorldStartError as exc:
        print(
            f"paracheck: error: could not run the checks: {exc} (on a loaded machine, run again "
            f"later or with fewer ranks: --world-sizes)",
            file=sys.stderr,
        )
        return 2
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: cleaned up by the command, no traceback
        return exit_code(exc)
