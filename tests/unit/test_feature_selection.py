"""Choosing the features a check draws (``paracheck.check.features``): contracts, ``-name`` and
``+name``, and the cases they leave; pure, no ranks."""

import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from paracheck.cases import Case
from paracheck.check.feature_choice import features_off
from paracheck.check.features import (
    CONTRACTS,
    FEATURES,
    FeatureError,
    feature,
    without_all,
)
from paracheck.strategies import cases, sharding_cases

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guide.md"
_SETTINGS = settings(
    max_examples=25, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck)
)


def _assert_drawn_without(case: Case, off) -> None:
    masked = without_all(case, off)
    assert Case.from_json(masked.to_json()) == masked  # a valid case
    assert not [n for n in off if feature(n).has(masked)], (off, masked)


@_SETTINGS
@given(st.one_of(cases(world_sizes=(1, 2, 3)), sharding_cases(world_sizes=(1, 2, 3))))
def test_a_feature_turned_off_is_in_no_case_the_check_draws(case):
    """For every feature, -name maps each drawn case (DDP and sharding strategies) to a valid case
    without it, nor any feature that needs it; so does every contract."""
    for f in FEATURES:
        _assert_drawn_without(case, features_off(features=f"-{f.name}"))
    for name in CONTRACTS:
        _assert_drawn_without(case, features_off(name))


def test_turning_off_a_feature_turns_off_the_features_that_need_it():
    """A late group and a reload need several steps; no_sync() and one finish need accumulation."""
    assert {"late-group", "reload"} <= set(features_off(features="-several-steps"))
    assert {"no-sync", "finish-once"} <= set(features_off(features="-accumulation"))
    assert "world>=3" in features_off(features="-world>=2")
    assert features_off() == ()


def test_plus_draws_again_what_a_contract_turned_off():
    """+name undoes the contract's -name; items apply in order."""
    assert "unused-some-ranks" in features_off("cs336")
    assert "unused-some-ranks" not in features_off("cs336", "+unused-some-ranks")
    assert "unused-some-ranks" in features_off("cs336", "+unused-some-ranks,-unused-some-ranks")
    # A partial last window needs accumulation, which cs336 turns off: off with it.
    assert set(features_off("cs336", ["-frozen"])) == set(CONTRACTS["cs336"].off) | {
        "frozen",
        "partial-window",
    }


@pytest.mark.parametrize(
    "spec, words",
    [
        ("-nope", ["'nope' is not a feature", "unused-some-ranks", "several-groups"]),
        ("unused-some-ranks", ["must be -name (never draw it) or +name"]),
        ("-several-steps,+late-group", ["+late-group needs several-steps"]),
    ],
)
def test_a_bad_feature_selection_is_refused_naming_it(spec, words):
    """Unknown names list the features; a bare name asks for a sign; +name of a feature whose
    need is off is impossible."""
    with pytest.raises(FeatureError) as info:
        features_off("full", spec)
    assert str(info.value).startswith(f"features={spec!r}: ")
    for w in words:
        assert w in str(info.value)


def test_an_unknown_contract_and_low_precision_off_in_float32_are_refused():
    with pytest.raises(FeatureError, match="contract='cs999': must be one of full, cs336"):
        features_off("cs999")
    with pytest.raises(FeatureError, match="low-precision is turned off, but the check runs in"):
        features_off("full", "-low-precision", dtype="float32")


def test_readme_table_says_what_each_contract_draws():
    """The guide's feature table has one row per feature, and its cs336 column is
    ``CONTRACTS["cs336"]``."""
    rows = {}
    for line in GUIDE.read_text().splitlines():
        m = re.match(r"\| `([^`]+)` \|.*\| (yes|no|n/a) \|$", line)
        if m:
            rows[m.group(1)] = m.group(2)
    assert set(rows) == {f.name for f in FEATURES}
    assert {n for n, v in rows.items() if v == "no"} == CONTRACTS["cs336"].off
