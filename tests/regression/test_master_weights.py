"""Master weights (Note [Master weights]): the oracle steps float32 copies of bfloat16
parameters, the reference ``MasterWeightsShardedOptimizer`` does the same, its masters survive
``state_dict()`` / ``load_state_dict()``, and a sharding target declares them by
``master_params()``.

Model: MLP 4 -> 5 -> 3 with biases, bfloat16 parameters, SGD at lr 1e-3 (updates below half a
bfloat16 ulp of most weights: what masters are for)."""

from dataclasses import replace

import pytest
import torch

from paracheck.cases import Case, GroupSpec, OptimizerSpec
from paracheck.check.ranks._optimizer import read_masters
from paracheck.check.targets import Target, resolve_target
from paracheck.oracle.tolerance import master_rtol, rounding_bracket
from paracheck.oracle.train import train
from paracheck.workloads import MLPSpec
from paracheck.zero import MasterWeightsShardedOptimizer, MasterWeightsZero1, ShardedOptimizer

CASE = Case(
    model=MLPSpec(in_features=4, widths=(5, 3), bias=True),
    world_size=2,
    batch_sizes=(2, 3),
    steps=4,
    dtype="bfloat16",
    optimizer=OptimizerSpec("sgd", (GroupSpec(params=(), lr=1e-3, momentum=0.9),)),
    seed=3,
    master_weights=True,
)


def test_master_weights_need_bfloat16_parameters():
    with pytest.raises(ValueError, match="master_weights=True with dtype='float32'"):
        replace(CASE, dtype="float32")


def test_oracle_masters_are_float32_and_round_to_the_parameters():
    """Every recorded master is float32, and each parameter is its master rounded to bfloat16."""
    traj = train(CASE)
    for rec in traj.steps:
        assert rec.masters is not None
        for m, p in zip(rec.masters, rec.params):
            assert m.dtype == torch.float32
            assert torch.equal(m.to(torch.bfloat16), p)


def test_oracle_masters_learn_what_bfloat16_parameters_lose():
    """At lr 1e-3 the masters move every step, while stepping the bfloat16 parameters themselves
    loses most updates: the two oracles end apart (what the property exists to tell)."""
    with_masters = train(CASE)
    without = train(replace(CASE, master_weights=False))
    moved = [
        (m - p0.float()).abs().max().item()
        for m, p0 in zip(with_masters.steps[-1].masters, with_masters.initial_params)
    ]
    assert min(moved) > 0
    differ = [
        not torch.equal(a, b)
        for a, b in zip(with_masters.steps[-1].params, without.steps[-1].params)
    ]
    assert any(differ)


def _reference(lr=1e-3):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3).to(torch.bfloat16)
    opt = MasterWeightsShardedOptimizer(model.parameters(), torch.optim.SGD, lr=lr, momentum=0.9)
    return model, opt


