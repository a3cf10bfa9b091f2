"""Persistent multi-rank runner: gloo on CPU, NCCL on GPU; failures reported by rank."""

from paracheck.world._collectives import set_step
from paracheck.world.attached import PoolLost
from paracheck.world.runner import (
    PeerFailed,
    RankDied,
    RankError,
    RankFailure,
    RankHang,
    RankOverMemory,
    World,
    WorldError,
    WorldStartError,
    default_rank_memory,
)

__all__ = [
    "PeerFailed",
    "PoolLost",
    "RankDied",
    "RankError",
    "RankFailure",
    "RankHang",
    "WorldStartError",
    "RankOverMemory",
    "World",
    "WorldError",
    "default_rank_memory",
    "set_step",
]
