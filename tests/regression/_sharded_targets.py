"""Sharded optimizers for the regression tests, importable by the rank processes."""

import torch

from paracheck.zero import ShardedOptimizer
from paracheck.zero.torch_zero import TorchZero


class UndeclaredTorchZero(TorchZero):
    """torch's ZeroRedundancyOptimizer behind the CS336 interface, declaring no partition, as a
    user's class does: it broadcasts frozen parameters too, which is correct but not the
    owner-broadcast model."""

    partition = None


class StaleCopyUndeclared(ShardedOptimizer):
    """A correct ``ShardedOptimizer`` that declares no partition and, once loaded, keeps the whole
    consolidated state it was loaded from, keyed by every parameter, on every rank, and never
    updates it (as ``torch.optim.Optimizer.load_state_dict`` into the wrapper would leave it): a
    stale copy costs memory but steps nothing twice."""

    partition = None

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)
        params = [p for g in self.param_groups for p in g["params"]]
        order = [i for g in state_dict["param_groups"] for i in g["params"]]
        self.loaded_from = torch.optim.SGD(params, lr=0.0)
        for i, p in zip(order, params):
            entry = state_dict["state"].get(i)
            if entry is not None:
                self.loaded_from.state[p] = {
                    k: v.detach().clone().to(p.device)
                    for k, v in entry.items()
                    if torch.is_tensor(v)
                }


class ConsolidatesEverywhere(TorchZero):
    """torch's ZeroRedundancyOptimizer whose ``state_dict()`` is itself a collective on every
    rank (``consolidate_state_dict(to=0)``, then a broadcast of rank 0's dict) while it still has
    ``consolidate_state_dict``: the check must ask every rank, not only the receiving one.
    Declares no partition, as a user's class does (torch broadcasts frozen parameters too)."""

    partition = None

    def state_dict(self) -> dict:
        import torch.distributed as dist

        self.consolidate_state_dict(to=0)
        box = [super().state_dict() if self.rank == 0 else None]
        if self.world_size > 1:
            dist.broadcast_object_list(box, src=0)
        return box[0]
