"""TorchZero: torch's ``ZeroRedundancyOptimizer`` under the CS336 ``ShardedOptimizer`` interface,
so that paracheck checks it exactly like ``ShardedOptimizer`` (target ``torch-zero``).

The adapter changes nothing in torch's algorithm (partition, local step, broadcasts). It adds
``partition``, torch's owner of every parameter, and takes groups of generators. Its
``state_dict()`` is torch's: ``consolidate_state_dict(to=0)`` first, then rank 0's, as the check
reads any target that has ``consolidate_state_dict`` (Note [State dict conventions]). What paracheck found about torch's design is in
``docs/findings-torch-zero.md``.
"""

from __future__ import annotations

import torch
from torch.distributed.optim import ZeroRedundancyOptimizer

from paracheck.zero.partition import ParamPartition

__all__ = ["TorchZero"]


class TorchZero(ZeroRedundancyOptimizer):
    """``ZeroRedundancyOptimizer(params, optimizer_cls, **kwargs)``; same contract as
    ``ShardedOptimizer`` (torch: each rank steps the parameters its greedy-by-numel partition
    gives it, then every parameter is broadcast from its owner).

    Collectives every rank must call: ``step()`` and ``consolidate_state_dict()``.
    """

    # torch refuses parameters of two dense types ("only supports using the same dense type for
    # all parameters"): the check skips such a case with this note.
    unsupported_case_features = {
        "float32_layer": "torch's ZeroRedundancyOptimizer needs one dtype for all parameters"
    }

    def __init__(
        self, params, optimizer_cls: type[torch.optim.Optimizer], *, process_group=None, **kwargs
    ):
        # torch reads each group's "params" before it hands the same dicts to torch.optim.Optimizer:
        # a group whose params is a generator arrives there empty, and its parameters are never
        # trained, silently (a finding of paracheck's groups-of-generators cases). Lists go in.
        params = [dict(g, params=list(g["params"])) if isinstance(g, dict) else g for g in params]
        super().__init__(params, optimizer_cls, process_group=process_group, **kwargs)

    @property
    def local_optimizer(self) -> torch.optim.Optimizer:
        return self.optim

    @property
    def partition(self) -> ParamPartition:
        """torch's owner of each parameter of ``param_groups`` (flattened); sizes as paracheck
        weighs them (bytes if trainable, else 0), so that the balance property judges torch's
        partition by the state it causes."""
        owner = self._param_to_rank
        params = [p for g in self.param_groups for p in g["params"]]
        sizes = [p.numel() * p.element_size() if p.requires_grad else 0 for p in params]
        return ParamPartition(self.world_size, tuple(sizes), tuple(owner[p] for p in params))
