"""``inner``: pytester whose pytest sessions, run in this process, check on the session's World."""

import sys
import types

import pytest

# pytester restores sys.modules after each session it runs in this process, and a native extension
# cannot be imported twice: triton, imported by torch._dynamo on the oracle's first optimizer step,
# aborts the process the second time. Imported before any pytester exists, it stays.
import torch._dynamo  # noqa: F401

from tests.integration._borrowed import Borrowed

_CONFTEST = """
import sys

import pytest


@pytest.fixture(scope="session")
def paracheck_world():
    return sys.modules["_paracheck_borrowed_world"].world
"""


@pytest.fixture
def inner(pytester, world, monkeypatch):
    """pytester, whose sessions check on the session's World (starting one costs seconds); the
    test module needs ``pytest_plugins = ("pytester",)``."""
    monkeypatch.setitem(
        sys.modules, "_paracheck_borrowed_world", types.SimpleNamespace(world=Borrowed(world))
    )
    pytester.makeconftest(_CONFTEST)
    return pytester
