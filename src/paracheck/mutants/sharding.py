"""Broken optimizer-state sharding. Each class differs from ``ShardedOptimizer`` or ``Zero1`` by one
realistic bug (marked ``BUG``); the default check must kill every one (``tests/property/
test_sharding_mutants.py``), except ``sharded-state-dict-local``, whose per-rank ``state_dict()`` the
interface allows: only the opt-in ``state-consolidated`` property refuses it. Several are invisible to
equivalence alone: ``sharded-no-shard`` trains correctly while sharding nothing,
``sharded-count-partition`` trains correctly while piling state on one rank; the ``memory`` and
``balance`` properties exist for them. The last six each need one protocol of the generated cases
(``paracheck.strategies._sharding``): zero_grad between steps, an LR scheduler, groups of generators,
a rank that owns nothing, ``step(closure)``, ``load_state_dict`` into a fresh instance.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from paracheck.zero.partition import ParamPartition
from paracheck.zero.sharded import ShardedOptimizer, _param_weight
from paracheck.zero.zero1 import Zero1

__all__ = [
    "BroadcastFromRankZero",
    "CountPartition",
    "FirstGroupHyperparameters",
    "HyperparametersDropped",
    "LateGroupNotStepped",
    "LocalStateDict",
    "LrNotSynced",
    "NoShard",
    "Zero1AccumulationOverwrites",
    "Zero1LocalStateDict",
    "Zero1NoAverage",
    "Zero1NoInitialBroadcast",
    "Zero1StepsUnused",
    "ZeroGradLocalShard",
    "HyperparametersSyncedBackwards",
    "GroupGeneratorsConsumed",
    "EmptyShardRaises",
    "ClosureIgnored",
    "LoadStateDictSkipsWrapped",
]


# -- owner-broadcast ShardedOptimizer -----------------------------------------------------------


class BroadcastFromRankZero(ShardedOptimizer):
    """Every parameter is broadcast from rank 0 instead of from its owner."""

    def _broadcast_parameters(self) -> None:
        if self.world_size == 1:
            return
        handles = []
        for p, _owner in zip(self._params, self._partition.owners):
            if not p.requires_grad:
                continue
            handles.append(
                dist.broadcast(
                    p.detach(),
                    src=self._source(0),  # BUG: src should be the owner
                    group=self.process_group,
                    async_op=True,
                )
            )
        for h in handles:
            h.wait()


class LateGroupNotStepped(ShardedOptimizer):
    """A group added after construction is partitioned, but no rank's wrapped optimizer gets it."""

    def __init__(self, params, optimizer_cls, **kwargs):
        self._constructed = False
        super().__init__(params, optimizer_cls, **kwargs)
        self._constructed = True

    def add_param_group(self, param_group: dict) -> None:
        if not self._constructed:
            return super().add_param_group(param_group)
        torch.optim.Optimizer.add_param_group(self, param_group)
        params = self.param_groups[-1]["params"]
        self._partition = self._extend_partition(params)
        self._params.extend(params)
        # BUG: self.local_optimizer.add_param_group(...) is only reached from the constructor


class HyperparametersDropped(ShardedOptimizer):
    """The wrapped optimizer gets this rank's parameters without their group's hyper-parameters."""

    def add_param_group(self, param_group: dict) -> None:
        torch.optim.Optimizer.add_param_group(self, param_group)
        group = self.param_groups[-1]
        params = group["params"]
        self._partition = self._extend_partition(params)
        self._params.extend(params)
        owners = self._partition.owners[len(self._partition.owners) - len(params) :]
        local = {
            "params": [p for p, o in zip(params, owners) if o == self.rank]
        }  # BUG: options not copied
        if self.local_optimizer is None:
            self.local_optimizer = self.optimizer_cls([local], **self._kwargs)
        else:
            self.local_optimizer.add_param_group(local)

    def _sync_hyperparameters(self) -> None:
        pass  # consistent with the bug: the wrapped groups are never told about the options


