"""Broken tensor-parallel plans (the ``tp`` kind), each from a bug reported against tensor
parallelism in public trackers: paracheck's reference ``paracheck.tp.mlp_plan`` minus one thing,
a subclass of one of torch's styles overriding one step, the bug marked ``BUG``. Checked by
``paracheck check PATH --kind tp`` (``TP_MUTANTS``: each killed by the default verdict table,
``tests/property/test_tp.py``), not by the selftest, whose kinds they are not."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.tensor import DTensor, Partial, Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

from paracheck.tp import parallelize_mlp

__all__ = [
    "TP_MUTANTS",
    "TPMutant",
    "bias_on_every_rank_plan",
    "local_norm_clip_plan",
    "norm_grads_never_reduced_plan",
    "unreduced_input_grad_plan",
]


class _ReplicatedNoReduce(torch.autograd.Function):
    """A replicated DTensor made from this rank's tensor, whose backward returns its gradient's
    local part as it is: what ``to_local()`` without ``grad_placements`` does to a gradient that
    is partial on each rank."""

    @staticmethod
    def forward(ctx, local, mesh):
        return DTensor.from_local(local, mesh, [Replicate()], run_check=False)

    @staticmethod
    def backward(ctx, grad):
        return grad.to_local(), None  # BUG: partial sums, never all-reduced


class ColwiseInputNotReduced(ColwiseParallel):
    """A column-wise layer whose input's gradient (each rank's part: its features' contribution)
    is never all-reduced (reduce-scattered with sequence parallelism) in backward: every layer
    before it trains on one rank's part of the gradient."""

    @staticmethod
    def _prepare_input_fn(input_layouts, desired_input_layouts, mod, inputs, device_mesh):
        x = inputs[0]
        if isinstance(x, DTensor):
            x = x.redistribute(placements=desired_input_layouts).to_local()
        return _ReplicatedNoReduce.apply(x, device_mesh)


class RowwiseBiasOnEveryRank(RowwiseParallel):
    """A row-wise layer whose bias each rank adds to its partial product before the sum (placed
    ``Partial`` where torch places it ``Replicate``): the output carries the bias once per rank."""

    def _partition_linear_fn(self, name, module, device_mesh):
        super()._partition_linear_fn(name, module, device_mesh)
        if getattr(module, "bias", None) is not None:
            local = module.bias.to_local().detach()
            bias = DTensor.from_local(local, device_mesh, [Partial()], run_check=False)
            module.register_parameter("bias", nn.Parameter(bias))  # BUG: Partial, not Replicate


def _local_linear(mod, x):
    # BUG: to_local() without grad_placements: each rank's weight gradient, the sum over its own
    # rows, is taken for the replicated gradient and never all-reduced.
    bias = None if mod.bias is None else mod.bias.to_local()
    return nn.functional.linear(x, mod.weight.to_local(), bias)


class SequenceParallelLocal(SequenceParallel):
    """A sequence-parallel layer (a norm, in a transformer) that computes on its rows' shard with
    its replicated parameters' local tensors: each rank's weight gradient is the sum over its own
    rows, never all-reduced over the group, and the ranks' weights drift apart."""

    @staticmethod
    def _prepare_input_fn(sequence_sharding, mod, inputs, device_mesh):
        x = SequenceParallel._prepare_input_fn(sequence_sharding, mod, inputs, device_mesh)
        mod._tp_rows = x.shape[0]  # the whole rows, for the output's DTensor
        return x.to_local()

    @staticmethod
    def _prepare_output_fn(use_local_output, mod, outputs, device_mesh):
        shape = (mod._tp_rows, *outputs.shape[1:])
        stride = torch.empty(shape, device="meta").stride()
        out = DTensor.from_local(
            outputs, device_mesh, mod._tp_placements, run_check=False, shape=shape, stride=stride
        )
        return out.to_local() if use_local_output else out

    def _apply(self, module, device_mesh):
        module._tp_placements = self.sequence_sharding
        module = super()._apply(module, device_mesh)
        module.forward = functools.partial(_local_linear, module)
        return module


def _plan(model, mesh, sequence_parallel, **styles):
    torch_styles = {
        "colwise": ColwiseParallel,
        "rowwise": RowwiseParallel,
        "replicated": SequenceParallel,
    }
    return parallelize_mlp(
        model, mesh, sequence_parallel=sequence_parallel, **{**torch_styles, **styles}
    )


def unreduced_input_grad_plan(model, mesh, *, sequence_parallel: bool = False):
    """``mlp_plan`` with ``ColwiseInputNotReduced`` for the column-wise layers."""
    return _plan(model, mesh, sequence_parallel, colwise=ColwiseInputNotReduced)


def bias_on_every_rank_plan(model, mesh, *, sequence_parallel: bool = False):
    """``mlp_plan`` with ``RowwiseBiasOnEveryRank`` for the row-wise layers."""
    return _plan(model, mesh, sequence_parallel, rowwise=RowwiseBiasOnEveryRank)


def norm_grads_never_reduced_plan(model, mesh, *, sequence_parallel: bool = False):
    """``mlp_plan`` with ``SequenceParallelLocal`` for the replicated last layer of an odd chain."""
    return _plan(model, mesh, sequence_parallel, replicated=SequenceParallelLocal)


def _local_norm_clip(params: list, max_norm: float) -> None:
    grads = [p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad for p in params]
    grads = [g for g in grads if g is not None]
    total = torch.nn.utils.get_total_norm(grads)  # BUG: this rank's shards only
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)


def local_norm_clip_plan(model, mesh, *, sequence_parallel: bool = False):
    """``mlp_plan`` whose model clips its gradients (``clip_grad_norm_(max_norm)``) by the norm
    of this rank's shards, not of every shard: each rank scales by another factor."""
    model = _plan(model, mesh, sequence_parallel)
    params = list(model.parameters())
    model.clip_grad_norm_ = lambda max_norm: _local_norm_clip(params, max_norm)
    return model


@dataclass(frozen=True)
class TPMutant:
    """A broken plan and the bug, in one sentence."""

    name: str
    path: str
    bug: str


TP_MUTANTS: dict[str, TPMutant] = {
    m.name: m
    for m in (
        TPMutant(
            "tp-unreduced-input-grad",
            "paracheck.mutants.tp:unreduced_input_grad_plan",
            "a column-wise layer's input gradient is left partial on each rank (to_local() "
            "without grad_placements): the all-reduce (reduce-scatter) of backward is missing",
        ),
        TPMutant(
            "tp-local-norm-clip",
            "paracheck.mutants.tp:local_norm_clip_plan",
            "gradients clipped by the norm of this rank's shards, not of every shard",
        ),
        TPMutant(
            "tp-bias-on-every-rank",
            "paracheck.mutants.tp:bias_on_every_rank_plan",
            "a row-wise layer's bias is added by every rank before the sum: tp times over",
        ),
        TPMutant(
            "tp-norm-grads-never-reduced",
            "paracheck.mutants.tp:norm_grads_never_reduced_plan",
            "a sequence-parallel layer's parameters stay local: their gradients, each rank's "
            "rows only, are never all-reduced",
        ),
    )
}
