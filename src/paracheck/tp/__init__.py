"""Tensor parallelism on a 2-D mesh ``("dp", "tp")``: the cases the ``tp`` kind draws
(``TPCase``) and paracheck's reference plans, ``plan(model, mesh) -> model``, that apply torch's
``parallelize_module`` styles to a case's model over ``mesh["tp"]``.

A plan must leave the model computing what the unparallelised model computes: the ``tp`` kind's
rank program (``paracheck.check.ranks.tp``) trains the planned model on every rank of the mesh
and compares the gathered parameters and gradients with the single-process float64 oracle.

Note [A tensor-parallel case]
    A ``TPCase`` of ``world_size`` W and ``tensor_parallel`` T runs W ranks as the mesh
    (W // T, T) named ("dp", "tp"); rank r is mesh coordinate (r // T, r % T). The oracle trains
    the W-rank data-parallel case unchanged: each of the W ranks has its own batch and the
    gradient is the mean over the W per-rank mean losses. A tensor-parallel group holds one model
    replica, so it computes the batches of its T members at once: every rank of group d feeds the
    concatenation of ranks dT .. dT+T-1's batches and minimises the mean over the T members of
    each one's mean loss (the oracle's loss, T of its ranks at a time). The rank program then
    averages the gradients over the "dp" dimension (a data dimension of none: the plan owns the
    tensor parallelism only). So every mesh shape of W ranks is judged against one oracle, and a
    tensor-parallel group that computes anything but the whole model's gradient is told apart
    from one that does.
"""

from __future__ import annotations

from dataclasses import dataclass

from paracheck.cases import Case

__all__ = ["TPCase", "mlp_plan", "parallelize_mlp"]


@dataclass(frozen=True)
class TPCase(Case):
    """A ``Case`` trained on the mesh (world_size // tensor_parallel, tensor_parallel) (Note [A
    tensor-parallel case]); ``sequence_parallel``: the plan is asked to keep the activations
    between its tensor-parallel pairs sharded along their first (sequence) dimension, where it
    takes ``sequence_parallel=``."""

    tensor_parallel: int = 1
    sequence_parallel: bool = False

    def __post_init__(self):
        super().__post_init__()
        if self.tensor_parallel < 1 or self.world_size % self.tensor_parallel:
            raise ValueError(
                f"tensor_parallel={self.tensor_parallel} must be >= 1 and divide "
                f"world_size={self.world_size}"
            )

    @property
    def mesh_shape(self) -> tuple[int, int]:
        """(dp, tp): the mesh's data and tensor dimensions."""
        return self.world_size // self.tensor_parallel, self.tensor_parallel

    def with_world_size(self, w: int) -> TPCase:
        """The same case on ``w`` ranks (``Case.with_world_size``), its tensor dimension kept
        where it divides ``w``, else 1."""
        from dataclasses import replace
        from typing import cast

        tp = self.tensor_parallel if w % self.tensor_parallel == 0 else 1
        return cast(TPCase, super(TPCase, replace(self, tensor_parallel=tp)).with_world_size(w))


def _styles(n_layers: int, sequence_parallel: bool, colwise, rowwise, replicated) -> dict:
    """The plan of an MLP chain of ``n_layers`` Linear layers: column-wise then row-wise for each
    pair, and a last layer of an odd chain replicated under ``SequenceParallel`` on the rows
    (Note [The MLP chain's plan])."""
    from torch.distributed.tensor import Replicate, Shard

    if n_layers < 2:
        raise ValueError(
            f"n_layers={n_layers}: a tensor-parallel MLP chain needs a column-wise and a "
            "row-wise layer (>= 2 layers)"
        )
    pairs = n_layers // 2
    rows = Shard(0)
    plan: dict = {}
    for i in range(pairs):
        last_pair = i == pairs - 1 and n_layers % 2 == 0
        plan[f"layers.{2 * i}"] = colwise(
            input_layouts=rows if sequence_parallel and i > 0 else Replicate()
        )
        plan[f"layers.{2 * i + 1}"] = rowwise(
            output_layouts=rows if sequence_parallel and not last_pair else Replicate(),
            use_local_output=False,
        )
    if n_layers % 2:
        plan[f"layers.{n_layers - 1}"] = replicated(sequence_dim=0)
    return plan


# Note [The MLP chain's plan]
#   Layers 2i and 2i+1 of ``paracheck.workloads.MLP`` are a column-wise layer (its weight's
#   rows and its bias sharded: each rank computes some features) and a row-wise layer (its
#   weight's columns sharded, its bias replicated: the ranks' partial products summed), the
#   tanh between them elementwise on the sharded features. The row-wise output stays a DTensor
#   (``use_local_output=False``): replicated (an all-reduce), or, with sequence parallelism,
#   sharded along the rows (a reduce-scatter) and gathered again by the next column-wise layer;
#   rows of any count, even or not, since the DTensor knows the whole shape. The last layer of an
#   odd chain is replicated under ``SequenceParallel(sequence_dim=0)``: each rank applies it to
#   its rows, as a sequence-parallel norm is applied, and its parameters' gradients are the
#   ranks' partial sums all-reduced. The model's output is then a DTensor sharded along the
#   rows, which the rank program gathers (``full_tensor()``).


def parallelize_mlp(model, mesh, *, sequence_parallel: bool, colwise, rowwise, replicated):
    """Parallelise an MLP chain over ``mesh["tp"]`` with the style classes given (torch's, or
    a mutant's subclasses of them: ``paracheck.mutants.tp``); returns the model."""
    from torch.distributed.tensor.parallel import parallelize_module

    plan = _styles(len(model.layers), sequence_parallel, colwise, rowwise, replicated)
    parallelize_module(model, mesh["tp"], plan)
    return model


def mlp_plan(model, mesh, *, sequence_parallel: bool = False):
    """Parallelise an MLP chain (``paracheck.workloads.MLP``) over ``mesh["tp"]`` with torch's
    ``ColwiseParallel``, ``RowwiseParallel`` and ``SequenceParallel`` (Note [The MLP chain's
    plan]); returns the model. Equals the unparallelised model up to the order of its sums; its
    gradients are clipped by ``torch.nn.utils.clip_grad_norm_``, whose norm counts every
    shard."""
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
    )

    return parallelize_mlp(
        model,
        mesh,
        sequence_parallel=sequence_parallel,
        colwise=ColwiseParallel,
        rowwise=RowwiseParallel,
        replicated=SequenceParallel,
    )
