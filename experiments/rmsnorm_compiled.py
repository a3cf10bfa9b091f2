"""The CS336 LM's training step with the Triton RMSNorm as custom ops, against ``F.rms_norm``:
eager, one CUDA graph per step, ``torch.compile`` (default mode), and the compiled step captured
in one CUDA graph; every variant's step interleaved round by round in one process.

Norms: ``torch`` (``F.rms_norm``), ``triton`` (``TritonRMSNorm``: compiled, the ``triton_op``
pair Inductor sees into; eager, the prepared host path) and, compiled only, ``opaque`` (the same
kernels through the opaque ``custom_op`` twins, which Inductor calls as external kernels; Note
[compiled callers]). The variants' models share every Linear and Embedding weight and one fused,
capturable AdamW, so a size's whole set fits one GPU; each step is zero_grad, forward (bf16
autocast or not), float32 loss, backward, optimizer step, as ``paracheck.bench.lm``'s.

Before timing, each norm's compiled and eager loss and gradients are compared with the torch
norm's eager ones (relative error of the flattened gradients, TF32 or bf16 rounding).

Per round every variant runs one step (the order rotated each round), synchronised before and
after; the ratio of a round is the variant's step over the torch norm's in the same mode and
round. Reported: median step time, median ratio, its quartiles and extremes over the rounds.

    PYTHONPATH=src python experiments/rmsnorm_compiled.py --sizes small,medium --dtypes fp32,bf16 \
        --groups eager,compile --rounds 30 --deadline 500 --json out.jsonl
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from paracheck.bench.lm import graphed_step, timed_call
from paracheck.kernels import TritonRMSNorm
from paracheck.workloads.lm import LMSpec, TransformerLM

NORMS = {"eager": ("torch", "triton"), "compile": ("torch", "triton", "opaque")}
MODES = {"eager": ("eager", "graph"), "compile": ("compile", "cgraph")}


class OpaqueNorm(TritonRMSNorm):
    """``TritonRMSNorm`` whose compiled calls take the opaque ops (eager calls are the same)."""

    def forward(self, x):
        if torch.compiler.is_compiling():
            w = self.weight.contiguous()
            return torch.ops.paracheck.rms_norm_forward_opaque(x, w, float(self.eps))[0]
        return super().forward(x)


def _net(size: str, norm: str, base=None):
    torch.manual_seed(0)
    with torch.device("cuda"):
        net = TransformerLM(LMSpec.size(size, norm="triton" if norm == "opaque" else norm))
    if norm == "opaque":
        for mod in list(net.modules()):
            for child in ("ln1", "ln2", "ln_final"):
                if isinstance(getattr(mod, child, None), TritonRMSNorm):
                    setattr(mod, child, OpaqueNorm(net.spec.d_model).cuda())
    if base is not None:  # share the big weights: one copy, one .grad, one optimizer state
        mods = dict(base.named_modules())
        for name, mod in net.named_modules():
            if isinstance(mod, (torch.nn.Linear, torch.nn.Embedding)):
                mod.weight = mods[name].weight
    return net


def _step(model, opt, xb, yb, bf16):
    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            logits = model(xb)
        F.cross_entropy(logits.flatten(0, 1).float(), yb.flatten()).backward()
        opt.step()

    return step


def _grads(model, params, xb, yb, bf16):
    for p in params:
        p.grad = None
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
        logits = model(xb)
    loss = F.cross_entropy(logits.flatten(0, 1).float(), yb.flatten())
    loss.backward()
    flat = torch.cat([p.grad.double().flatten() for p in params])
    for p in params:
        p.grad = None
    return loss.item(), flat


def build(size, group, bf16, xb, yb, log):
    """The group's variants: name -> step; checks each compiled/eager norm against eager torch."""
    norms = NORMS[group]
    nets = {}
    for norm in norms:
        nets[norm] = _net(size, norm, nets.get("torch"))
    params = list({id(p): p for n in nets.values() for p in n.parameters()}.values())
    opt = torch.optim.AdamW(params, lr=1e-4, fused=True, capturable=True)
    shared = [p for p in nets["torch"].parameters() if p.dim() == 2]
    t0 = time.perf_counter()
    runs = {n: (torch.compile(net) if group == "compile" else net) for n, net in nets.items()}
    want_loss, want = _grads(nets["torch"], shared, xb, yb, bf16)
    tol = 5e-2 if bf16 else 1e-2  # a wrong norm is off by O(1); TF32 and bf16 reorderings are not
    for norm, model in runs.items():
        loss, got = _grads(model, shared, xb, yb, bf16)
        err = ((got - want).norm() / want.norm()).item()
        ok = abs(loss - want_loss) <= tol * abs(want_loss) and err <= tol
        log(dict(check=f"{group}/{norm}", size=size, bf16=bf16, loss=loss, want_loss=want_loss,
                 grad_rel_err=err, ok=ok))  # fmt: skip
        if not ok:
            raise SystemExit(f"{group}/{norm} at {size}: loss {loss} vs {want_loss}, err {err}")
    log(dict(event="compiled and checked", size=size, bf16=bf16, group=group,
             seconds=time.perf_counter() - t0))  # fmt: skip
    steps = {}
    for norm, model in runs.items():
        steps[f"{MODES[group][0]}/{norm}"] = _step(model, opt, xb, yb, bf16)
    for norm, model in runs.items():
        try:
            steps[f"{MODES[group][1]}/{norm}"] = graphed_step(model, opt, xb, yb, bf16)
        except Exception as e:  # the unreplayed variants are still timed
            log(dict(capture_failed=f"{MODES[group][1]}/{norm}", size=size, error=repr(e)[:500]))
            torch.cuda.synchronize()
    return steps, (nets, runs, opt)


