"""A sharding target's step judged alone (Note [Comparing an update]): the oracle applies its
update to the gradients the target recorded, from rank 0's parameters, and the parameters are
compared under a bound derived from the dtype's unit roundoff and the largest term an update can
have; and Adam below float32 for the kinds judged so."""

from dataclasses import replace

import pytest
import torch

from paracheck.cases import Case, GroupSpec, OptimizerSpec
from paracheck.check.kinds import KINDS
from paracheck.check.run import run_case
from paracheck.check.targets import Target, resolve_target
from paracheck.mutants import MUTANTS
from paracheck.oracle.tolerance import TOLERANCES, update_rtol
from paracheck.oracle.train import train, update_scale
from paracheck.selftest import mutant_target
from paracheck.strategies._core import with_precision
from paracheck.workloads import MLPSpec

ADAMW = OptimizerSpec("adamw", (GroupSpec(params=(), lr=1e-3, weight_decay=0.1),))
CASE = Case(
    model=MLPSpec(in_features=4, widths=(5, 3), bias=True),
    world_size=2,
    batch_sizes=(2, 3),
    steps=3,
    dtype="float32",
    optimizer=ADAMW,
    seed=5,
)


def test_update_bound_is_derived_from_the_unit_roundoff():
    """2 * gamma_{16(k+1)}: below the fixed tolerances of float64 and float32, above bfloat16's
    (where the fixed one stands)."""
    for dtype, u in (("float64", 2.0**-53), ("float32", 2.0**-24), ("bfloat16", 2.0**-8)):
        assert update_rtol(2, dtype) == pytest.approx(2 * 48 * u / (1 - 48 * u))
    assert update_rtol(3, "float32") < TOLERANCES["float32"].params / 10
    assert update_rtol(3, "float64") < TOLERANCES["float64"].params / 1e3
    assert update_rtol(0, "bfloat16") > TOLERANCES["bfloat16"].params


def test_update_scale_runs_the_momentum_recurrence_on_magnitudes():
    """SGD: lr * max(B_k), B_k = mu * B_{k-1} + |g_k| + wd * |p|, whatever the signs of g."""
    p = torch.nn.Parameter(torch.tensor([0.5, -0.25]))
    opt = torch.optim.SGD([p], lr=0.1, momentum=0.9, weight_decay=0.1)
    directions: dict = {}
    b = torch.zeros(2, dtype=torch.float64)
    for g in ([1.0, -2.0], [-1.0, 2.0], [0.5, 0.0]):
        p.grad = torch.tensor(g)
        b = 0.9 * b + p.grad.double().abs() + 0.1 * p.detach().double().abs()
        (scale,) = update_scale(opt, [p], directions)
        assert scale == pytest.approx(0.1 * b.max().item())
        opt.step()


def test_adam_update_never_exceeds_the_bound_that_scales_it():
    """Adam: |update| <= lr / sqrt((1 - beta2) * beta2**n) after n earlier steps, for gradient
    sequences that shrink, grow and flip sign (the inequality Note [Comparing an update] uses)."""
    gen = torch.Generator().manual_seed(0)
    for betas in ((0.9, 0.999), (0.8, 0.99)):
        for scales in ((1.0, 1e-3, 1e-6, 1e-6), (1e-6, 1.0, -1.0, 1e3), (1.0, -1.0, 1.0, -1.0)):
            p = torch.nn.Parameter(torch.zeros(64, dtype=torch.float64))
            opt = torch.optim.Adam([p], lr=1e-2, betas=betas, eps=0.0)
            for s in scales:
                p.grad = s * torch.randn(64, generator=gen, dtype=torch.float64)
                (bound,) = update_scale(opt, [p], {})
                before = p.detach().clone()
                opt.step()
                assert (p.detach() - before).abs().max().item() <= bound * (1 + 1e-12)


def test_oracle_on_target_gradients_is_marked_and_scaled():
    anchors = [(s.params, s.grads) for s in train(CASE).steps]
    traj = train(CASE, anchors, target_gradients=True)
    assert traj.on_target_gradients and not train(CASE).on_target_gradients
    for rec in traj.steps:
        assert len(rec.update_scale) == len(rec.params)
        assert all(s is not None and s > 0 for s in rec.update_scale)


def test_sharding_kinds_are_judged_on_their_own_gradients():
    assert KINDS["sharded"].on_target_gradients and KINDS["zero"].on_target_gradients
    assert not KINDS["ddp"].on_target_gradients and not KINDS["fsdp"].on_target_gradients


def test_reference_passes_and_decay_applied_twice_fails_only_at_the_derived_bound(
    world, monkeypatch
):
    """AdamW at lr 1e-3 and weight decay 0.1, float32: a wrapper that decays its shard and lets
    the wrapped optimizer decay it again is off by 1e-4 relative a step. The derived bound sees
    one such step by more than ten times; a free trajectory's fixed tolerance (1e-4 relative to
    the element and the tensor's largest) lets it through."""
    one = replace(CASE, steps=1)
    assert run_case(world, resolve_target("sharded"), CASE).ok
    mutant = mutant_target(MUTANTS["sharded-decay-applied-twice"])
    result = run_case(world, mutant, one)
    d = result.divergence_of("parameters")
    assert d is not None and d.max_abs_diff >= 10 * d.tolerance, result.describe()
    monkeypatch.setitem(KINDS, "sharded", replace(KINDS["sharded"], on_target_gradients=False))
    assert run_case(world, mutant, one).ok


def test_adam_is_drawn_below_float32_only_where_gradients_are_reported(world):
    """A sharding case keeps Adam in bf16; a ZeRO wrapper without full_gradients() is stepped
    with SGD (its step could only be judged on the oracle's gradients), and the reference
    sharded optimizer passes bf16 cases with Adam."""
    bf16 = next(
        with_precision(replace(CASE, seed=s), "bf16", adam=True)
        for s in range(100)
        if with_precision(replace(CASE, seed=s), "bf16").dtype == "bfloat16"
    )
    assert bf16.optimizer.name == "adamw"
    assert with_precision(bf16, "bf16").optimizer.name == "sgd"
    assert resolve_target("sharded").reports_gradients
    assert resolve_target("zero1").reports_gradients
    assert not Target("x", "torch.optim:SGD", "zero").reports_gradients
    result = run_case(world, resolve_target("sharded"), bf16)
    assert result.ok, result.describe()
