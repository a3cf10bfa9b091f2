"""Broken optimizer-state sharding. Each class differs from ``ShardedOptimizer`` or ``Zero1`` by
one realistic bug (marked ``BUG``): it overrides one small step, or rebuilds one from the
production source with the bug's line edited (``edited``). The default check must kill every one
(``tests/property/test_sharding_mutants.py``), except ``sharded-state-dict-local``, whose per-rank
``state_dict()`` the interface allows: only the opt-in ``state-consolidated`` property refuses it.
Several are invisible to equivalence alone: ``sharded-no-shard`` trains correctly while sharding
nothing (``sharded-no-shard-undeclared`` too, declaring no partition), ``sharded-count-partition`` trains correctly while piling state on one rank; the
``memory`` and ``balance`` properties exist for them. The last six each need one protocol of the
generated cases (``paracheck.strategies._sharding``): zero_grad between steps, an LR scheduler,
groups of generators, a rank that owns nothing, ``step(closure)``, ``load_state_dict`` into a
fresh instance.
"""

from __future__ import annotations

import torch

from paracheck.mutants._edit import edited
from paracheck.mutants._registry import register
from paracheck.zero.partition import ParamPartition
from paracheck.zero.sharded import MasterWeightsShardedOptimizer, ShardedOptimizer, _param_weight
from paracheck.zero.zero1 import Zero1
from paracheck.zero.zero1_master import MasterWeightsZero1
from paracheck.zero.zero2 import Zero2

__all__ = [
    "BroadcastFromRankZero",
    "CountPartition",
    "FirstGroupHyperparameters",
    "HyperparametersDropped",
    "LateGroupNotStepped",
    "LocalStateDict",
    "LrNotSynced",
    "NoShard",
    "NoShardUndeclared",
    "Zero1AccumulationOverwrites",
    "Zero1LocalStateDict",
    "Zero1NoAverage",
    "Zero1NoInitialBroadcast",
    "Zero1StepsUnused",
    "ZeroGradLocalShard",
    "ClipLocalNorm",
    "Zero1ClipLocalNorm",
    "HyperparametersSyncedBackwards",
    "GroupGeneratorsConsumed",
    "EmptyShardRaises",
    "ClosureIgnored",
    "LoadStateDictSkipsWrapped",
    "DecayAppliedTwice",
    "MastersInParameterDtype",
    "MastersNotSaved",
    "Zero1MastersInParameterDtype",
    "Zero1GatheredBeforeMastersRounded",
    "Zero2FullBufferKept",
    "Zero2GradsZeroedNotFreed",
    "Zero2LastMicroBatchOnly",
]


# -- owner-broadcast ShardedOptimizer -----------------------------------------------------------


class BroadcastFromRankZero(ShardedOptimizer):
    """Every parameter is broadcast from rank 0 instead of from its owner."""

    def _broadcast_sources(self) -> list[tuple[torch.Tensor, int]]:
        # BUG: the source should be the owner
        return [(p, self._source(0)) for p in self._params if p.requires_grad]


class LateGroupNotStepped(ShardedOptimizer):
    """A group added after construction is partitioned, but no rank's wrapped optimizer gets it."""

    def __init__(self, params, optimizer_cls, **kwargs):
        self._constructed = False
        super().__init__(params, optimizer_cls, **kwargs)
        self._constructed = True

    def _add_local_group(self, group: dict, mine: list, names: list | None) -> None:
        if not self._constructed:  # BUG: the wrapped optimizer is only told from the constructor
            super()._add_local_group(group, mine, names)


class HyperparametersDropped(ShardedOptimizer):
    """The wrapped optimizer gets this rank's parameters without their group's hyper-parameters."""

    def _add_local_group(self, group: dict, mine: list, names: list | None) -> None:
        super()._add_local_group({}, mine, names)  # BUG: the group's options not passed on

    def _sync_hyperparameters(self) -> None:
        pass  # consistent with the bug: the wrapped groups are never told about the options


class FirstGroupHyperparameters(ShardedOptimizer):
    """All of this rank's parameters go into one wrapped group with the first group's options."""

    def _add_local_group(self, group: dict, mine: list, names: list | None) -> None:
        if self.local_optimizer is None:
            super()._add_local_group(group, mine, names)
        else:
            self.local_optimizer.param_groups[0]["params"].extend(mine)  # BUG: options lost


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

    def _sync_hyperparameters(self) -> None:
        pass  # BUG: step() never copies param_groups' hyper-parameters to the wrapped optimizer


class ZeroGradLocalShard(ShardedOptimizer):
    """``zero_grad()`` clears only the gradients of this rank's shard (the wrapped optimizer's): the
    other parameters carry their gradient into the next step."""

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.local_optimizer.zero_grad(
            set_to_none=set_to_none
        )  # BUG: not every parameter of param_groups


