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
import re

# A leaf: this module imports no other module of paracheck, not even for type checking. The
# classes defined elsewhere (``_ELSEWHERE``, below) are imported on first use by name.
__all__ = [
    "ParacheckError",
    # the command line and what it names
    "UsageError",
    "InvalidArgument",
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


class InvalidArgument(ParacheckError, ValueError):
    """An option of a check that cannot be used: its ``option`` (a field of ``CheckSettings``:
    ``world_sizes``), its ``value`` and the ``rule`` it breaks (``"must be > 0"``, or a clause
    said after a colon). Each surface names the option its own way (``text``): the command line
    as ``--world-sizes``, the pytest plugin as ``--paracheck-world-sizes``, a keyword as
    itself."""

    # Between ``option=value`` and the rule: None, a space before "must ...", else a colon.
    separator: str | None = None

    def __init__(self, option: str, value, rule: str):
        self.option, self.value, self.rule = option, value, rule
        super().__init__(self.text())

    def text(self, prefix: str | None = None) -> str:
        """``option=value rule``, the option named as a keyword (``prefix`` None; the value as
        Python writes it) or as the flag ``prefix`` + its dashed name (the value as typed; an
        empty one as ''). Another option the rule names, written ``{option:name}``, is named the
        same way; a part after a space (``case world_size``) is a field of the value, kept."""
        if prefix is None:
            named = f"{self.option}={self.value!r}"
        else:
            named = f"{_flag(prefix, self.option)}={self.value if self.value != '' else repr('')}"
        rule = _OTHER_OPTION.sub(
            lambda m: m[1] if prefix is None else _flag(prefix, m[1]), self.rule
        )
        separator = self.separator
        if separator is None:
            separator = " " if rule.startswith("must ") else ": "
        return named + separator + rule


# Another option named in a rule: ``{option:allow_large_world}``.
_OTHER_OPTION = re.compile(r"\{option:(\w+)\}")


def _flag(prefix: str, option: str) -> str:
    name, space, field = option.partition(" ")
    return prefix + name.replace("_", "-") + space + field


class TargetError(ParacheckError, ValueError):
    """A target that cannot be used: unknown name, import failure, or unusable interface."""


class ExitAtImport(ParacheckError):
    """``os._exit(code)`` called while a target was imported (Note [Importing a target])."""

    def __init__(self, code):
        super().__init__(code)
        self.code = code


class ImportTimeout(ParacheckError):
    """A target's import ran past ``IMPORT_SECONDS`` (Note [Importing a target])."""


class FeatureError(InvalidArgument):
    """A feature selection that cannot be drawn: names the option (``contract`` or ``features``),
    its ``value`` and the ``rule`` (the command line prints it as ``--features=-nope: ...``)."""

    separator = ": "

    @property
    def argument(self) -> str:
        return self.option


class GateError(ParacheckError, RuntimeError):
    """The gate cannot measure: its message says which side and why."""


class VendorError(ParacheckError, RuntimeError):
    """asv's pages reference something from the network that paracheck does not vendor."""


def __getattr__(name: str):
    if name in _ELSEWHERE:
        return getattr(importlib.import_module(_ELSEWHERE[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
