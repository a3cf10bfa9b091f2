"""Overlapped, bucketed and torch DDP equal the single-process oracle; the bucketed variant keeps
its gradients as views into its bucket buffers (a parameter alone in its bucket: where autograd put
it); several backward passes may precede one finish.

The equivalence checks run on the session World (world sizes 1..6, gloo, float64, the ci
profile). The in-process tests run without torch.distributed (world size 1: the collectives are
skipped, the bookkeeping is the same) and pin what the oracle cannot see: memory layout, error
messages, the ``no_sync()`` context.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings

from paracheck.ddp import FlatDDP, NaiveDDP
from paracheck.ddp.bucketed import BucketedDDP
from paracheck.ddp.overlapped import OverlappedDDP
from paracheck.strategies import mlp_specs
from paracheck.workloads import MLPSpec, build_model


def test_overlapped_matches_oracle(paracheck_check):
    """OverlappedDDP equals the oracle on generated cases (world sizes 1..6)."""
    paracheck_check("overlapped")


def test_bucketed_matches_oracle(paracheck_check):
    """BucketedDDP equals the oracle on generated cases, bucket caps from 1 byte to the whole model."""
    paracheck_check("bucketed")


def test_torch_ddp_matches_oracle(paracheck_check):
    """torch's DistributedDataParallel (find_unused_parameters=True) equals the oracle."""
    paracheck_check("torch-ddp")


# -- in process: layout and protocol ---------------------------------------------------------


def grads_are_bucket_views(ddp, produced: dict[int, int] | None = None) -> bool:
    """Every trainable parameter's gradient lives in its bucket: a view of the bucket's flat buffer
    or, alone in its bucket (Note [A bucket of one parameter]), where autograd put it (``produced``
    maps a parameter's index to the address of the gradient its hook saw)."""
    if not isinstance(ddp, BucketedDDP):
        return False
    for i, p in enumerate(ddp.trainable):
        if p.grad is None:
            return False
        buf = ddp._bucket_buffers[ddp._bucket_of[i]]
        if buf is not None:
            if p.grad.untyped_storage().data_ptr() != buf.untyped_storage().data_ptr():
                return False
        elif produced is not None and p.grad.data_ptr() != produced[i]:
            return False
    return True


def _record_produced(model) -> dict[int, int]:
    """Index of each trainable parameter -> address of the gradient autograd accumulated, seen by
    a hook registered before any wrapper's (hooks run in the order they were registered)."""
    produced: dict[int, int] = {}
    trainable = [p for p in model.parameters() if p.requires_grad]
    for i, p in enumerate(trainable):
        p.register_post_accumulate_grad_hook(
            lambda p, i=i: produced.__setitem__(i, p.grad.data_ptr())
        )
    return produced


def _step(ddp, x):
    ddp(x).square().mean().backward()
    ddp.finish_gradient_synchronization()


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(mlp_specs().filter(lambda m: m.unused == "none"))
def test_bucketed_grads_are_views_into_bucket_buffers(spec):
    """After backward every gradient is a view of a bucket buffer, or, alone in its bucket, the
    tensor autograd made: also after zero_grad either way."""
    model = build_model(spec, seed=0)
    produced = _record_produced(model)
    ddp = BucketedDDP(model, bucket_size_mb=40 / 2**20)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(
        3, spec.in_features, dtype=torch.float64, generator=torch.Generator().manual_seed(0)
    )
    for set_to_none in (True, False, True):
        opt.zero_grad(set_to_none=set_to_none)
        _step(ddp, x)
        assert grads_are_bucket_views(ddp, produced)
        opt.step()


def test_view_property_catches_copying_variants():
    """The layout check fails for a variant that reduces gradients where autograd put them."""
    spec = MLPSpec(in_features=3, widths=(2,))
    for cls in (OverlappedDDP, FlatDDP):
        ddp = cls(build_model(spec, seed=0))
        _step(ddp, torch.ones(2, 3, dtype=torch.float64))
        assert not grads_are_bucket_views(ddp)


class _CopiesLoneGradients(BucketedDDP):
    """Reduces a parameter alone in its bucket from a copy of its gradient."""

    def _launch(self, k: int) -> None:
        for i in self.plan.buckets[k].params:
            p = self.trainable[i]
            if self._bucket_buffers[k] is None and p.grad is not None:
                p.grad = p.grad.clone()
        super()._launch(k)


def test_view_property_catches_a_copy_of_a_lone_gradient():
    """The layout check fails where a parameter alone in its bucket is reduced from a copy."""
    for cls, expected in ((BucketedDDP, True), (_CopiesLoneGradients, False)):
        model = build_model(MLPSpec(in_features=3, widths=(4, 2)), seed=0)
        produced = _record_produced(model)
        ddp = cls(model, bucket_size_mb=40 / 2**20)  # 5 float64 elements: several lone weights
        assert any(buf is None for buf in ddp._bucket_buffers)
        _step(ddp, torch.ones(2, 3, dtype=torch.float64))
        assert grads_are_bucket_views(ddp, produced) is expected


