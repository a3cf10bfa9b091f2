"""Note [Launching off the autograd thread] on NCCL, where the launcher thread runs by itself:
three steps of each built-in that uses it, with the thread and with launches in the hooks, give
the same gradients and parameters bit for bit (deterministic algorithms on: attention's backward
on a GPU otherwise sums in no fixed order, and two runs of one configuration differ). Needs two
CUDA devices."""

import os
import socket

import pytest
import torch

pytestmark = pytest.mark.skipif(
    torch.cuda.device_count() < 2, reason="needs two CUDA devices (NCCL)"
)


def _train(kind: str, enabled: bool, rank: int) -> list[torch.Tensor]:
    from paracheck.ddp import BucketedDDP, OverlappedDDP, _launch
    from paracheck.workloads import LMSpec, TransformerLM
    from paracheck.zero import Zero1, Zero2

    _launch.ENABLED = enabled
    spec = LMSpec(
        vocab_size=512, context_length=64, d_model=128, d_ff=512, num_layers=2, num_heads=4
    )
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = TransformerLM(spec)
    if kind in ("zero1", "zero2"):
        cls = Zero1 if kind == "zero1" else Zero2
        wrapper = opt = cls(model, torch.optim.AdamW, bucket_size_mb=0.1, lr=1e-3)
    else:
        wrapper = BucketedDDP(model, 0.1) if kind == "bucketed" else OverlappedDDP(model)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    out = []
    for step in range(3):
        torch.manual_seed(10 * step + rank)
        x = torch.randint(spec.vocab_size, (2, 64), device="cuda")
        wrapper(x).float().logsumexp(-1).mean().backward()
        wrapper.finish_gradient_synchronization()
        if kind in ("zero1", "zero2"):
            out = [g for g in wrapper.full_gradients() if g is not None]
        else:
            out = [p.grad.clone() for p in model.parameters() if p.grad is not None]
        opt.step()
        opt.zero_grad(set_to_none=True)
    assert wrapper._off_thread is enabled
    return out + [p.detach().clone() for p in model.parameters()]


def _rank(rank: int, port: int, results) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=2)
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        for kind in ("bucketed", "overlapped", "zero1", "zero2"):
            hooks, thread = _train(kind, False, rank), _train(kind, True, rank)
            results[(rank, kind)] = len(hooks) == len(thread) and all(
                torch.equal(a, b) for a, b in zip(hooks, thread)
            )
    finally:
        dist.destroy_process_group()


def test_the_launcher_thread_gives_the_hooks_bits_on_nccl():
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    results = mp.Manager().dict()
    mp.spawn(_rank, args=(port, results), nprocs=2)
    assert dict(results) == {
        (r, k): True for r in range(2) for k in ("bucketed", "overlapped", "zero1", "zero2")
    }
