"""A declared reduction dtype (Note [Declared reduction dtype]): a design that keeps it passes in
bfloat16 and float32, one that casts after communicating is caught by ``reduce-dtype`` alone,
and bad declarations are refused by name."""

import dataclasses
from pathlib import Path

import pytest

from paracheck.check.properties.reduce_dtype import window_breaks
from paracheck.check.property import check_target
from paracheck.check.targets import TargetError, resolve_target

CONTROL = f"{Path(__file__).with_name('_reduce.py')}:Float32ReduceDDP"
MUTANT = "paracheck.mutants.ddp:CastAfterCommunicatingDDP"


def test_rule_counts_bytes_outside_the_declared_dtype():
    # 3 parameters: up to 24 bytes of flags may go in another dtype.
    assert window_breaks((("all_reduce", "float32", 400),), "float32", 3) is None
    assert (
        window_breaks((("all_reduce", "float32", 400), ("all_reduce", "bfloat16", 6)), "float32", 3)
        is None
    )
    why = window_breaks((("all_reduce", "bfloat16", 206),), "float32", 3)
    assert why is not None and "206 bytes reduced in bfloat16" in why
    assert window_breaks((("broadcast", "bfloat16", 999),), "float32", 3) is None  # not a reduction


def test_declaration_is_read_from_the_class_and_adds_the_property():
    t = resolve_target(CONTROL)
    assert t.reduce_dtype == "float32" and "reduce-dtype" in t.properties
    assert resolve_target("flat").reduce_dtype is None
    assert resolve_target("flat", reduce_dtype="bfloat16").reduce_dtype == "bfloat16"
    with pytest.raises(TargetError, match="reduce_dtype='int8' must be one of"):
        resolve_target("flat", reduce_dtype="int8")
    with pytest.raises(TargetError, match="for DDP and FSDP targets"):
        resolve_target("zero1", reduce_dtype="float32")


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_float32_reduction_passes(world, paracheck_world_sizes, precision):
    report = check_target(
        resolve_target(CONTROL),
        world,
        world_sizes=paracheck_world_sizes,
        max_examples=12,
        seed=0,
        precision=precision,
    )
    assert report.passed, report.text()


def test_cast_after_communicating_is_caught_by_the_declared_dtype(world, paracheck_world_sizes):
    target = resolve_target(MUTANT)
    report = check_target(
        target, world, world_sizes=paracheck_world_sizes, max_examples=12, seed=0, precision="bf16"
    )
    assert not report.passed
    assert report.failures[0].property == "reduce-dtype", report.text()
    # Its gradients are within the bfloat16 tolerance: only the declaration tells it apart.
    numeric = check_target(
        dataclasses.replace(target, properties=frozenset({"equivalence"})),
        world,
        world_sizes=paracheck_world_sizes,
        max_examples=12,
        seed=0,
        precision="bf16",
    )
    assert numeric.passed, numeric.text()
