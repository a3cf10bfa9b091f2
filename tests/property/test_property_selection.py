"""Properties selected by name (``paracheck check --properties``): the opt-in oracle-free
relations of DDP targets each kill a planted bug through ``check_target``, pass correct targets,
and a selection a kind cannot run is refused."""

import dataclasses

import pytest

from paracheck.check.kinds import KINDS, default_properties, resolve_properties, select_properties
from paracheck.check.property import check_target
from paracheck.check.targets import resolve_target


def _selected(name: str, props):
    (target,), warnings = select_properties([resolve_target(name)], props)
    assert not warnings, warnings
    return target


def _check(world, target, sizes):
    return check_target(target, world, world_sizes=sizes, max_examples=20, seed=0)


@pytest.mark.slow(reason="test_metamorphic's world-size relation kills the same mutant: -m slow")
def test_world_size_relation_kills_no_divide(world, paracheck_world_sizes):
    """Selected alone, the world-size relation catches gradients summed but not averaged."""
    target = _selected("paracheck.mutants.ddp:NoDivideDDP", ["world-size-relation"])
    assert target.properties == {"world-size-relation"}
    report = _check(world, target, paracheck_world_sizes)
    assert not report.passed
    assert [f.property for f in report.failures] == ["world-size-relation"]


def test_bucket_size_independence_kills_last_bucket_never_reduced(world, paracheck_world_sizes):
    """Selected alone, bucket-size independence catches a DDP whose result depends on its cap
    (the last, partly filled bucket is never reduced)."""
    target = _selected(
        "paracheck.mutants.ddp:LastBucketNeverReducedDDP", ["bucket-size-independence"]
    )
    report = _check(world, target, paracheck_world_sizes)
    assert not report.passed
    assert [f.property for f in report.failures] == ["bucket-size-independence"]


@pytest.mark.parametrize(
    "name, props",
    [
        ("flat", ["equivalence", "world-size-relation"]),
        ("bucketed", list(KINDS["ddp"].properties)),
    ],
)
def test_relations_pass_correct_targets(world, paracheck_world_sizes, name, props):
    """Correct DDP targets pass every property of their kind, the opt-in relations included."""
    report = _check(world, _selected(name, props), paracheck_world_sizes)
    assert report.passed, report.text()


def test_defaults_leave_relations_out():
    """The relations are opt-in: the default sets are those a check ran before they existed, the
    float64 bound (which judges only cases below float64), and the properties of one feature each
    (``compile-ledger`` judges compiled cases only, ``reshard`` resumed ones only)."""
    assert default_properties("ddp", takes_bucket=True) == {
        "equivalence",
        "float64-bound",
        "bucket-structure",
        "compile-ledger",
    }
    assert default_properties("ddp") == {"equivalence", "float64-bound", "compile-ledger"}
    assert default_properties("sharded") == {
        "equivalence",
        "float64-bound",
        "state",
        "memory",
        "balance",
        "traffic",
        "reshard",
    }
    assert "float64-bound" not in default_properties("loop")
    assert resolve_properties("zero", None) == default_properties("zero")


def test_selection_a_kind_cannot_run_is_refused():
    """A sharding property for a DDP target, a bucket one for a DDP without a bucket size, or a
    relation for a sharding target is refused by name; select_properties warns and keeps a
    target's own properties where the selection names none of them."""
    with pytest.raises(ValueError, match="memory"):
        resolve_properties("ddp", {"memory"})
    with pytest.raises(ValueError, match="bucket size"):
        resolve_properties("ddp", {"bucket-size-independence"}, takes_bucket=False)
    with pytest.raises(ValueError, match="world-size-relation"):
        resolve_properties("sharded", {"world-size-relation"})
    with pytest.raises(ValueError, match="unknown"):
        select_properties([resolve_target("flat")], ["no-such-property"])
    flat, zero1 = resolve_target("flat"), resolve_target("zero1")
    (f, z), warnings = select_properties([flat, zero1], ["memory"])
    assert f == flat and z == dataclasses.replace(zero1, properties=frozenset({"memory"}))
    assert len(warnings) == 1 and "flat" in warnings[0]
    # Nothing selected of any target: refused (the CLI's exit 2), or kept with a warning (the
    # plugin's session-wide selection).
    with pytest.raises(ValueError, match=r"selects none of the properties of flat \(equivalence"):
        select_properties([flat], ["memory"])
    (f,), warnings = select_properties([flat], ["memory"], refuse_none=False)
    assert f == flat and "flat" in warnings[0]
