"""Optimizer-state sharding: the CS336 owner-broadcast ``ShardedOptimizer`` (and
``MasterWeightsShardedOptimizer``, with float32 master weights), a true ZeRO-1 (``Zero1``, and
``MasterWeightsZero1`` with float32 masters of each rank's chunk),
ZeRO-2 (``Zero2``: gradients kept only as shards), torch's ``ZeroRedundancyOptimizer`` behind the
same interface (``TorchZero``), and the pure partition plans they consume."""

from paracheck.zero.partition import (
    Bucket,
    FlatLayout,
    ParamPartition,
    Piece,
    flat_layout,
    partition_by_size,
)
from paracheck.zero.sharded import MasterWeightsShardedOptimizer, ShardedOptimizer
from paracheck.zero.zero1 import Zero1, Zero1Optimizer
from paracheck.zero.zero1_master import MasterWeightsZero1
from paracheck.zero.zero2 import Zero2

__all__ = [
    "Bucket",
    "FlatLayout",
    "MasterWeightsShardedOptimizer",
    "MasterWeightsZero1",
    "ParamPartition",
    "Piece",
    "ShardedOptimizer",
    "TorchZero",
    "Zero1",
    "Zero1Optimizer",
    "Zero2",
    "flat_layout",
    "partition_by_size",
]


def __getattr__(name):
    # torch.distributed.optim is imported only by whoever asks for the adapter.
    if name == "TorchZero":
        from paracheck.zero.torch_zero import TorchZero

        return TorchZero
    raise AttributeError(f"module 'paracheck.zero' has no attribute {name!r}")