def test_bucketed_accumulates_in_place_across_micro_steps():
    """After the first micro-step the gradients are bucket views, and later micro-steps add into them."""
    model = build_model(MLPSpec(in_features=3, widths=(4, 2)), seed=0)
    ddp = BucketedDDP(model, bucket_size_mb=1.0)
    x = torch.ones(2, 3, dtype=torch.float64)
    with ddp.no_sync():
        ddp(x).sum().backward()
    first = [p.grad for p in model.parameters()]
    ddp(x).sum().backward()
    ddp.finish_gradient_synchronization()
    assert all(a is p.grad for a, p in zip(first, model.parameters()))
    assert grads_are_bucket_views(ddp)


def test_bucketed_unused_parameter_keeps_no_gradient():
    """A parameter no forward used ends with grad None, although a zeroed view was attached."""
    model = build_model(MLPSpec(in_features=3, widths=(2,), unused="always"), seed=0)
    ddp = BucketedDDP(model, bucket_size_mb=1.0)
    _step(ddp, torch.ones(2, 3, dtype=torch.float64))
    grads = {n: p.grad for n, p in model.named_parameters()}
    assert grads["branch.weight"] is None and grads["branch.bias"] is None
    assert grads["layers.0.weight"] is not None


def test_bucketed_eval_forward_attaches_no_gradient():
    """A forward under torch.no_grad() does not give parameters (zero) gradients."""
    model = build_model(MLPSpec(in_features=3, widths=(2,)), seed=0)
    ddp = BucketedDDP(model, bucket_size_mb=1.0)
    with torch.no_grad():
        ddp(torch.ones(1, 3, dtype=torch.float64))
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize("bad", [0, -1, math.nan, math.inf])
def test_bucketed_refuses_invalid_bucket_size(bad):
    """bucket_size_mb <= 0, NaN or infinite is refused with the argument, its value and the rule."""
    model = build_model(MLPSpec(), seed=0)
    with pytest.raises(ValueError, match=r"bucket_size_mb=.* must be a finite number > 0"):
        BucketedDDP(model, bucket_size_mb=bad)


@pytest.mark.parametrize("cls", [NaiveDDP, FlatDDP, OverlappedDDP, BucketedDDP])
def test_no_sync_restores_state_on_exception(cls):
    """An exception inside no_sync() leaves synchronisation enabled again."""
    ddp = cls(build_model(MLPSpec(), seed=0))
    with pytest.raises(KeyError):
        with ddp.no_sync():
            assert not ddp._sync_enabled
            raise KeyError("inside")
    assert ddp._sync_enabled


@pytest.mark.parametrize("cls", [NaiveDDP, FlatDDP, OverlappedDDP, BucketedDDP])
def test_several_backwards_before_one_finish_sum_their_gradients(cls):
    """Two forward/backward pairs, then a second backward of one graph, then one finish: .grad is
    the sum of the four gradients, as in single-process training (the same bookkeeping as W > 1)."""
    spec = MLPSpec(in_features=3, widths=(4, 2), tied=True)
    model, reference = build_model(spec, seed=0), build_model(spec, seed=0)
    ddp = cls(model)
    xs = [
        torch.randn(2, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(k))
        for k in range(3)
    ]
    for net in (ddp, reference):
        net(xs[0]).square().mean().backward()
        net(xs[1]).square().mean().backward()
        loss = net(xs[2]).square().mean()
        loss.backward(retain_graph=True)
        loss.backward()
    ddp.finish_gradient_synchronization()
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-12, atol=0)


@pytest.mark.parametrize(
    "wrap",
    [lambda m: BucketedDDP(m, bucket_size_mb=8 / 2**20), OverlappedDDP],  # 8 bytes: all alone
    ids=["bucketed", "overlapped"],
)
def test_a_lone_gradient_is_reduced_as_one_contiguous_tensor(wrap):
    """A gradient reduced where it lies (OverlappedDDP's, or BucketedDDP's alone in its bucket)
    that follows non-contiguous strides (a transposed parameter) or is sparse is reduced as a
    dense contiguous copy: a collective takes one (``reducible_grad``)."""
    dense = torch.nn.Parameter(torch.randn(4, 3, dtype=torch.float64).t())  # strides (1, 3)
    emb = torch.nn.Embedding(5, 2, sparse=True).double()
    module = torch.nn.Module()
    module.w, module.emb = dense, emb
    ddp = wrap(module)
    assert not dense.is_contiguous()
    if isinstance(ddp, BucketedDDP):
        assert all(buf is None for buf in ddp._bucket_buffers)
    loss = (torch.ones(2, 3, dtype=torch.float64) @ dense).sum() + emb(torch.tensor([1, 3])).sum()
    loss.backward()
    ddp.finish_gradient_synchronization()
    assert dense.grad.is_contiguous() and emb.weight.grad.layout == torch.strided
    assert torch.equal(dense.grad, torch.full((3, 4), 2.0, dtype=torch.float64))
    assert torch.equal(
        emb.weight.grad.sum(dim=1), torch.tensor([0.0, 2, 0, 2, 0], dtype=torch.float64)
    )
