"""Note [Features a kind never draws]: each kind's ``never_draws`` says exactly which of the
verdict table's optional features its strategy never draws. Drawn the way the table decided it
before the declaration (``_TRIES`` derandomised cases a row, none with the feature), at every
world size from 1 to 4 and at two precisions: no declared feature is drawn, and every other
optional feature is, at one of them."""

import functools

import pytest
from hypothesis import HealthCheck, Phase, given, settings

from paracheck.check.features import feature, never_drawn_off, optional_features
from paracheck.check.kinds import KINDS
from paracheck.check.loading import load_object
from paracheck.check.table import _TRIES
from paracheck.errors import InvalidArgument

WORLD_SIZES = (1, 2, 3, 4)
# The precisions drawn at: the main job's and a low one (every kind draws bfloat16).
PRECISIONS = ("fp64", "bf16")


@functools.cache
def _drawn(kind: str, precision: str, n: int) -> frozenset[str] | None:
    """The optional features of ``n`` derandomised cases of ``kind``'s strategy (None: it refuses
    ``precision``)."""
    strategy = load_object(KINDS[kind].strategy)(world_sizes=WORLD_SIZES, precision=precision)
    seen: set[str] = set()
    names = optional_features()

    @settings(
        max_examples=n,
        database=None,
        derandomize=True,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def draw(case):
        seen.update(name for name in names if feature(name).has(case))

    try:
        draw()
    except InvalidArgument:  # a kind drawn at some precisions only (tp: fp64)
        return None
    return frozenset(seen)


def disagreement(never_draws, drawn_by_precision: dict) -> tuple[list, list]:
    """(declared features drawn at some precision, undeclared optional features drawn at none)."""
    drawn = set().union(*drawn_by_precision.values())
    declared_drawn = sorted(set(never_draws) & drawn)
    undeclared_missing = sorted(set(optional_features()) - set(never_draws) - drawn)
    return declared_drawn, undeclared_missing


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_kind_declares_exactly_the_features_it_never_draws(kind):
    """No declared feature in any draw; every undeclared optional feature in one."""
    drawn = {p: d for p in PRECISIONS if (d := _drawn(kind, p, _TRIES)) is not None}
    declared_drawn, undeclared_missing = disagreement(KINDS[kind].never_draws, drawn)
    assert not declared_drawn, f"{kind} declares {declared_drawn} never drawn, but draws them"
    assert not undeclared_missing, (
        f"{kind} never drew {undeclared_missing} in {_TRIES} cases at each of {PRECISIONS}: "
        "declare them in its row's never_draws"
    )


def test_a_wrong_declaration_is_found():
    """The comparison names a declared feature the kind draws, and one it never draws that is
    not declared: the DDP kind draws accumulation and never a scheduler."""
    drawn = {"fp64": _drawn("ddp", "fp64", _TRIES)}
    wrong = (KINDS["ddp"].never_draws - {"scheduler"}) | {"accumulation"}
    assert disagreement(wrong, drawn) == (["accumulation"], ["scheduler"])


def test_every_declared_name_is_an_optional_feature():
    """A declaration names rows of the table, nothing else."""
    for kind, row in KINDS.items():
        assert row.never_draws <= set(optional_features()), kind


def test_the_plan_turns_off_what_a_kind_never_draws():
    """What a kind never draws is off with every feature that needs it, less what the target
    declares (in every case it runs)."""
    assert never_drawn_off((), {"scheduler"}) == ("scheduler",)
    assert "finish-once" in never_drawn_off((), {"accumulation"})
    assert never_drawn_off(("reload",), {"clip"}, declared=("clip",)) == ("reload",)
