"""Sharded optimizers for the regression tests, importable by the rank processes."""

from paracheck.zero.torch_zero import TorchZero


class UndeclaredTorchZero(TorchZero):
    """torch's ZeroRedundancyOptimizer behind the CS336 interface, declaring no partition, as a
    user's class does: it broadcasts frozen parameters too, which is correct but not the
    owner-broadcast model."""

    partition = None