class FirstGroupHyperparameters(ShardedOptimizer):
    """All of this rank's parameters go into one wrapped group with the first group's options."""

    def add_param_group(self, param_group: dict) -> None:
        torch.optim.Optimizer.add_param_group(self, param_group)
        group = self.param_groups[-1]
        params = group["params"]
        self._partition = self._extend_partition(params)
        self._params.extend(params)
        owners = self._partition.owners[len(self._partition.owners) - len(params) :]
        mine = [p for p, o in zip(params, owners) if o == self.rank]
        if self.local_optimizer is None:
            local = {k: v for k, v in group.items() if k != "params"}
            local["params"] = mine
            self.local_optimizer = self.optimizer_cls([local], **self._kwargs)
        else:
            self.local_optimizer.param_groups[0]["params"].extend(
                mine
            )  # BUG: later groups' options lost
        for k, v in self.local_optimizer.param_groups[0].items():
            if k != "params":
                group.setdefault(k, v)


class CountPartition(ShardedOptimizer):
    """Parameters dealt round-robin by index (``params[rank::world_size]``), ignoring their sizes."""

    def _extend_partition(self, params):
        before = self._partition
        n = len(before.owners)
        owners = tuple(
            (n + j) % self.world_size for j in range(len(params))
        )  # BUG: by count, not size
        return ParamPartition(
            self.world_size,
            before.sizes + tuple(_param_weight(p) for p in params),
            before.owners + owners,
        )


class LocalStateDict(ShardedOptimizer):
    """``state_dict()`` is torch's own, which only sees this rank's shard of the state: allowed by
    the interface (per-rank shards), refused by the opt-in ``state-consolidated`` property."""

    state_dict = (
        torch.optim.Optimizer.state_dict
    )  # BUG (for state-consolidated only): not consolidated


class LrNotSynced(ShardedOptimizer):
    """Learning rates changed through ``param_groups`` (an LR scheduler) never reach the wrapped optimizer."""

    def step(self, closure=None, **kwargs):
        # BUG: no self._sync_hyperparameters()
        loss = (
            self.local_optimizer.step(**kwargs)
            if closure is None
            else self.local_optimizer.step(closure, **kwargs)
        )
        self._broadcast_parameters()
        return loss


class ZeroGradLocalShard(ShardedOptimizer):
    """``zero_grad()`` clears only the gradients of this rank's shard (the wrapped optimizer's): the
    other parameters carry their gradient into the next step."""

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.local_optimizer.zero_grad(
            set_to_none=set_to_none
        )  # BUG: not every parameter of param_groups


class HyperparametersSyncedBackwards(ShardedOptimizer):
    """Before each step the hyper-parameters are copied from the wrapped optimizer's groups into
    ``param_groups``, the wrong way: an LR scheduler's lr, set in ``param_groups``, is overwritten."""

    def _sync_hyperparameters(self) -> None:
        for group, local in zip(self.param_groups, self.local_optimizer.param_groups):
            group.update(
                {k: v for k, v in local.items() if k not in ("params", "param_names")}
            )  # BUG: backwards


class GroupGeneratorsConsumed(ShardedOptimizer):
    """The groups are read once to size the partition, then the same dicts go to torch's
    constructor: a group whose ``params`` is a generator arrives there empty (what torch's own
    ZeroRedundancyOptimizer does)."""

    def __init__(self, params, optimizer_cls, **kwargs):
        params = list(params)
        # BUG: iterates each group's "params", which a generator allows only once
        self.planned_numel = sum(
            p.numel() for g in params for p in (g["params"] if isinstance(g, dict) else [g])
        )
        super().__init__(params, optimizer_cls, **kwargs)


class EmptyShardRaises(ShardedOptimizer):
    """The wrapped optimizer is built from the flat list of this rank's parameters: on a rank that
    owns none of the first group, torch raises "optimizer got an empty parameter list"."""

    def add_param_group(self, param_group: dict) -> None:
        options = {**self._kwargs, **{k: v for k, v in param_group.items() if k != "params"}}
        super().add_param_group(param_group)
        if len(self.param_groups) == 1:
            mine = self.local_optimizer.param_groups[0]["params"]
            self.local_optimizer = self.optimizer_cls(
                mine, **options
            )  # BUG: a bare list, empty on some ranks


