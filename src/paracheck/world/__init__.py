"""Persistent multi-rank runner: gloo on CPU, NCCL on GPU; failures reported by rank."""

from paracheck.world.runner import (
    PeerFailed,
    RankDied,
    RankError,
    RankFailure,
    RankHang,
    World,
    WorldError,
)

__all__ = ["PeerFailed", "RankDied", "RankError", "RankFailure", "RankHang", "World", "WorldError"]
