"""Mutants of resuming at another world size (Note [Resuming at another world size] in
``paracheck.check.properties.reshard``): each the production class minus one thing in its
``state_dict()`` / ``load_state_dict()``. A reload at the same world size, where one of them
would have to show, is not how the sharded kinds are checked for them: the ``reshard`` row is."""

from __future__ import annotations

from paracheck.mutants._edit import edited
from paracheck.mutants._registry import register
from paracheck.zero._zero1_optimizer import Zero1Optimizer
from paracheck.zero.sharded import ShardedOptimizer
from paracheck.zero.zero1 import Zero1

__all__ = ["ShardedStateDroppedOnResize", "Zero1MomentsZeroedOnLoad", "Zero1OffsetPastFirstBucket"]

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