class ClosureIgnored(ShardedOptimizer):
    """``step(closure)`` accepts a closure and never calls it."""

    def step(self, closure=None, **kwargs):
        return super().step(**kwargs)  # BUG: closure dropped


class LoadStateDictSkipsWrapped(ShardedOptimizer):
    """``load_state_dict()`` is torch's own: it fills the wrapper's ``state`` and groups, and the
    wrapped optimizer, which steps, starts over from empty state."""

    load_state_dict = (
        torch.optim.Optimizer.load_state_dict
    )  # BUG: the wrapped optimizer is never loaded


class NoShard(ShardedOptimizer):
    """Every rank builds the wrapped optimizer over *all* parameters (then broadcasts its own):
    trains correctly, shards nothing."""

    def add_param_group(self, param_group: dict) -> None:
        torch.optim.Optimizer.add_param_group(self, param_group)
        group = self.param_groups[-1]
        self._partition = self._extend_partition(group["params"])
        self._params.extend(group["params"])
        local = {k: v for k, v in group.items() if k != "params"}
        local["params"] = list(group["params"])  # BUG: not only the owned ones
        if self.local_optimizer is None:
            self.local_optimizer = self.optimizer_cls([local], **self._kwargs)
        else:
            self.local_optimizer.add_param_group(local)
        for k, v in self.local_optimizer.param_groups[-1].items():
            if k != "params":
                group.setdefault(k, v)


# -- Zero1 --------------------------------------------------------------------------------------


class Zero1NoAverage(Zero1):
    """The reduce-scattered gradient chunks are sums over ranks, never divided by the world size."""

    def finish_gradient_synchronization(self) -> None:
        if not self._sync_enabled:
            return
        for i, p in enumerate(self.trainable):
            if not self._fired[i] and p.grad is not None:
                self._take_grad(i, p)
        for b in range(self._next, len(self.layout.buckets)):
            self._launch(b)
        if self.world_size > 1:
            dist.all_reduce(self._present, group=self.process_group)
        for b, handle in self._inflight:
            if handle is not None:
                handle.wait()
            shard = self._grad_shard[
                b
            ]  # BUG: no .div_(self.world_size): the chunk stays a sum over ranks
            if self._saved[b] is not None:
                shard.add_(self._saved[b])
        for i, flag in enumerate(self._present.tolist()):
            if flag:
                self._has_grad[i] = True
        self._attach_piece_grads()
        self._reset_round()


class Zero1StepsUnused(Zero1):
    """Every piece always gets its chunk as gradient: parameters no rank used are stepped with
    zeros (momentum, Adam's moments and weight decay then move them)."""

    def _attach_piece_grads(self) -> None:
        for k in range(len(self.pieces)):
            self._piece_params[k].grad = self._piece_grads[k]  # BUG: ignores the presence flags


class Zero1NoInitialBroadcast(Zero1):
    """The flat buffers are filled from each rank's own initial parameters: no broadcast from rank 0."""

    def _broadcast_module(self) -> None:
        pass  # BUG


class Zero1AccumulationOverwrites(Zero1):
    """A second synchronisation in one step (accumulation without ``no_sync()``) overwrites the
    chunk instead of adding to it: the in-place reduce-scatter's chunk lives inside the gradient
    buffer, and the accumulated chunk is not saved before the next round's hooks write over it."""

    def _start_bucket(self, b: int) -> None:
        self._started[b] = (
            True  # BUG: no self._saved[b] = self._grad_shard[b].clone() when not fresh
        )


class Zero1LocalStateDict(Zero1):
    """``state_dict()`` never gathers the other ranks' pieces."""

    def _gather_object(self, obj) -> list:
        return [obj]  # BUG: no all_gather_object


