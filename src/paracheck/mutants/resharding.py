"""Mutants of resuming at another world size (Note [Resuming at another world size] in
``paracheck.check.properties.reshard``): each the production class minus one thing in its
``state_dict()`` / ``load_state_dict()``. Some show at any world size; others only where the
world size changes (state dropped, masters rebuilt from the parameters) or where the resumed
world has more than one rank (state loaded on rank 0 only), which a reload at the same world size
never sees: the ``reshard`` row is how the sharded kinds are checked for them."""

from __future__ import annotations

from paracheck.mutants._edit import edited
from paracheck.mutants._registry import register
from paracheck.zero._zero1_optimizer import Zero1Optimizer
from paracheck.zero.sharded import ShardedOptimizer
from paracheck.zero.zero1 import Zero1
from paracheck.zero.zero1_master import MasterWeightsZero1
from paracheck.zero.zero2 import Zero2

__all__ = [
    "ShardedHyperparametersIgnoredOnLoad",
    "ShardedStateDroppedOnResize",
    "Zero1MastersFromParametersOnResize",
    "Zero1MomentsZeroedOnLoad",
    "Zero1OffsetPastFirstBucket",
    "Zero1StepCountZeroedOnLoad",
    "Zero2LoadedOnRankZero",
]

# The piece's start counted from the beginning of the whole flat buffer (every bucket before its
# own added), not from the beginning of its parameter: right in the first bucket only.
_load_past_first_bucket = edited(
    Zero1Optimizer.load_state_dict,
    (
        "v.reshape(-1)[pc.start : pc.start + pc.length].clone()",
        "v.reshape(-1)[(s := pc.start + sum(b.numel for b in zero.layout.buckets[: pc.bucket])) "
        ": s + pc.length].clone()  # BUG: the buckets before it counted in",
    ),
    name="load_past_first_bucket",
)

_load_moments_zeroed = edited(
    Zero1Optimizer.load_state_dict,
    (
        "v.reshape(-1)[pc.start : pc.start + pc.length].clone()",
        "v.reshape(-1)[pc.start : pc.start + pc.length].clone() "
        '* (not key.startswith("exp_avg"))  # BUG: the moments zeroed, the step count kept',
    ),
    name="load_moments_zeroed",
)


class Zero1OffsetPastFirstBucket(Zero1):
    """``load_state_dict()`` reads each piece of a parameter past the first bucket at an offset
    that counts the buckets before it: every parameter of a later bucket gets another part of the
    saved state (or too little of it)."""

    def load_state_dict(self, state_dict: dict) -> None:
        _load_past_first_bucket(self.optimizer, state_dict)


class Zero1MomentsZeroedOnLoad(Zero1):
    """``load_state_dict()`` restores Adam's step count but zeroes its moments."""

    def load_state_dict(self, state_dict: dict) -> None:
        _load_moments_zeroed(self.optimizer, state_dict)


class ShardedStateDroppedOnResize(ShardedOptimizer):
    """The checkpoint records the world size it was saved at, and ``load_state_dict()`` restores
    the groups' hyper-parameters but silently no optimizer state when the number of ranks
    changed: right at the same world size."""

    def state_dict(self) -> dict:
        return {**ShardedOptimizer.state_dict(self), "world_size": self.world_size}

    def load_state_dict(self, state_dict: dict) -> None:
        if state_dict.get("world_size", self.world_size) != self.world_size:
            state_dict = {**state_dict, "state": {}}  # BUG: the shards "do not match": start over
        ShardedOptimizer.load_state_dict(self, state_dict)


# A per-tensor value (Adam's step) given to each piece as a tensor of its own, so that two pieces
# never share the one tensor Adam increments in place: made with zeros_like where clone was meant.
_load_step_zeroed = edited(
    Zero1Optimizer.load_state_dict,
    (
        "else v\n",
        "else torch.zeros_like(v) if torch.is_tensor(v) else v  # BUG: not v.clone()\n",
    ),
    name="load_step_zeroed",
)

