"""Every exception paracheck raises derives from ``ParacheckError``.

``except ParacheckError`` catches what paracheck itself refuses or reports, and nothing a target
raised on its own. Each class also derives from the builtin exception it was before there was a
common base (``TargetError`` is a ``ValueError``, ``CheckFailure`` an ``AssertionError``, ...),
so code that catches those keeps working.

The errors of the command line and of resolving what to check are defined here. The failures
of the rank processes live with the runner that raises them (``paracheck.world``), and a case
that does not equal the oracle with the check that judges it (``paracheck.check.run``); they are
importable from here too, without importing the runner until one is asked for.
"""

from __future__ import annotations

import importlib

# A leaf: this module imports no other module of paracheck, not even for type checking. The
# classes defined elsewhere (``_ELSEWHERE``, below) are imported on first use by name.
__all__ = [
    "ParacheckError",
    # the command line and what it names
    "UsageError",
    "TargetError",
    "ExitAtImport",
    "ImportTimeout",
    "FeatureError",
    "GateError",
    "VendorError",
]

# Defined beside the code that raises them and importable from here, imported on first use (the
# runner imports torch): a check's verdict, then the ranks' failures.
_ELSEWHERE = {
    "CheckFailure": "paracheck.check.run",
    "WorldError": "paracheck.world.runner",
    "WorldStartError": "paracheck.world.runner",
    "RankError": "paracheck.world.runner",
    "RankHang": "paracheck.world.runner",
    "RankDied": "paracheck.world.runner",
    "RankOverMemory": "paracheck.world.runner",
    "PeerFailed": "paracheck.world.runner",
    "Interrupted": "paracheck.world._agent",
    "PoolLost": "paracheck.world.attached",
}
__all__ += list(_ELSEWHERE)


class ParacheckError(Exception):
    """The base of every exception paracheck raises."""


class UsageError(ParacheckError):
    """A command line that cannot run: printed as ``paracheck: error: <message>``, exit 2."""


class TargetError(ParacheckError, ValueError):
    """A target that cannot be used: unknown name, import failure, or unusable interface."""


class ExitAtImport(ParacheckError):
    """``os._exit(code)`` called while a target was imported (Note [Importing a target])."""

    def __init__(self, code):
        super().__init__(code)
        self.code = code


class ImportTimeout(ParacheckError):
    """A target's import ran past ``IMPORT_SECONDS`` (Note [Importing a target])."""


class FeatureError(ParacheckError, ValueError):
    """A feature selection that cannot be drawn: names the ``argument``, its ``value`` and the
    ``rule`` (the command line prints it as ``--features=-nope: ...``)."""

    def __init__(self, argument: str, value, rule: str):
        super().__init__(f"{argument}={value!r}: {rule}")
        self.argument, self.value, self.rule = argument, value, rule


class GateError(ParacheckError, RuntimeError):
    """The gate cannot measure: its message says which side and why."""


class VendorError(ParacheckError, RuntimeError):
    """asv's pages reference something from the network that paracheck does not vendor."""


def __getattr__(name: str):
    if name in _ELSEWHERE:
        return getattr(importlib.import_module(_ELSEWHERE[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
