"""Is AccumulateGrad slow when .grad is a view into a larger flat buffer? (single GPU)"""

import time

import torch
import torch.nn.functional as F

from paracheck.workloads import LMSpec, TransformerLM

torch.backends.cuda.matmul.allow_tf32 = True
with torch.device("cuda"):
    m = TransformerLM(LMSpec.size("large"))
ps = list(m.parameters())
x = torch.randint(10000, (4, 256), device="cuda")
y = torch.randint(10000, (4, 256), device="cuda")
buf = torch.zeros(sum(p.numel() for p in ps), device="cuda")


def views():
    off = 0
    for p in ps:
        p.grad = buf[off : off + p.numel()].view_as(p)
        off += p.numel()


def standalone():
    for p in ps:
        p.grad = torch.zeros_like(p)


def none():
    for p in ps:
        p.grad = None


def hooked_noop():
    pass


for name, prep in (("none", none), ("standalone", standalone), ("views", views), ("none", none)):
    ts = []
    for _ in range(5):
        prep()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        F.cross_entropy(m(x).flatten(0, 1), y.flatten()).backward()
        torch.cuda.synchronize()
        ts.append(1000 * (time.perf_counter() - t0))
    print(name, [round(t, 1) for t in ts], flush=True)
hs = [p.register_post_accumulate_grad_hook(lambda p: None) for p in ps]
for name, prep in (("views+noop hook", views), ("none+noop hook", none)):
    ts = []
    for _ in range(5):
        prep()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        F.cross_entropy(m(x).flatten(0, 1), y.flatten()).backward()
        torch.cuda.synchronize()
        ts.append(1000 * (time.perf_counter() - t0))
    print(name, [round(t, 1) for t in ts], flush=True)