_load_groups_ignored = edited(
    ShardedOptimizer.load_state_dict,
    (
        'group.update({k: v for k, v in saved.items() if k != "params"})',
        "pass  # BUG: the saved groups read for their indices only, their options never",
    ),
    name="load_groups_ignored",
)


class Zero1StepCountZeroedOnLoad(Zero1):
    """``load_state_dict()`` restores Adam's moments and starts its step count at 0: the bias
    corrections after the load are those of a first step. At any world size (the ``reload`` row
    sees it too)."""

    def load_state_dict(self, state_dict: dict) -> None:
        _load_step_zeroed(self.optimizer, state_dict)


class ShardedHyperparametersIgnoredOnLoad(ShardedOptimizer):
    """``load_state_dict()`` restores the state but keeps the fresh optimizer's hyper-parameters
    (lr, weight decay, ...) instead of the saved groups': the rate a scheduler or a decay had
    brought the training to is lost. At any world size; seen wherever the rate at the save
    differs from the one the groups were built with."""

    def load_state_dict(self, state_dict: dict) -> None:
        _load_groups_ignored(self, state_dict)


class Zero2LoadedOnRankZero(Zero2):
    """``load_state_dict()`` restores the checkpoint on rank 0 only, where ``state_dict()`` is
    written from; the other ranks keep a fresh optimizer (no state, the groups' built options):
    right in a world of one rank, which a resume to one rank shows nothing of."""

    def load_state_dict(self, state_dict: dict) -> None:
        if self.rank == 0:  # BUG: the other ranks' shards are never loaded
            Zero2.load_state_dict(self, state_dict)


class Zero1MastersFromParametersOnResize(MasterWeightsZero1):
    """The checkpoint records the world size it was saved at, and ``load_state_dict()`` loads the
    float32 masters where it is this one, but rebuilds them from the bfloat16 parameters when
    the number of ranks changed (each rank's chunk of the masters moved): the bits below
    bfloat16's are lost. Right at the same world size, which a reload sees nothing of."""

    def state_dict(self) -> dict:
        return {**MasterWeightsZero1.state_dict(self), "world_size": self.world_size}

    def load_state_dict(self, state_dict: dict) -> None:
        state_dict = dict(state_dict)
        if state_dict.pop("world_size", self.world_size) != self.world_size:
            state_dict.pop("masters", None)  # BUG: the chunks moved: start them from the parameters
        MasterWeightsZero1.load_state_dict(self, state_dict)


_M = "paracheck.mutants.resharding"
register(
    "zero1-reshard-offset-past-first-bucket",
    f"{_M}:Zero1OffsetPastFirstBucket",
    "zero",
    "load_state_dict() reads every parameter past the first bucket at an offset that counts the "
    "buckets before it",
)
register(
    "zero1-reshard-moments-zeroed",
    f"{_M}:Zero1MomentsZeroedOnLoad",
    "zero",
    "load_state_dict() zeroes Adam's moments and keeps its step count",
)
register(
    "sharded-reshard-state-dropped",
    f"{_M}:ShardedStateDroppedOnResize",
    "sharded",
    "load_state_dict() restores no optimizer state when the world size differs from the saved one",
)
register(
    "zero1-reshard-step-zeroed",
    f"{_M}:Zero1StepCountZeroedOnLoad",
    "zero",
    "load_state_dict() restores Adam's moments and starts its step count at 0",
)
register(
    "sharded-reshard-hyperparameters-ignored",
    f"{_M}:ShardedHyperparametersIgnoredOnLoad",
    "sharded",
    "load_state_dict() keeps the fresh optimizer's lr and weight decay instead of the saved groups'",
)
register(
    "zero2-reshard-loaded-on-rank-0",
    f"{_M}:Zero2LoadedOnRankZero",
    "zero2",
    "load_state_dict() restores the checkpoint on rank 0 only; the other ranks start afresh",
)
register(
    "zero1-master-reshard-masters-from-parameters",
    f"{_M}:Zero1MastersFromParametersOnResize",
    "zero",
    "load_state_dict() rebuilds the float32 masters from the bfloat16 parameters when the world "
    "size differs from the saved one",
    precision="bf16",
)
