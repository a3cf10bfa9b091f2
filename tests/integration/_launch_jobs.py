"""Rank jobs for tests/integration/test_launch_thread.py."""

import torch
import torch.distributed as dist

from paracheck.ddp import BucketedDDP, OverlappedDDP, _launch
from paracheck.zero import Zero1, Zero2


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8), torch.nn.Linear(8, 3)
    )


def _train(kind: str, forced: bool) -> list[torch.Tensor]:
    """Three steps of ``kind``; the last layer unused by rank 1 in step 1. Returns the gradients
    of the last synchronisation and the parameters after the last step. ``forced``: the wrapper
    built to use the launcher thread (as on NCCL), whose launches then stay in the hooks in step
    1 only, under a recorder (as in a check)."""
    from paracheck.accounting.record import Recorder

    saved, _launch.FORCE = _launch.FORCE, forced
    try:
        model = _model()
        rank = dist.get_rank()
        if kind in ("zero1", "zero2"):
            wrapper = (Zero1 if kind == "zero1" else Zero2)(
                model, torch.optim.Adam, bucket_size_mb=100 / 2**20, lr=0.01
            )
            opt = wrapper
        else:
            wrapper = (
                BucketedDDP(model, 100 / 2**20) if kind == "bucketed" else OverlappedDDP(model)
            )
            opt = torch.optim.Adam(model.parameters(), lr=0.01)
        _launch.FORCE = False  # built for the thread; from here the launches decide as on NCCL
        if forced and kind == "overlapped":
            wrapper._off_thread = True  # decided at its first launch, by the tensor's device
        grads = []
        for step in range(3):
            torch.manual_seed(100 * step + rank)
            x = torch.randn(4, 6)
            watched = Recorder(track_memory=False) if forced and step == 1 else None
            if watched is not None:
                watched.__enter__()
            last = _launch._LAUNCHER and _launch._LAUNCHER._last
            h = wrapper.module[:3](x) if step == 1 and rank == 1 else wrapper(x)
            h.pow(2).sum().backward()
            if forced:
                queued = _launch._LAUNCHER is not None and _launch._LAUNCHER._last is not last
                # Launched from the thread unless watched, where nothing may be queued.
                assert queued == (watched is None), (kind, step, rank, queued)
            if forced and step != 1:  # every launch queued by backward made when it returns
                assert _launch._LAUNCHER._last._done
                dist.all_reduce(torch.ones(1))  # the user's own, between backward and the sync
            wrapper.finish_gradient_synchronization()
            if watched is not None:
                watched.__exit__(None, None, None)
            if kind in ("zero1", "zero2"):
                grads = [g if g is not None else torch.zeros(0) for g in wrapper.full_gradients()]
            else:
                grads = [
                    p.grad.clone() if p.grad is not None else torch.zeros(0)
                    for p in model.parameters()
                ]
            opt.step()
            opt.zero_grad(set_to_none=True)
        return grads + [p.detach().clone() for p in model.parameters()]
    finally:
        _launch.FORCE = saved


def compare(kind: str) -> bool:
    """Whether the launcher thread's run equals the calling thread's, bit for bit."""
    inline, threaded = _train(kind, False), _train(kind, True)
    return len(inline) == len(threaded) and all(
        a.shape == b.shape and torch.equal(a, b) for a, b in zip(inline, threaded)
    )
