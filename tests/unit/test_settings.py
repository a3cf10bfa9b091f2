"""One declaration per option (Note [One declaration per option]): every row of ``OPTIONS`` is a
field of ``CheckSettings``, and the parsers of ``paracheck check``, ``paracheck selftest`` and the
pytest plugin offer exactly their surface's rows, with the settings' defaults."""

import argparse
import dataclasses

from paracheck.check.settings import (
    CHECK,
    OPTIONS,
    PYTEST,
    SELFTEST,
    CheckSettings,
    from_namespace,
    options,
    replay_options,
)
from paracheck.cli import _parser


def _flags(parser: argparse.ArgumentParser) -> set[str]:
    return {s for a in parser._actions for s in a.option_strings if s.startswith("--")} - {"--help"}


def _subparser(name: str) -> argparse.ArgumentParser:
    return _parser()[1][name]


def test_every_option_is_a_settings_field():
    """An option names a field of CheckSettings, once."""
    fields = {f.name for f in dataclasses.fields(CheckSettings)}
    names = [o.name for o in OPTIONS]
    assert len(names) == len(set(names)) and set(names) <= fields


def test_check_and_selftest_parsers_are_built_from_the_table():
    """check offers every check row (and nothing else but its targets), selftest its rows plus
    --only and --table; parsing nothing gives the settings' defaults with the command line's own
    (Note [One set of defaults]): the verdict table, labels, a 90 s budget, a 20 s timeout."""
    check = _subparser("check")
    assert _flags(check) == {o.flag for o in options(CHECK)}
    selftest = _subparser("selftest")
    assert _flags(selftest) == {o.flag for o in options(SELFTEST)} | {"--only", "--table"}
    parsed = from_namespace(check.parse_args([]))
    assert parsed == CheckSettings(
        table=True,
        labels=True,
        first_failure=False,
        budget=90.0,
        timeout=20.0,
        database=".paracheck/examples",
    )
    assert from_namespace(selftest.parse_args([]), SELFTEST) == CheckSettings(
        timeout=10.0, backend="gloo", dtype="float64"
    )
    assert parsed.budget == 90.0 and parsed.timeout == 20.0 and parsed.examples == 40
    given = from_namespace(check.parse_args(["--budget", "5", "--first-failure", "--seed", "3"]))
    assert (given.budget, given.first_failure, given.seed) == (5.0, True, 3)
    assert selftest.parse_args([]).timeout == 10.0  # the selftest's own default


def test_pytest_options_are_built_from_the_table():
    """The plugin adds --paracheck-<flag> for exactly the pytest rows, with their defaults."""
    from paracheck import pytest_plugin

    added = {}

    class Group:
        def addoption(self, name, **kw):
            added[name] = kw

    class Parser:
        def getgroup(self, name):
            return Group()

    pytest_plugin.pytest_addoption(Parser())
    assert set(added) == {"--paracheck-" + o.flag[2:] for o in options(PYTEST)}
    assert added["--paracheck-timeout"]["default"] == 20.0
    assert added["--paracheck-contract"]["default"] is None  # full, unless given
    assert added["--paracheck-no-database"]["action"] == "store_true"


def test_replay_carries_only_options_that_differ_from_their_default():
    assert replay_options(CheckSettings()) == ""
    assert replay_options(timeout=5.0, rank_memory=2.0) == " --timeout 5 --rank-memory 2"
    assert replay_options(CheckSettings(timeout=20.0)) == ""