def _step(model, opt, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(6, 4, generator=g).to(torch.bfloat16)
    opt.zero_grad()
    model(x).float().square().mean().backward()
    opt.step()


def test_reference_steps_float32_masters_and_rounds_the_parameters():
    model, opt = _reference()
    before = [p.detach().float().clone() for p in model.parameters()]
    for s in range(3):
        _step(model, opt, s)
    masters = opt.master_params()
    assert all(m.dtype == torch.float32 for m in masters)
    assert all(torch.equal(m.to(torch.bfloat16), p) for m, p in zip(masters, model.parameters()))
    assert all((m - b).abs().max() > 0 for m, b in zip(masters, before))
    # The wrapped optimizer's state is the masters': float32.
    assert all(
        st["momentum_buffer"].dtype == torch.float32 for st in opt.local_optimizer.state.values()
    )


def test_reference_masters_survive_a_reload():
    """state_dict() carries the masters; a fresh instance that loads it continues exactly as the
    original does, not from the rounded parameters."""
    model, opt = _reference()
    _step(model, opt, 0)
    saved = opt.state_dict()
    assert set(saved["masters"]) == {0, 1}
    fresh = MasterWeightsShardedOptimizer(
        model.parameters(), torch.optim.SGD, lr=1e-3, momentum=0.9
    )
    fresh.load_state_dict(saved)
    for a, b in zip(fresh.master_params(), opt.master_params()):
        assert torch.equal(a, b)
    # A plain optimizer's dict (no masters) starts them from the parameters.
    plain = ShardedOptimizer(model.parameters(), torch.optim.SGD, lr=1e-3, momentum=0.9)
    plain.load_state_dict({k: v for k, v in saved.items() if k != "masters"})
    other = MasterWeightsShardedOptimizer(
        model.parameters(), torch.optim.SGD, lr=1e-3, momentum=0.9
    )
    other.load_state_dict(plain.state_dict())
    for m, p in zip(other.master_params(), model.parameters()):
        assert torch.equal(m, p.float())


def test_master_params_declares_master_weights():
    """A sharding target by master_params(); an FSDP by a constructor taking compute_dtype."""
    assert resolve_target("sharded-master").master_weights
    assert not resolve_target("sharded").master_weights
    assert Target("x", "paracheck.fsdp:FSDP", "fsdp").master_weights
    assert not Target("x", "tests.property._fsdp_jobs:OwnNames", "fsdp").master_weights


def test_masters_from_float32_start_as_the_float32_model():
    """Note [Compute dtype of an FSDP]: the masters start as the model built in float32 (not as
    its bfloat16 rounding), and every parameter is its master rounded once, at every step."""
    from paracheck.cases import build_case_model

    case = replace(CASE, masters_from_float32=True)
    float32 = [p.detach() for p in build_case_model(case, 0, masters=True).parameters()]
    assert all(p.dtype == torch.float32 for p in float32)
    traj = train(case)
    for p0, m in zip(traj.initial_params, float32):
        assert torch.equal(p0, m.to(torch.bfloat16))
    # The first step starts from the float32 masters: starting from the rounded ones differs.
    assert not all(
        torch.equal(a, b) for a, b in zip(traj.steps[0].masters, train(CASE).steps[0].masters)
    )
    for rec in traj.steps:
        for m, p in zip(rec.masters, rec.params):
            assert torch.equal(m.to(torch.bfloat16), p)
    with pytest.raises(ValueError, match="masters_from_float32=True needs master_weights=True"):
        replace(CASE, master_weights=False, masters_from_float32=True)


def test_read_masters_names_a_list_of_the_wrong_length():
    model, opt = _reference()
    opt.master_params = lambda: [None]
    index = {id(p): i for i, p in enumerate(model.parameters())}
    with pytest.raises(ValueError, match="returned 1 tensors for the 2 parameters"):
        read_masters(opt, index, 2)


def test_master_tolerance_is_derived_from_float32_roundoff():
    """2 * gamma_{16(k+1)} at u = 2**-24: about 1.9e-6 at step 0, growing linearly."""
    u = 2.0**-24
    assert master_rtol(0) == pytest.approx(2 * 16 * u / (1 - 16 * u))
    assert master_rtol(3) == pytest.approx(2 * 64 * u / (1 - 64 * u))
    assert master_rtol(0) < 2e-6


def test_a_lost_update_is_far_outside_the_master_tolerance():
    """At lr 1e-3, the update a bfloat16 master loses is at least ten times the allowed difference
    for the largest master of every weight matrix of the oracle's first step."""
    traj = train(CASE)
    for m, p0 in zip(traj.steps[0].masters, traj.initial_params):
        update = (m - p0.float()).abs().max().item()
        allowed = master_rtol(0) * 2 * max(m.abs().max().item(), p0.float().abs().max().item())
        assert update >= 10 * allowed, (update, allowed)


def _zero1_master(dtype=torch.bfloat16):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
    model = model.to(dtype)
    # A cap of 48 bytes: several buckets, so pieces start and end inside parameters.
    zero = MasterWeightsZero1(
        model, torch.optim.AdamW, lr=1e-3, weight_decay=0.1, bucket_size_mb=48 / 2**20
    )
    return model, zero


def _zero1_step(model, zero, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(6, 4, generator=g).to(next(model.parameters()).dtype)
    zero.zero_grad()
    model(x).float().square().mean().backward()
    zero.finish_gradient_synchronization()
    zero.step()


def test_zero1_masters_equal_the_sharded_reference_bit_for_bit():
    """One rank (Note [Zero1 master weights]): float32 masters and float32 AdamW state, the
    parameters their rounding, bit for bit what MasterWeightsShardedOptimizer computes."""
    model, zero = _zero1_master()
    torch.manual_seed(0)
    other = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
    other = other.to(torch.bfloat16)
    ref = MasterWeightsShardedOptimizer(
        other.parameters(), torch.optim.AdamW, lr=1e-3, weight_decay=0.1
    )
    assert len(zero.layout.buckets) >= 2
    for s in range(3):
        _zero1_step(model, zero, s)
        g = torch.Generator().manual_seed(s)
        x = torch.randn(6, 4, generator=g).to(torch.bfloat16)
        ref.zero_grad()
        other(x).float().square().mean().backward()
        ref.step()
    for a, b in zip(model.parameters(), other.parameters()):
        assert torch.equal(a, b)
    for a, b in zip(zero.master_params(), ref.master_params()):
        assert a.dtype == torch.float32 and torch.equal(a, b)
    for st in zero.state_dict()["state"].values():
        assert st["exp_avg"].dtype == torch.float32


def test_zero1_masters_survive_a_reload():
    """state_dict() carries the masters whole; a fresh wrapper that loads it continues from
    them, and a dict without them starts the masters from the parameters."""
    model, zero = _zero1_master()
    _zero1_step(model, zero, 0)
    saved = zero.state_dict()
    assert set(saved["masters"]) == {0, 1, 2, 3}
    masters = zero.master_params()
    assert any(not torch.equal(m, p.float()) for m, p in zip(masters, model.parameters()))
    fresh = MasterWeightsZero1(model, torch.optim.AdamW, lr=1e-3, weight_decay=0.1)
    fresh.load_state_dict(saved)
    for a, b in zip(fresh.master_params(), masters):
        assert torch.equal(a, b)
    plain = MasterWeightsZero1(model, torch.optim.AdamW, lr=1e-3, weight_decay=0.1)
    plain.load_state_dict({k: v for k, v in saved.items() if k != "masters"})
    for m, p in zip(plain.master_params(), model.parameters()):
        assert torch.equal(m, p.float())


def test_zero1_master_keeps_no_masters_of_float32_parameters():
    model, zero = _zero1_master(torch.float32)
    _zero1_step(model, zero, 0)
    assert zero.master_params() == [None] * 4 and "masters" not in zero.state_dict()
    assert resolve_target("zero1-master").master_weights


# Found by the bf16 nightly (seeds 32003): Zero1's clip scaled the masters' float32 gradient
# copies, not the reduced chunks, so the masters stepped on one gradient and full_gradients()
# reported another.
ZERO1_MASTER_CLIPPED = '{"model": {"kind": "mlp", "in_features": 2, "widths": [1], "bias": false, "frozen": [], "tied": false, "unused": "always", "buffer": false, "float32_layer": null}, "world_size": 3, "batch_sizes": [1, 1, 1], "steps": 1, "accumulation": 1, "no_sync": false, "optimizer": {"name": "sgd", "groups": [{"params": [0, 1], "lr": 0.05, "weight_decay": 0.1, "momentum": 0.0, "betas": [0.9, 0.999], "add_at_step": null}], "lr_decay": 1.0, "as_generator": false, "scheduler": null, "groups_as_generators": false}, "bucket_size_mb": 9.5367431640625e-07, "seed": 1811, "rank_dependent_init": false, "set_to_none": false, "dtype": "bfloat16", "merged_ranks": 1, "closure": false, "reload_at_step": null, "zero_grad_module": true, "finish_once": false, "double_backward": false, "unbounded_bucket": false, "clip_norm": 1.0, "autocast": null, "loss_scale": null, "loss": "rank-mean", "padded": false, "empty_micro": false, "last_window": null, "autocast_cache": true, "master_weights": true, "masters_from_float32": false, "prefetch": 0}'


def test_zero1_master_clips_the_chunks_its_masters_step_on(world):
    from paracheck.check.run import run_case

    case = Case.from_json(ZERO1_MASTER_CLIPPED)
    assert case.clip_norm is not None and case.master_weights and case.world_size == 3
    result = run_case(world, resolve_target("zero1-master"), case)
    assert result.ok, result.describe()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_rounding_bracket_holds_every_rounding_rule_and_nothing_else(dtype):
    """The bracket of a float32 master is the two values of the parameter dtype on either side
    of it: round to nearest, toward zero and away from zero all land in it, the next value out
    does not, and a representable master brackets itself alone."""
    g = torch.Generator().manual_seed(0)
    m = torch.randn(4096, generator=g) * torch.logspace(-3, 3, 4096)
    m[:4] = torch.tensor([0.0, 1.0, -2.0, 0.5])  # representable
    nearest, other = rounding_bracket(m, dtype)
    lo, hi = torch.minimum(nearest, other), torch.maximum(nearest, other)
    md = m.double()
    assert torch.all((lo.double() <= md) & (md <= hi.double()))
    assert torch.equal(nearest, m.to(dtype))
    exact = m == m.to(dtype).float()
    assert torch.equal(nearest[exact], other[exact]) and exact[:4].all()
    inexact = ~exact
    assert inexact.sum() > 4000
    up = torch.nextafter(lo[inexact], torch.full_like(lo[inexact], float("inf")))
    assert torch.equal(up, hi[inexact])  # adjacent values of the dtype
    toward_zero = torch.where(md.abs() < nearest.double().abs(), other, nearest)
    assert torch.all((toward_zero == nearest) | (toward_zero == other))
    below = torch.nextafter(lo, torch.full_like(lo, float("-inf")))
    assert torch.all((below != nearest) & (below != other))


def test_a_parameter_left_at_the_last_rounding_is_refused():
    """A bfloat16 parameter that is not one of its master's two neighbours fails the
    master-weights property with the element, the master and its bracket named; the same
    parameter rounded from its master passes."""
    from paracheck.check.properties.equivalence import _unrounded

    # bfloat16's gap at 1 is 2**-7: 1 + 1.5 * 2**-7 (and a little) lies between 1 + 2**-7 and
    # 1 + 2**-6, two gaps away from 1.
    m = torch.tensor([[1.0, 1.01171875 + 1e-4]], dtype=torch.float32)
    good = m.to(torch.bfloat16)
    assert _unrounded(0, 1, [good], [m]) is None
    stale = torch.tensor([[1.0, 1.0]], dtype=torch.bfloat16)
    d = _unrounded(3, 1, [stale], [m])
    assert d is not None and d.what == "master" and d.step == 3 and d.rank == 1
    assert "not its float32 master rounded: element 1" in d.detail, d.detail