class ClipLocalNorm(ShardedOptimizer):
    """``clip_grad_norm_`` clips this rank's parameters by the norm of this rank's shard: each
    rank steps its shard with its own coefficient, not the global one."""

    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        mine = [p for p, owner in zip(self._params, self._partition.owners) if owner == self.rank]
        return torch.nn.utils.clip_grad_norm_(mine, max_norm)  # BUG: no all-reduce of the norms


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
    owns none of the first group, torch raises "optimizer got an empty parameter list"; after a
    ``load_state_dict()`` its groups lack the defaults and Adam's step raises KeyError 'eps'."""

    def _add_local_group(self, group: dict, mine: list, names: list | None) -> None:
        if self.local_optimizer is not None:
            return super()._add_local_group(group, mine, names)
        options = {k: v for k, v in group.items() if k not in ("params", "param_names")}
        self.local_optimizer = self.optimizer_cls(mine, **options)  # BUG: a bare list


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


class DecayAppliedTwice(ShardedOptimizer):
    """The wrapper applies decoupled weight decay to its shard, p *= 1 - lr * weight_decay, and
    passes ``weight_decay`` on to the wrapped optimizer, which applies it again. A relative error
    of lr * weight_decay a step (1e-4 for AdamW at lr 1e-3): the size a free float32 trajectory's
    tolerance allows, and 25 to 50 times a step's derived bound (Note [Comparing an update])."""

    def step(self, closure=None, **kwargs):
        self._sync_hyperparameters()
        with torch.no_grad():
            for group in self.local_optimizer.param_groups:
                for p in group["params"]:
                    if p.grad is not None:  # BUG: the wrapped optimizer decays them too
                        p.mul_(1 - group["lr"] * group["weight_decay"])
        return super().step(closure, **kwargs)


class NoShard(ShardedOptimizer):
    """Every rank builds the wrapped optimizer over *all* parameters (then broadcasts its own):
    trains correctly, shards nothing."""

    def _add_local_group(self, group: dict, mine: list, names: list | None) -> None:
        # BUG: every parameter of the group, not only the owned ones
        super()._add_local_group(group, list(group["params"]), group.get("param_names"))


class NoShardUndeclared(NoShard):
    """``NoShard`` that declares no partition (no ``partition`` attribute), as most code written
    from the interface alone: only the state each rank steps shows it (Note [State stepped on two
    ranks] in ``paracheck.check.properties.memory``)."""

    partition = None  # type: ignore[assignment]


# -- Zero1 --------------------------------------------------------------------------------------


class Zero1NoAverage(Zero1):
    """The reduce-scattered gradient chunks are sums over ranks, never divided by the world size."""

    _average = edited(
        Zero1._average,
        (
            "torch._foreach_div_(chunks, self.world_size)",
            "pass  # BUG: no division by self.world_size: the chunks stay sums over ranks",
        ),
    )


class Zero1ClipLocalNorm(Zero1):
    """``clip_grad_norm_`` clips by the norm of this rank's chunk of the gradients only."""

    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        pieces = [pc for g in self.param_groups for p in g["params"] for pc in self.pieces_of(p)]
        return torch.nn.utils.clip_grad_norm_(pieces, max_norm)  # BUG: this rank's chunk only


class Zero1StepsUnused(Zero1):
    """Every piece always gets its chunk as gradient: parameters no rank used are stepped with
    zeros (momentum, Adam's moments and weight decay then move them)."""

    def _attach_piece_grads(self) -> None:
        for k in range(len(self.pieces)):
            self._stepped[k].grad = self._piece_grads[k]  # BUG: ignores the presence flags


class Zero1NoInitialBroadcast(Zero1):
    """The flat buffers are filled from each rank's own initial parameters: no broadcast from rank 0."""

    def _broadcast_module(self) -> None:
        pass  # BUG


class Zero1AccumulationOverwrites(Zero1):
    """A second synchronisation in one step (accumulation without ``no_sync()``) overwrites the
    chunk instead of adding to it: the in-place reduce-scatter's chunk lives inside the gradient
    buffer, and the accumulated chunk is not saved before the next round's hooks write over it."""

    _start_bucket = edited(
        Zero1._start_bucket,
        (
            "self._saved[b] = self._kept(b)",
            "pass  # BUG: the accumulated chunk is not kept aside",
        ),
    )


# -- Zero2 --------------------------------------------------------------------------------------


class Zero2LastMicroBatchOnly(Zero2):
    """Each synchronisation's averaged chunk is copied into the shard, never added to what the
    step's earlier synchronisations left there: with accumulation only the last micro-batch's
    gradient is kept."""

    def _kept(self, b: int):
        return None  # BUG: the shard's accumulated gradient is not added to the new chunk


