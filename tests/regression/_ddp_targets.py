"""DDP targets for the regression tests, importable by the rank processes."""

from paracheck.ddp._common import check_bucket_size_mb
from paracheck.ddp.bucketed import BucketedDDP


class RefusesNoneDDP(BucketedDDP):
    """A correct BucketedDDP that, like many CS336 solutions, takes only a number of megabytes."""

    def __init__(self, module, bucket_size_mb: float):
        super().__init__(module, check_bucket_size_mb(bucket_size_mb))


class _AgreeingDDP(BucketedDDP):
    """A correct BucketedDDP that also agrees with the other ranks on a one-element float32 flag
    after each synchronisation (as a design that decides together whether to redo a bucket does),
    reduced by ``_op``."""

    _op = "max"

    def finish_gradient_synchronization(self) -> None:
        import torch
        import torch.distributed as dist

        super().finish_gradient_synchronization()
        flag = torch.ones(1, dtype=torch.float32)
        op = dist.ReduceOp.MAX if self._op == "max" else dist.ReduceOp.SUM
        dist.all_reduce(flag, op=op)


class MaxFlagDDP(_AgreeingDDP):
    """The flag reduced by max: an agreement, not a gradient."""

    _op = "max"


class SumFlagDDP(_AgreeingDDP):
    """The same flag reduced by sum: four bytes summed beyond the gradients and their flags."""

    _op = "sum"
