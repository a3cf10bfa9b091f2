"""What ZeRO-1's step would gain if its all-gathers overlapped the next forward: a measurement for
a decision, not a component.

``Zero1`` keeps its contract: when ``step()`` returns, every parameter holds its new value (on
NCCL, every later kernel on the current stream sees it). So the next forward cannot start until
the last bucket's all-gather has landed, and at W = 2 that all-gather is the part of ZeRO-1's
step that torch DDP does not have. ``Zero1Prefetch`` breaks that contract on purpose: ``step()``
launches one all-gather per bucket, in the order the forward uses them (buckets are in reverse
registration order, so the last one first), and returns without making the stream wait; a
forward pre-hook on each module that owns parameters waits for its buckets only. A parameter is
final at its module's next forward, as with FSDP2's prefetched unshard, and not before: reading
one between ``step()`` and that forward races with its all-gather (``wait_parameters()`` ends
the race). The figures tell a planner what that contract is worth.

Run through ``compare_trees.py`` as an import-path variant:

    PYTHONPATH=src python experiments/compare_trees.py --trees now=. --sizes large,xl \\
        --variants torch-ddp,torch-zero,zero1,zero1_prefetch:Zero1Prefetch \\
        --pythonpath experiments --rounds 8

``python experiments/zero1_prefetch.py`` checks the parameters after five steps bit for bit
against ``Zero1``'s, at W = 2 (NCCL on two GPUs, else gloo). What it measured: docs/measurements.md,
"ZeRO-1 with its all-gathers waited at the next forward".
"""

from __future__ import annotations

import functools
import weakref

from paracheck.zero.zero1 import Zero1, _all_gather_into_tensor

__all__ = ["Zero1Prefetch"]


def _pre_forward(ref: weakref.ref, buckets: tuple[int, ...], module, args) -> None:
    zero = ref()
    if zero is not None:
        zero._wait_buckets(buckets)


class Zero1Prefetch(Zero1):
    """``Zero1`` whose parameters are final at their module's next forward (module docstring)."""

    def __init__(self, module, optimizer_cls, **kwargs):
        super().__init__(module, optimizer_cls, **kwargs)
        self._gathers: dict[int, object] = {}
        ref = weakref.ref(self)
        index = self._index
        for mod in module.modules():
            own = [p for p in mod.parameters(recurse=False) if id(p) in index]
            if own:
                buckets = tuple(sorted({self.layout.where(index[id(p)])[0] for p in own}))
                mod.register_forward_pre_hook(functools.partial(_pre_forward, ref, buckets))

    def _wait_buckets(self, buckets) -> None:
        for b in buckets:
            handle = self._gathers.pop(b, None)
            if handle is not None:
                handle.wait()

    def wait_parameters(self) -> None:
        """Every parameter final: the stream waits for every all-gather still in flight."""
        self._wait_buckets(list(self._gathers))

    def _all_gather_parameters(self) -> None:
        self.wait_parameters()
        if self.world_size == 1:
            return
        for b in reversed(range(len(self._param_flat))):
            flat = self._param_flat[b]
            s = self.layout.shard_numel(b)
            shard = flat.narrow(0, self.rank * s, s)
            self._gathers[b] = _all_gather_into_tensor(
                flat, shard, group=self.process_group, async_op=True
            )

    def finish_gradient_synchronization(self) -> None:
        self.wait_parameters()
        super().finish_gradient_synchronization()

    def state_dict(self):
        self.wait_parameters()
        return super().state_dict()


def _check_rank(rank: int, world_size: int, port: int) -> None:
    import os

    import torch
    import torch.distributed as dist

    from paracheck.zero import Zero1

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    cuda = torch.cuda.device_count() >= world_size
    if cuda:
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world_size)
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    params = {}
    for cls in (Zero1, Zero1Prefetch):
        torch.manual_seed(0)
        layers = [torch.nn.Linear(256, 256) for _ in range(6)]
        net = torch.nn.Sequential(*[m for layer in layers for m in (layer, torch.nn.GELU())])
        net = net.to(device)
        zero = cls(net, torch.optim.AdamW, lr=1e-3, bucket_size_mb=0.3)
        for step in range(5):
            g = torch.Generator(device=device).manual_seed(100 * step + rank)
            x = torch.randn(32, 256, device=device, generator=g)
            zero.zero_grad()
            zero(x).square().mean().backward()
            zero.finish_gradient_synchronization()
            zero.step()
        if isinstance(zero, Zero1Prefetch):
            zero.wait_parameters()
        params[cls.__name__] = [p.detach().cpu() for p in net.parameters()]
    same = all(torch.equal(a, b) for a, b in zip(params["Zero1"], params["Zero1Prefetch"]))
    print(
        f"rank {rank} ({dist.get_backend()}): Zero1Prefetch bit-equal to Zero1 after 5 steps: {same}"
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    import torch.multiprocessing as mp

    mp.spawn(_check_rank, args=(2, 29541), nprocs=2)