class Zero2FullBufferKept(Zero2):
    """A bucket's full gradient buffer is kept after its reduce-scatter, for the next step to
    reuse: the values are right and every rank holds the whole gradients (ZeRO-1's memory)."""

    def _release(self, b: int) -> None:
        pass  # BUG: the full buffer is not dropped


class Zero2GradsZeroedNotFreed(Zero2):
    """Each parameter's gradient is zeroed once copied into its bucket instead of freed: the
    values are right (the next backward accumulates into zeros) and every rank holds a whole
    gradient per parameter."""

    _take_grad = edited(
        Zero1._take_grad,
        ("p.grad = None", "p.grad.zero_()  # BUG: kept, zeroed, instead of freed"),
    )


class Zero1LocalStateDict(Zero1):
    """``state_dict()`` never gathers the other ranks' pieces."""

    def _gather_object(self, obj) -> list:
        return [obj]  # BUG: no all_gather_object


class MastersInParameterDtype(MasterWeightsShardedOptimizer):
    """The masters are kept in the parameters' own dtype: a bfloat16 model is stepped in bfloat16."""

    def _new_master(self, p: torch.Tensor) -> torch.Tensor:
        return p.detach().clone().requires_grad_(True)  # BUG: should be .to(torch.float32)


class MastersNotSaved(MasterWeightsShardedOptimizer):
    """``state_dict()`` leaves the masters out: a reloaded optimizer restarts them from the rounded
    parameters."""

    def state_dict(self) -> dict:
        return ShardedOptimizer.state_dict(self)  # BUG: the masters are not saved


class Zero1MastersInParameterDtype(MasterWeightsZero1):
    """ZeRO-1's masters of its chunk are kept in the parameters' own dtype: bfloat16 parameters
    are stepped in bfloat16."""

    def _build_buffers(self) -> None:
        self.master_dtype = self.trainable[0].dtype  # BUG: should stay torch.float32
        super()._build_buffers()


class Zero1GatheredBeforeMastersRounded(MasterWeightsZero1):
    """The chunks are all-gathered before each rank rounds its masters into its own: every rank
    gets the other ranks' chunks of the step before."""

    def _all_gather_parameters(self) -> None:
        Zero1._all_gather_parameters(self)  # BUG: gathers the chunks before they are updated
        self._round_masters()


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
    "sharded-no-shard-undeclared",
    f"{_M}:NoShardUndeclared",
    "sharded",
    "every rank keeps and steps optimizer state for every parameter, and the partition is not "
    "declared (only the memory property sees it, by the state each rank steps)",
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
    "sharded-decay-applied-twice",
    f"{_M}:DecayAppliedTwice",
    "sharded",
    "weight decay applied by the wrapper and again by the wrapped optimizer it passes it to",
)
register(
    "sharded-clip-local-norm",
    f"{_M}:ClipLocalNorm",
    "sharded",
    "clip_grad_norm_ uses the norm of this rank's shard, not the global norm",
)
register(
    "zero1-clip-local-norm",
    f"{_M}:Zero1ClipLocalNorm",
    "zero",
    "clip_grad_norm_ uses the norm of this rank's chunk of the gradients, not the global norm",
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
register(
    "sharded-master-in-param-dtype",
    f"{_M}:MastersInParameterDtype",
    "sharded",
    "the master weights of bfloat16 parameters are kept in bfloat16, not float32",
    precision="bf16",
)
register(
    "sharded-masters-not-saved",
    f"{_M}:MastersNotSaved",
    "sharded",
    "state_dict() leaves the float32 masters out: a reload restarts them from the bfloat16 parameters",
    precision="bf16",
)
register(
    "zero1-master-in-param-dtype",
    f"{_M}:Zero1MastersInParameterDtype",
    "zero",
    "ZeRO-1's masters of bfloat16 parameters are kept in bfloat16, not float32",
    precision="bf16",
)
register(
    "zero1-gathered-before-masters-rounded",
    f"{_M}:Zero1GatheredBeforeMastersRounded",
    "zero",
    "ZeRO-1 with masters all-gathers the chunks before rounding the masters into them: a step stale",
    precision="bf16",
)
register(
    "zero2-last-micro-batch-only",
    f"{_M}:Zero2LastMicroBatchOnly",
    "zero2",
    "ZeRO-2: each synchronisation overwrites the gradient shard: only the last micro-batch's gradient is kept",
)
register(
    "zero2-full-buffer-kept",
    f"{_M}:Zero2FullBufferKept",
    "zero2",
    "ZeRO-2 keeps each bucket's full gradient buffer after its reduce-scatter: ZeRO-1's memory",
)
register(
    "zero2-grads-zeroed-not-freed",
    f"{_M}:Zero2GradsZeroedNotFreed",
    "zero2",
    "ZeRO-2 zeroes each parameter's gradient once bucketed instead of freeing it",
)
