"""The opt-in ``repeatability`` property: two runs of one case must agree bitwise on every rank.
A reduction whose order changes from run to run passes every comparison with the oracle and is
caught by this property alone; correct designs of every kind pass it."""

import pytest
import torch

from paracheck.check.kinds import KINDS, default_properties, resolve_properties, select_properties
from paracheck.check.properties.repeatability import first_difference, same_bits
from paracheck.check.property import check_target
from paracheck.check.ranks.record import RankRecord, RankStep
from paracheck.check.targets import Target, resolve_target

ARRIVAL = "paracheck.mutants.ddp:ArrivalOrderDDP"


def _target(path: str, props) -> Target:
    (target,), warnings = select_properties([resolve_target(path)], props)
    assert not warnings, warnings
    return target


def test_same_bits_is_bitwise():
    """Bitwise, not numeric: -0.0 is not 0.0, a NaN equals itself, dtypes must match; containers
    and numbers element by element."""
    z = torch.zeros(3)
    assert same_bits(z, z.clone())
    assert not same_bits(z, -z)
    assert not same_bits(z, z.double())
    nan = torch.tensor([float("nan"), 1.0])
    assert same_bits(nan, nan.clone())
    assert not same_bits(torch.tensor([1.0]), torch.tensor([1.0]).nextafter(torch.tensor([2.0])))
    assert same_bits({0: {"step": 1, "m": z}}, {0: {"step": 1, "m": z.clone()}})
    assert not same_bits({0: {"step": 1}}, {0: {"step": 2}})
    assert not same_bits({0: z}, {1: z})
    assert same_bits(float("nan"), float("nan")) and not same_bits(0.0, -0.0)
    assert same_bits(None, None) and not same_bits(None, z)


def test_first_difference_names_the_step_rank_and_tensor():
    p = [torch.ones(2), torch.ones(3)]
    a = [RankRecord(p, (), (RankStep([t.clone() for t in p], [t.clone() for t in p]),))] * 2
    q = [p[0].clone(), p[1] + 2**-20]
    b = [a[0], RankRecord(p, (), (RankStep(q, [t.clone() for t in p]),))]
    assert first_difference(a, a) is None
    step, what, rank, index, diff = first_difference(a, b)
    assert (step, what, rank, index) == (0, "param", 1, 1) and diff == 2**-20


def test_plus_adds_to_the_defaults():
    """``+repeatability`` is the kind's defaults and repeatability; plain names replace them."""
    assert resolve_properties("ddp", ["+repeatability"], takes_bucket=True) == default_properties(
        "ddp", takes_bucket=True
    ) | {"repeatability"}
    assert resolve_properties("sharded", ["traffic", "+repeatability"]) == {
        "traffic",
        "repeatability",
    }
    assert all("repeatability" in row.opt_in for row in KINDS.values())
    # A built-in that checks fewer than its kind (torch-zero: not balance, not traffic) keeps them.
    (tz,), _ = select_properties([resolve_target("torch-zero")], ["+repeatability"])
    assert tz.properties == resolve_target("torch-zero").properties | {"repeatability"}
    assert "repeatability" not in default_properties("ddp", takes_bucket=True)


def test_arrival_order_passes_equivalence(world, paracheck_world_sizes):
    """The mutant's sums differ from the oracle's only by rounding: equivalence cannot see it,
    which is why repeatability is a property of its own."""
    report = check_target(
        _target(ARRIVAL, ["equivalence"]),
        world,
        world_sizes=paracheck_world_sizes,
        max_examples=10,
        seed=0,
    )
    assert report.passed, report.text()


def test_repeatability_kills_arrival_order(world, paracheck_world_sizes):
    report = check_target(
        _target(ARRIVAL, ["+repeatability"]),
        world,
        world_sizes=paracheck_world_sizes,
        max_examples=20,
        seed=0,
    )
    assert not report.passed
    assert [f.property for f in report.failures] == ["repeatability"], report.text()
    assert report.failures[0].case.world_size >= 3  # a sum of two is the same either way


@pytest.mark.parametrize("name", ["overlapped", "bucketed", "sharded", "zero1", "loop"])
def test_correct_designs_repeat(world, paracheck_world_sizes, name):
    report = check_target(
        _target(name, ["+repeatability"]),
        world,
        world_sizes=paracheck_world_sizes,
        max_examples=6,
        seed=0,
    )
    assert report.passed, report.text()
