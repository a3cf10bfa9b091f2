"""Per-tensor tolerances for models with parameters of two dtypes follow Note [Parameters of two
dtypes] in ``paracheck.oracle.tolerance``, without processes."""

from __future__ import annotations

from paracheck.cases import Case
from paracheck.oracle.tolerance import (
    UNIT_ROUNDOFF,
    gamma,
    step0_grad_rtol,
    tensor_tolerance,
    tolerance_for,
)
from paracheck.workloads import MLPSpec

_MIXED = ["float32", "float32", "float64", "float64"]


def _case(**kw) -> Case:
    base = dict(
        model=MLPSpec(widths=(3, 2), float32_layer=0), world_size=3, batch_sizes=(1, 1, 1), steps=3
    )
    base.update(kw)
    return Case(**base)


def test_one_dtype_keeps_its_own_tolerance_at_every_step():
    """Where every parameter is float64 the tolerance is float64's, at every step."""
    for step in range(3):
        assert tensor_tolerance(_case(), step, "float64", ["float64"] * 4) == tolerance_for(
            "float64"
        )


def test_float64_tensors_inherit_float32_differences_after_step_zero():
    """With three ranks a float64 tensor keeps float64's tolerance at step 0 and float32's after it."""
    case = _case()
    assert tensor_tolerance(case, 0, "float64", _MIXED) == tolerance_for("float64")
    assert tensor_tolerance(case, 1, "float64", _MIXED) == tolerance_for("float32")
    assert all(
        tensor_tolerance(case, k, "float32", _MIXED) == tolerance_for("float32") for k in range(3)
    )


def test_sums_that_cannot_differ_keep_float64_tolerance():
    """One rank, or two ranks with one backward per step: the sums are bitwise equal, nothing is inherited."""
    for case in (_case(world_size=1, batch_sizes=(1,)), _case(world_size=2, batch_sizes=(1, 1))):
        assert tensor_tolerance(case, 2, "float64", _MIXED) == tolerance_for("float64")
    for case in (
        _case(world_size=2, batch_sizes=(1, 1), accumulation=2),
        _case(world_size=2, batch_sizes=(1, 1), double_backward=True),
    ):
        assert tensor_tolerance(case, 2, "float64", _MIXED) == tolerance_for("float32")


def test_ranks_off_the_cpu_compare_mixed_models_at_the_coarsest_dtype_from_step_zero():
    """Ranks on a GPU run other float32 kernels than the CPU oracle: even at one rank (nothing
    reduced) every tensor of a mixed model gets float32's tolerance, at every step; a model of one
    dtype keeps its own."""
    for case in (_case(world_size=1, batch_sizes=(1,)), _case()):
        for step in range(3):
            got = tensor_tolerance(case, step, "float64", _MIXED, same_operations=False)
            assert got == tolerance_for("float32")
    one = tensor_tolerance(_case(), 0, "float64", ["float64"] * 4, same_operations=False)
    assert one == tolerance_for("float64")


def test_a_clip_across_two_dtypes_carries_the_coarser_rounding():
    """Note [Clipping across dtypes]: a float64 gradient clipped with float32 ones is judged at
    step 0 by float32's norm rounding and rank-sum difference (2 gamma_{N+4} + 2 gamma_{2n+2} at
    2**-24), in one dtype by the unchanged single-dtype bound; after step 0 at float32's tolerance
    even where the rank sum cannot differ (two ranks, one backward)."""
    case = _case(clip_norm=0.01)
    n, big = 3, 26
    u32, u64 = UNIT_ROUNDOFF["float32"], UNIT_ROUNDOFF["float64"]
    own = 2 * gamma(2 * n + 2, u64)
    assert step0_grad_rtol(case, "float64", big) == own + 2 * gamma(big + 4, u64)
    assert step0_grad_rtol(case, "float64", big, "float32") == (
        own + 2 * gamma(big + 4, u32) + 2 * gamma(2 * n + 2, u32)
    )
    assert step0_grad_rtol(case, "float32", big, "float32") == step0_grad_rtol(case, "float32", big)
    two = _case(clip_norm=0.01, world_size=2, batch_sizes=(1, 1))
    assert tensor_tolerance(two, 1, "float64", _MIXED) == tolerance_for("float32")
    assert tensor_tolerance(_case(world_size=2, batch_sizes=(1, 1)), 1, "float64", _MIXED) == (
        tolerance_for("float64")
    )
