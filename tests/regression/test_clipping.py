"""Global gradient clipping (``Case.clip_norm``, Note [Clipping the global norm]): the oracle clips
as ``torch.nn.utils.clip_grad_norm_`` does; the built-in designs pass a clipped case, and a
sharded optimizer or ZeRO-1 that clips by its own shard's norm fails it.

Model: MLP 3 -> 4 -> 2 with biases (four parameters, two per rank), three ranks, float64, Adam."""

from dataclasses import replace

import pytest
import torch

from paracheck.cases import Case, GroupSpec, OptimizerSpec
from paracheck.check.run import run_case
from paracheck.check.targets import Target, resolve_target
from paracheck.mutants import MUTANTS
from paracheck.oracle.train import clip_global_norm, train
from paracheck.workloads import MLPSpec
from paracheck.zero import Zero1

CLIPPED = Case(
    model=MLPSpec(in_features=3, widths=(4, 2), bias=True),
    world_size=3,
    batch_sizes=(2, 1, 3),
    steps=2,
    optimizer=OptimizerSpec("adam", (GroupSpec(params=(), lr=1e-2),)),
    clip_norm=0.01,
)


class Zero1WithoutClip(Zero1):
    """A ZeRO-1 that offers no clip_grad_norm_: its full gradients exist on no rank."""

    clip_grad_norm_ = None


def test_oracle_clips_as_torch_does():
    gen = torch.Generator().manual_seed(0)
    grads = [torch.randn(5, 3, generator=gen, dtype=torch.float64) for _ in range(3)]
    params = [torch.zeros_like(g, requires_grad=True) for g in grads]
    for p, g in zip(params, grads):
        p.grad = g.clone()
    torch.nn.utils.clip_grad_norm_(params, 0.5)
    ours = [g.clone() for g in grads]
    clip_global_norm(ours, 0.5)
    for p, g in zip(params, ours):
        assert torch.equal(p.grad, g)


def test_the_clip_acts_in_every_step_of_the_pinned_case():
    """Every step's synchronised gradient has a norm of exactly the clip (it was larger)."""
    for record in train(CLIPPED).steps:
        norm = torch.linalg.vector_norm(torch.stack([g.norm() for g in record.grads]))
        assert norm.item() == pytest.approx(0.01, rel=1e-6)
    unclipped = train(replace(CLIPPED, clip_norm=None)).steps[0].grads
    assert torch.linalg.vector_norm(torch.stack([g.norm() for g in unclipped])).item() > 0.1


@pytest.mark.parametrize("name", ["bucketed", "naive", "sharded", "torch-zero", "zero1"])
def test_correct_designs_pass_a_clipped_case(world, name):
    result = run_case(world, resolve_target(name), CLIPPED)
    assert result.ok and "skipped" not in result.extra, result.describe()


@pytest.mark.parametrize("name", ["sharded-clip-local-norm", "zero1-clip-local-norm"])
def test_clipping_by_the_local_norm_fails(world, name):
    mutant = MUTANTS[name]
    target = Target(mutant.name, mutant.path, mutant.kind)
    result = run_case(world, target, CLIPPED)
    assert result.divergence is not None, result.describe()
    assert run_case(world, target, replace(CLIPPED, clip_norm=None)).ok


def test_a_zero_target_without_clip_grad_norm_skips_clipped_cases(world):
    target = Target("no-clip", f"{__name__}:Zero1WithoutClip", "zero")
    result = run_case(world, target, CLIPPED)
    assert "clip_grad_norm_" in result.extra.get("skipped", ""), result.describe()
    assert run_case(world, target, replace(CLIPPED, clip_norm=None)).ok


@pytest.mark.parametrize(
    "kwargs", [dict(clip_norm=0.0), dict(clip_norm=-1.0), dict(clip_norm=1.0, closure=True)]
)
def test_bad_clip_norms_are_refused(kwargs):
    with pytest.raises(ValueError, match="clip_norm"):
        replace(CLIPPED, **kwargs)
