"""Forward, backward and optimizer-step time of one LM in one process, with and without bf16
autocast, per model size.

Each phase is timed separately, with a device synchronisation at its end (on CUDA), over
``steps`` steps after ``warmup``; the result holds the medians. The loss is computed in float32
outside autocast, as mixed-precision training does; parameters and optimizer state stay float32.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from paracheck.workloads.lm import LMSpec, TransformerLM

__all__ = ["LMTiming", "time_lm"]


@dataclass(frozen=True)
class LMTiming:
    model: LMSpec
    batch: int
    autocast: bool
    device: str
    forward: tuple[float, ...]
    backward: tuple[float, ...]
    step: tuple[float, ...]

    @property
    def medians(self) -> dict:
        return {k: statistics.median(getattr(self, k)) for k in ("forward", "backward", "step")}

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(self.medians)
        return d


def time_lm(
    model: LMSpec,
    *,
    batch: int = 4,
    autocast: bool = False,
    device: str = "cpu",
    warmup: int = 2,
    steps: int = 5,
    tf32: bool = True,
    fused: bool = True,
    seed: int = 0,
) -> LMTiming:
    """Time forward / backward / AdamW step of ``TransformerLM(model)`` on ``device``."""
    if batch < 1 or steps < 1 or warmup < 0:
        raise ValueError(f"batch={batch}, steps={steps} must be >= 1 and warmup={warmup} >= 0")
    dev = torch.device(device)
    cuda = dev.type == "cuda"
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
    with torch.random.fork_rng(devices=[dev.index or 0] if cuda else []):
        torch.manual_seed(seed)
        with torch.device(dev):
            net = TransformerLM(model)
    opt = torch.optim.AdamW(
        net.parameters(), lr=1e-4, **({"fused": True} if cuda and fused else {})
    )
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(model.vocab_size, (batch, model.context_length), generator=g).to(dev)
    y = torch.randint(model.vocab_size, (batch, model.context_length), generator=g).to(dev)

    def sync():
        if cuda:
            torch.cuda.synchronize(dev)

    fwd, bwd, stp = [], [], []
    for i in range(warmup + steps):
        opt.zero_grad(set_to_none=True)
        sync()
        t0 = time.perf_counter()
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=autocast):
            logits = net(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1))
        sync()
        t1 = time.perf_counter()
        loss.backward()
        sync()
        t2 = time.perf_counter()
        opt.step()
        sync()
        t3 = time.perf_counter()
        if i >= warmup:
            fwd.append(t1 - t0)
            bwd.append(t2 - t1)
            stp.append(t3 - t2)
        del logits, loss
    del net, opt
    if cuda:
        torch.cuda.empty_cache()
    return LMTiming(model, batch, autocast, str(dev), tuple(fwd), tuple(bwd), tuple(stp))
