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

__all__ = ["LM_NORMS", "LMTiming", "graphed_step", "time_lm", "time_lm_steps", "timed_call"]


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


# ------------------------------------------------------------------------------------------
# The whole step, per norm: where an RMSNorm kernel is felt.

LM_NORMS = ("torch", "triton", "none")


def _lm_with_norm(size: str, norm: str):
    """``TransformerLM`` of ``size`` with ``norm``; "none" is the torch-norm model with every
    norm replaced by the identity: the bound no norm kernel can pass."""
    with torch.device("cuda"):
        net = TransformerLM(LMSpec.size(size, norm="torch" if norm == "none" else norm))
    if norm == "none":
        for mod in list(net.modules()):
            for child in ("ln1", "ln2", "ln_final"):
                if hasattr(mod, child):
                    setattr(mod, child, torch.nn.Identity())
    return net


def timed_call(fn) -> tuple[float, float]:
    """``fn()`` from an idle device: its milliseconds until the device is done, and until the
    host returned (what the host spent enqueueing)."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    return (t2 - t0) * 1e3, (t1 - t0) * 1e3


def graphed_step(net, opt, xb, yb, bf16: bool):
    """The whole step captured in one CUDA graph (static inputs, capturable fused AdamW)."""

    def body():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            logits = net(xb)
        F.cross_entropy(logits.flatten(0, 1).float(), yb.flatten()).backward()
        opt.step()

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            body()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        body()
    return graph.replay


def time_lm_steps(
    size: str,
    *,
    bf16: bool = False,
    mode: str = "eager",
    norms=LM_NORMS,
    steps: int = 10,
    warmup: int = 3,
    batch: int = 4,
) -> dict[str, tuple[float, float]]:
    """Median (step ms, host-enqueue ms) of the LM's whole training step (zero_grad, forward
    under optional bf16 autocast, float32 loss, backward, fused AdamW) for each norm, the norms'
    steps interleaved one by one so drift hits them alike. ``mode``: "eager", "graph" (the whole
    step replayed from one CUDA graph) or "compile" (``torch.compile`` of the model)."""
    if mode not in ("eager", "graph", "compile"):
        raise ValueError(f"mode={mode!r} must be 'eager', 'graph' or 'compile'")
    if steps < 1 or warmup < 0:
        raise ValueError(f"steps={steps} must be >= 1 and warmup={warmup} >= 0")
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    spec = LMSpec.size(size)
    g = torch.Generator().manual_seed(0)
    xb = torch.randint(spec.vocab_size, (batch, spec.context_length), generator=g).cuda()
    yb = torch.randint(spec.vocab_size, (batch, spec.context_length), generator=g).cuda()
    runs = {}
    keep = []  # a graph replays into its model's and optimizer's memory: they must outlive it
    for norm in norms:
        torch.manual_seed(0)
        net = _lm_with_norm(size, norm)
        opt = torch.optim.AdamW(net.parameters(), lr=1e-4, fused=True, capturable=mode == "graph")
        if mode == "graph":
            runs[norm] = graphed_step(net, opt, xb, yb, bf16)
            keep.append((net, opt))
            continue
        model = torch.compile(net) if mode == "compile" else net

        def step(model=model, opt=opt):
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
                logits = model(xb)
            F.cross_entropy(logits.flatten(0, 1).float(), yb.flatten()).backward()
            opt.step()

        runs[norm] = step
    times: dict[str, list[float]] = {n: [] for n in norms}
    hosts: dict[str, list[float]] = {n: [] for n in norms}
    for i in range(warmup + steps):
        for norm in norms:
            total, host = timed_call(runs[norm])
            if i >= warmup:
                times[norm].append(total)
                hosts[norm].append(host)
    del runs, keep
    torch.cuda.empty_cache()
    return {n: (statistics.median(times[n]), statistics.median(hosts[n])) for n in norms}
