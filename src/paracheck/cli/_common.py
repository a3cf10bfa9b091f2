"""What every ``paracheck`` subcommand shares: usage errors and how signals end a command."""

from __future__ import annotations

import contextlib
import signal
import sys

# Exit statuses of a command ended by a signal: 128 + the signal's number, as a shell reports it.
EXIT_INTERRUPTED = 128 + signal.SIGINT
EXIT_TERMINATED = 128 + signal.SIGTERM


class UsageError(Exception):
    """A command line that cannot run: printed as ``paracheck: error: <message>``, exit 2."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread as Ctrl-C raises KeyboardInterrupt, so that the same
    cleanup runs (``finally`` blocks end the ranks). A KeyboardInterrupt so that every library
    treats it as an interruption and not as a failure (Hypothesis saves no example for it)."""


def _raise_terminated(signum, frame):
    raise Terminated()


@contextlib.contextmanager
def signals_raise():
    """SIGTERM raises ``Terminated`` (SIGINT raises KeyboardInterrupt) while the block runs; both
    handlers are restored after. Outside the main thread, nothing changes."""
    try:
        previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        signal.signal(signal.SIGTERM, _raise_terminated)
    except ValueError:  # not the main thread: signals are not ours to handle
        yield
        return
    try:
        yield
    finally:
        for signum, handler in previous.items():
            if handler is not None:  # None: set outside Python, cannot be put back
                signal.signal(signum, handler)


def ignore_signals() -> None:
    """Ignore SIGINT and SIGTERM until ``signals_raise`` ends: a second Ctrl-C must not cut the
    cleanup of the first short."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        try:
            signal.signal(signum, signal.SIG_IGN)
        except ValueError:
            pass


def report_stop(exc: KeyboardInterrupt, done: list[str], what: str) -> None:
    """``paracheck: interrupted after N <what>`` (``terminated`` for SIGTERM) on stderr, then the
    verdict lines ``done`` of what finished, indented; ``exit_code`` says nothing more."""
    print(f"paracheck: {_how(exc)} after {len(done)} {what}", file=sys.stderr)
    for line in done:
        print(f"  {line}", file=sys.stderr)
    sys.stderr.flush()
    exc.reported = True  # type: ignore[attr-defined]


def exit_code(exc: KeyboardInterrupt) -> int:
    """The exit status of a command ended by ``exc``, saying ``paracheck: interrupted`` where the
    command itself did not (``report_stop``)."""
    if not getattr(exc, "reported", False):
        print(f"paracheck: {_how(exc)}", file=sys.stderr)
    return EXIT_TERMINATED if isinstance(exc, Terminated) else EXIT_INTERRUPTED


def _how(exc: KeyboardInterrupt) -> str:
    return "terminated" if isinstance(exc, Terminated) else "interrupted"
