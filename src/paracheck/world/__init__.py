"""Persistent multi-rank runner: gloo on CPU, NCCL on GPU; failures reported by rank."""

from paracheck.world.runner import RankDied, RankError, RankFailure, RankHang, World, WorldError

__all__ = ["RankDied", "RankError", "RankFailure", "RankHang", "World", "WorldError"]
