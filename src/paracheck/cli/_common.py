"""What every ``paracheck`` subcommand shares: usage errors and how signals end a command."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading

from paracheck.errors import UsageError as UsageError  # raised and caught by the subcommands

# Exit statuses of a command ended by a signal: 128 + the signal's number, as a shell reports it.
EXIT_INTERRUPTED = 128 + signal.SIGINT
EXIT_TERMINATED = 128 + signal.SIGTERM


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread as Ctrl-C raises KeyboardInterrupt, so that the same
    cleanup runs (``finally`` blocks end the ranks). A KeyboardInterrupt so that every library
    treats it as an interruption and not as a failure (Hypothesis saves no example for it)."""


def _raise_terminated(signum, frame):
    raise Terminated()


@contextlib.contextmanager
def signals_raise():
    """SIGTERM raises ``Terminated`` (SIGINT raises KeyboardInterrupt) while the block runs, and
    is never lost (Note [Signals raised where Python drops exceptions]); the handlers are
    restored after. Outside the main thread, nothing changes."""
    try:
        previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        signal.signal(signal.SIGTERM, _raise_terminated)
    except ValueError:  # not the main thread: signals are not ours to handle
        yield
        return
    hook, running, lock = sys.unraisablehook, [True], threading.Lock()

    def send(signum: int) -> None:
        with lock:
            if running[0]:  # after the block, the default handlers would end the process
                os.kill(os.getpid(), signum)

    def again(exc: KeyboardInterrupt) -> None:
        sent = signal.SIGTERM if isinstance(exc, Terminated) else signal.SIGINT
        # From another thread, a little later: sent from here, its handler would run here.
        later = threading.Timer(0.01, send, (sent,))
        later.daemon = True
        later.start()

    def resend(unraisable) -> None:
        if not isinstance(unraisable.exc_value, KeyboardInterrupt):
            hook(unraisable)
            return
        try:
            again(unraisable.exc_value)
        except KeyboardInterrupt as landed:
            # The signal sent again landed in this hook, where it would be dropped as well (an
            # exception in sys.unraisablehook is only printed): send it once more.
            again(landed)

    sys.unraisablehook = resend
    try:
        yield
    finally:
        with lock:
            running[0] = False
        sys.unraisablehook = hook
        for signum, handler in previous.items():
            if handler is not None:  # None: set outside Python, cannot be put back
                signal.signal(signum, handler)


# Note [Signals raised where Python drops exceptions]
#   A signal's Python handler runs between two bytecodes of the main thread, whatever it is
#   running, and an exception raised in a gc callback, a __del__ or a weakref callback cannot
#   propagate: Python prints "Exception ignored in ..." and goes on. Hypothesis times the
#   garbage collector with a gc callback, which runs often in the driver: a Ctrl-C or SIGTERM
#   that lands there is lost, and the check goes on to its end (seen in the interrupt tests: a
#   check ran on for 111 s and printed that traceback). While a command runs, a dropped
#   KeyboardInterrupt (or Terminated) has its signal sent again 10 ms later, from a thread
#   (sys.unraisablehook): the handler runs anew outside the callback and raises where the
#   exception propagates; should it land in a callback again, it is sent again, and so it is
#   where it lands in the hook itself (a loaded machine can keep the main thread there past the
#   10 ms).


def ignore_signals() -> None:
    """Ignore SIGINT and SIGTERM until ``signals_raise`` ends: a second Ctrl-C must not cut the
    cleanup of the first short."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        try:
            signal.signal(signum, signal.SIG_IGN)
        except ValueError:
            pass


def report_stop(
    exc: KeyboardInterrupt, done: list[str], what: str, stopped: str | None = None
) -> None:
    """``paracheck: interrupted after N <what>`` (``terminated`` for SIGTERM) on stderr, then the
    verdict lines ``done`` of what finished and ``stopped``, that of the one it stopped, indented;
    ``exit_code`` says nothing more."""
    print(f"paracheck: {_how(exc)} after {len(done)} {what}", file=sys.stderr)
    for line in done + ([stopped] if stopped else []):
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


# Options whose value may start with "-" (``--features -unused-some-ranks``).
_DASHED = ("--features",)


def join_dashed_values(argv: list[str]) -> list[str]:
    """``--features -name`` -> ``--features=-name``: argparse would read ``-name`` as an option."""
    out, i = [], 0
    while i < len(argv):
        if (
            argv[i] in _DASHED
            and i + 1 < len(argv)
            and argv[i + 1].startswith("-")
            and not argv[i + 1].startswith("--")
        ):
            out.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
            continue
        out.append(argv[i])
        i += 1
    return out
