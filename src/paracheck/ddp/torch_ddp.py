"""TorchDDP: PyTorch's own ``DistributedDataParallel`` behind the CS336 interface, so paracheck
checks PyTorch with the same properties as its own variants (target ``torch-ddp``).

Options, and why each is needed for the shared semantics (``paracheck.ddp._common``):

* ``find_unused_parameters=True``: cases have parameters that no rank uses and data-dependent
  branches used on some ranks only. Without it torch DDP waits for gradients that never come and
  raises "Expected to have finished reduction in the prior iteration" on the next step. With it,
  the reducer marks unused parameters ready after forward, contributes zeros for them, reduces a
  "locally used" map, and leaves the ``.grad`` of a parameter no rank used untouched (None stays
  None): exactly Note [Gradients that exist on some ranks only].
* ``bucket_cap_mb=bucket_size_mb``: the same cap, in the same unit (2**20 bytes).
* Everything else at torch's defaults: parameters and buffers are broadcast from rank 0 at
  construction (``init_sync=True``), buffers again before each forward (a no-op for the constant
  buffers of the cases), ``gradient_as_bucket_view=False``. ``ddp_options`` overrides any of them
  (e.g. ``gradient_as_bucket_view=True`` for the benchmarks).

Torch DDP synchronises inside ``backward()``, so ``finish_gradient_synchronization()`` has nothing
left to do; ``no_sync()`` is torch's.
"""

from __future__ import annotations

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from paracheck.ddp._common import check_bucket_size_mb

__all__ = ["TorchDDP"]


class TorchDDP(nn.Module):
    """``torch.nn.parallel.DistributedDataParallel`` with the CS336 interface; see the module
    docstring for the options. Equal to the oracle wherever torch DDP is correct: that is what
    the ``torch-ddp`` target checks. The constructor and every synchronised ``backward()`` are
    collectives.
    """

    def __init__(self, module: nn.Module, bucket_size_mb: float = 25.0, *, process_group=None, **ddp_options):
        super().__init__()
        self.bucket_size_mb = check_bucket_size_mb(bucket_size_mb)
        options = {"find_unused_parameters": True, "bucket_cap_mb": self.bucket_size_mb, **ddp_options}
        self.ddp = DistributedDataParallel(module, process_group=process_group, **options)

    @property
    def module(self) -> nn.Module:
        return self.ddp.module

    def forward(self, *args, **kwargs):
        return self.ddp(*args, **kwargs)

    def no_sync(self):
        """Torch's ``no_sync()``: backward passes inside only accumulate local gradients."""
        return self.ddp.no_sync()

    def finish_gradient_synchronization(self) -> None:
        """Nothing to do: torch DDP has reduced every bucket by the end of ``backward()``."""