def interleave(steps, rounds, warmup, deadline):
    names = list(steps)
    times = {n: [] for n in names}
    hosts = {n: [] for n in names}
    for r in range(warmup + rounds):
        if r >= warmup + 5 and time.monotonic() > deadline:
            break
        k = r % len(names)
        for n in names[k:] + names[:k]:
            total, host = timed_call(steps[n])
            if r >= warmup:
                times[n].append(total)
                hosts[n].append(host)
    return times, hosts


def kernel_profile(steps, log, size, dtype):
    """Per unreplayed variant, one profiled step: GPU kernels launched and their summed time,
    which separate a norm that adds launches (host time) from one that adds GPU time."""
    from torch.profiler import ProfilerActivity, profile

    for name, step in steps.items():
        if name.split("/")[0] not in ("eager", "compile"):
            continue
        try:
            step()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                step()
                torch.cuda.synchronize()
            kernels = [
                e
                for e in prof.key_averages()
                if e.device_type == torch.autograd.DeviceType.CUDA and e.self_device_time_total
            ]
            log(dict(profile=name, size=size, dtype=dtype,
                     kernels=sum(e.count for e in kernels),
                     kernel_us=sum(e.self_device_time_total for e in kernels)))  # fmt: skip
        except Exception as e:  # a profiler failure must not cost the timings
            log(dict(profile=name, error=repr(e)[:300]))


def _q(v, q):
    v = sorted(v)
    i = (len(v) - 1) * q
    lo = int(i)
    return v[lo] + (v[min(lo + 1, len(v) - 1)] - v[lo]) * (i - lo)


def summarise(times, hosts, size, dtype, log):
    rows = []
    for name in times:
        mode, norm = name.split("/")
        base = times.get(f"{mode}/torch")
        if not base:
            continue
        ratios = [a / b for a, b in zip(times[name], base)]
        row = dict(size=size, dtype=dtype, mode=mode, norm=norm, rounds=len(ratios),
                   step_ms=statistics.median(times[name]), host_ms=statistics.median(hosts[name]),
                   ratio=statistics.median(ratios), q1=_q(ratios, 0.25), q3=_q(ratios, 0.75),
                   lo=min(ratios), hi=max(ratios))  # fmt: skip
        log(row)
        rows.append(row)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="small,medium,xl")
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--groups", default="eager,compile")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--deadline", type=float, default=540, help="seconds; later configs skipped")
    ap.add_argument("--profile", action="store_true", help="kernels per step, after timing")
    ap.add_argument("--json", default=None, help="append one JSON object per line here")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to measure")
        return 0
    start = time.monotonic()
    out = open(args.json, "a") if args.json else None

    def log(obj):
        line = json.dumps(obj)
        print(line, flush=True)
        if out:
            out.write(line + "\n")
            out.flush()

    log(dict(device=torch.cuda.get_device_name(), torch=torch.__version__))
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    rows = []
    # Group-major: where the deadline cuts the run short, the first group has every size.
    configs = [(s, d, g) for g in args.groups.split(",") for s in args.sizes.split(",")
               for d in args.dtypes.split(",")]  # fmt: skip
    for i, (size, dtype, group) in enumerate(configs):
        left = args.deadline - (time.monotonic() - start)
        if left < 30:
            log(dict(skipped=[size, dtype, group], reason="deadline"))
            continue
        # Timing gets this config's share of what is left, after its build.
        spec = LMSpec.size(size)
        g = torch.Generator().manual_seed(0)
        xb = torch.randint(spec.vocab_size, (4, spec.context_length), generator=g).cuda()
        yb = torch.randint(spec.vocab_size, (4, spec.context_length), generator=g).cuda()
        torch._dynamo.reset()
        try:
            steps, keep = build(size, group, dtype == "bf16", xb, yb, log)
        except Exception as e:  # out of memory, a failed capture: the other configs still run
            log(dict(skipped=[size, dtype, group], reason=repr(e)[:500]))
            torch.cuda.empty_cache()
            continue
        now = time.monotonic() - start
        share = (args.deadline - now) / (len(configs) - i)
        times, hosts = interleave(steps, args.rounds, args.warmup, time.monotonic() + share)
        rows += summarise(times, hosts, size, dtype, log)
        if args.profile:
            kernel_profile(steps, log, size, dtype)
        del steps, keep
        torch.cuda.empty_cache()
    print("\n| size | dtype | mode | norm | rounds | step ms | host ms | ratio | q1-q3 | min-max |")
    print("| --- | --- | --- | --- | ---: | ---: | ---: | ---: | --- | --- |")
    for r in rows:
        print(f"| {r['size']} | {r['dtype']} | {r['mode']} | {r['norm']} | {r['rounds']} | "
              f"{r['step_ms']:.2f} | {r['host_ms']:.2f} | {r['ratio']:.3f} | "
              f"{r['q1']:.3f}-{r['q3']:.3f} | {r['lo']:.3f}-{r['hi']:.3f} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