from paracheck.mutants import register  # noqa: E402  (after the classes: paracheck.mutants imports us)

_M = "paracheck.mutants.sharding"
register(
    "sharded-broadcast-from-rank0",
    f"{_M}:BroadcastFromRankZero",
    "sharded",
    "after the step every parameter is broadcast from rank 0 instead of from its owner",
)
register(
    "sharded-late-group-not-stepped",
    f"{_M}:LateGroupNotStepped",
    "sharded",
    "a group added after construction is partitioned but given to no rank's wrapped optimizer",
)
register(
    "sharded-hyperparams-dropped",
    f"{_M}:HyperparametersDropped",
    "sharded",
    "the wrapped optimizer's groups get the parameters but not their lr / weight decay / betas",
)
register(
    "sharded-first-group-hyperparams",
    f"{_M}:FirstGroupHyperparameters",
    "sharded",
    "all of a rank's parameters go into one wrapped group with the first group's hyper-parameters",
)
register(
    "sharded-count-partition",
    f"{_M}:CountPartition",
    "sharded",
    "parameters are dealt round-robin by count, not by size (only the balance property sees it)",
)
register(
    "sharded-state-dict-local",
    f"{_M}:LocalStateDict",
    "sharded",
    "state_dict() is torch's own and returns only this rank's shard (refused by state-consolidated)",
    properties=("state-consolidated",),
)
register(
    "sharded-lr-not-synced",
    f"{_M}:LrNotSynced",
    "sharded",
    "lr changes made through param_groups (an LR scheduler) never reach the wrapped optimizer",
)
register(
    "sharded-no-shard",
    f"{_M}:NoShard",
    "sharded",
    "every rank keeps optimizer state for every parameter (only the memory property sees it)",
)
register(
    "sharded-zero-grad-local-shard",
    f"{_M}:ZeroGradLocalShard",
    "sharded",
    "zero_grad() clears only this rank's shard; other parameters carry their gradient into the next step",
)
register(
    "sharded-lr-synced-backwards",
    f"{_M}:HyperparametersSyncedBackwards",
    "sharded",
    "hyper-parameters are copied from the wrapped optimizer into param_groups: an LR scheduler's lr is lost",
)
register(
    "sharded-group-generators-consumed",
    f"{_M}:GroupGeneratorsConsumed",
    "sharded",
    "groups are iterated before torch's constructor sees them: a group of a generator arrives empty",
)
register(
    "sharded-empty-shard-raises",
    f"{_M}:EmptyShardRaises",
    "sharded",
    "the wrapped optimizer gets a bare list of owned parameters: a rank owning none raises",
    expect="raise",
)
register(
    "sharded-closure-ignored",
    f"{_M}:ClosureIgnored",
    "sharded",
    "step(closure) never calls the closure",
)
register(
    "sharded-load-state-dict-skips-wrapped",
    f"{_M}:LoadStateDictSkipsWrapped",
    "sharded",
    "load_state_dict() is torch's own: the wrapped optimizer restarts from empty state",
)
register(
    "zero1-no-average",
    f"{_M}:Zero1NoAverage",
    "zero",
    "reduce-scattered gradient chunks are summed over ranks but not divided by the world size",
)
register(
    "zero1-steps-unused",
    f"{_M}:Zero1StepsUnused",
    "zero",
    "parameters no rank used in a step are stepped anyway, with zero gradients",
)
register(
    "zero1-no-initial-broadcast",
    f"{_M}:Zero1NoInitialBroadcast",
    "zero",
    "the initial parameters are not broadcast from rank 0",
)
register(
    "zero1-accumulation-overwrites",
    f"{_M}:Zero1AccumulationOverwrites",
    "zero",
    "a second gradient synchronisation in one step overwrites the first instead of adding",
)
register(
    "zero1-state-dict-local",
    f"{_M}:Zero1LocalStateDict",
    "zero",
    "state_dict() does not gather the other ranks' pieces",
)
