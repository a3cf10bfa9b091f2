"""What runs inside a rank process: one rank program per kind, each given a ``RankJob`` and
returning a ``RankRecord``.

* ``ddp.run_ddp``: a DDP target;
* ``sharded.run_sharded``: a sharded optimizer, gradients synchronised by paracheck's FlatDDP;
* ``zero.run_zero``: a ZeRO wrapper that synchronises its gradients itself;
* ``reload.run_reload``: a consolidated state dict loaded into a fresh sharding target;
* ``_cuda_stub``: the same programs with CUDA timing calls made no-ops (``--stub-cuda-timing``).

The World calls them by ``"module:function"`` path (``paracheck.check.kinds``). They judge
nothing: what they return is judged in the driver by ``paracheck.check.properties``.
"""

from paracheck.check.ranks.job import RankJob
from paracheck.check.ranks.record import RankRecord, RankStep, ReloadRecord, Window

__all__ = ["RankJob", "RankRecord", "RankStep", "ReloadRecord", "Window"]
