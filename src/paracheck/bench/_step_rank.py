"""The two jobs of ``paracheck.bench.step`` as they run on a rank: ``rank_time`` and
``rank_account``, and what they share (building the variant, one training step, releasing what
a job held).

Note [CUDA memory points]
    ``init``: the peak while the model, the variant and the optimizer are built. ``before_step``:
    the peak during forward, backward and gradient synchronisation of a steady-state step.
    ``after_step``: the peak during that step's ``optimizer.step()``. ``peak``: the maximum over
    the whole job. All from ``torch.cuda.max_memory_allocated`` (tensors, not the caching
    allocator's reserve), reset between the points; the allocator acts when a kernel is launched,
    not when it runs, so no synchronisation is needed and the timed steps are not disturbed (the
    points are taken on one extra step after the timed ones).

Note [Measuring from a clean state]
    The ranks outlive a job: every (model, variant) of a run is measured in the same processes,
    so a job must start from what a fresh process holds. Each job starts and ends with
    ``release``: garbage collection, then on CUDA a device synchronisation, ``empty_cache`` and
    ``reset_peak_memory_stats``. A cycle through a tensor's hooks (a wrapper whose hook closes
    over it, the hook stored on its parameter) is never collected, so the built-in wrappers
    hold themselves weakly from their hooks. ``release`` returns the bytes still held (CUDA:
    ``memory_allocated``; CPU, when asked, every tensor storage the garbage collector reaches,
    each once): ``start_bytes`` at the job's start (what earlier jobs left) and ``left_bytes``
    at its end (what this job left), both 0 when nothing leaks. The CUDA points are taken above
    the job's start, so an earlier job's leak never shows as this job's memory, and the tables
    print ``start_bytes`` beside them. (``account_step``'s recorder counts only the allocations
    made inside its own job and needs none of this.)
"""

from __future__ import annotations

import contextlib
import gc
import time

import torch

from paracheck.bench._step_spec import DTYPES, StepSpec

__all__ = [
    "live_tensor_bytes",
    "optimizer_state_tensors",
    "rank_account",
    "rank_time",
    "release",
]


def rank_device():
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def build_model(spec: StepSpec, device: torch.device):
    from paracheck.workloads.lm import TransformerLM

    devices = [device.index] if device.type == "cuda" else []
    # Built directly on the device (an xl model initialised on the CPU takes tens of seconds), from
    # a forked RNG so the rank's global generator is left as it was.
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(spec.seed)
        with torch.device(device):
            model = TransformerLM(spec.model)
    return model.to(dtype=DTYPES[spec.dtype])


def rank_batch(spec: StepSpec, device: torch.device, rank: int):
    g = torch.Generator().manual_seed(1000 * spec.seed + rank)
    shape = (spec.batch, spec.model.context_length)
    x = torch.randint(spec.model.vocab_size, shape, generator=g)
    y = torch.randint(spec.model.vocab_size, shape, generator=g)
    return x.to(device), y.to(device)


def train_step(setup, x, y, *, before_step=None, mark=None) -> None:
    """One step of the CS336 protocol; ``before_step()`` runs between the gradient
    synchronisation and ``optimizer.step()`` (the memory points); ``mark(phase)`` is told each
    phase of Note [Communication schedule of a step] as it begins."""
    import torch.nn.functional as F

    mark = mark or _no_mark
    mark("forward")
    setup.optimizer.zero_grad(set_to_none=True)
    if setup.before_forward is not None:
        setup.before_forward()
    logits = setup.forward(x)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1))
    mark("backward")
    loss.backward()
    del logits, loss  # not alive during the optimizer step, as in a training loop's next iteration
    mark("after_backward")
    setup.after_backward()
    if before_step is not None:
        before_step()
    mark("step")
    setup.optimizer.step()


def _no_mark(phase: str) -> None:
    return None


def configure(spec: StepSpec, device: torch.device) -> None:
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = spec.tf32
        torch.backends.cudnn.allow_tf32 = spec.tf32


def _reset_rss_peak() -> bool:
    # Linux: writing 5 to clear_refs resets VmHWM (the peak RSS) of this process.
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _rss_peak() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


_SETTLE_SECONDS = (0.001, 0.002, 0.004, 0.008, 0.016, 0.032)


def live_tensor_bytes() -> int:
    """Bytes of every CPU tensor storage the garbage collector can reach, each storage once."""
    seen: dict[int, int] = {}
    tensor = torch.Tensor
    for obj in gc.get_objects():
        # issubclass of the type, not isinstance: isinstance reads ``__class__``, which some
        # module-level proxies answer with a deprecation warning.
        if issubclass(type(obj), tensor) and obj.device.type == "cpu":
            try:
                st = obj.untyped_storage()
                # A tensor without storage (meta, sparse), or a fake one that a compiled graph's
                # tracing left reachable in this process: it holds no bytes.
                seen[st.data_ptr()] = st.nbytes()
            except (RuntimeError, NotImplementedError):
                continue
    return sum(seen.values())


def release(device, *, count: bool = True) -> int:
    """Free what this process no longer references and reset the CUDA peak; the bytes still held
    (Note [Measuring from a clean state]; on the CPU only with ``count``, else 0)."""
    gc.collect()  # ~0.2 s with torch loaded: twice per job, outside every measured interval
    if device.type == "cuda":
        torch.cuda.synchronize(device)

        def held() -> int:
            return torch.cuda.memory_allocated(device)
    elif count:
        held = live_tensor_bytes
    else:
        return 0
    n = held()
    # A communication backend's thread may still hold a finished collective's tensors (Note
    # [Late frees after a collective] in paracheck.accounting.record): counted again after
    # waits of 1..32 ms while anything is held.
    for wait in _SETTLE_SECONDS:
        if n == 0:
            break
        time.sleep(wait)
        n = held()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    return n


def rank_time(payload: dict) -> dict:
    """World job: time ``payload`` (a ``StepSpec.to_dict()``, and ``"count": True`` to count the
    bytes held on the CPU too) on this rank."""
    import torch.distributed as dist

    payload = dict(payload)
    count = payload.pop("count", False)
    spec = StepSpec.from_dict(payload)
    device = rank_device()
    configure(spec, device)
    rank = dist.get_rank() if dist.is_initialized() else 0
    distributed = dist.is_initialized() and dist.get_world_size() > 1
    cuda = device.type == "cuda"
    start = release(device, count=count)  # Note [Measuring from a clean state]
    _reset_rss_peak()
    from paracheck.bench.variants import build_setup

    model = build_model(spec, device)
    setup = build_setup(
        spec.variant, model, bucket_mb=spec.bucket_mb, device=device, fused=spec.fused and cuda
    )
    memory = {}

    def above_start() -> int:
        return torch.cuda.max_memory_allocated(device) - start

    if cuda:
        memory["init"] = above_start()
    x, y = rank_batch(spec, device, rank)
    times, cpu_times = [], []
    for _ in range(spec.warmup + spec.steps):
        if distributed:
            dist.barrier()
        if cuda:
            torch.cuda.synchronize(device)
        c0 = time.process_time()
        t0 = time.perf_counter()
        train_step(setup, x, y)
        if cuda:
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
        cpu_times.append(time.process_time() - c0)
    if cuda:
        # One extra step for Note [CUDA memory points].
        memory["peak"] = above_start()
        torch.cuda.reset_peak_memory_stats(device)

        def before_step():
            memory["before_step"] = above_start()
            torch.cuda.reset_peak_memory_stats(device)

        train_step(setup, x, y, before_step=before_step)
        memory["after_step"] = above_start()
        memory["peak"] = max(memory.values())
    result = {
        "times": times[spec.warmup :],
        "cpu_times": cpu_times[spec.warmup :],
        "cuda_memory": memory,
        "rss_peak": _rss_peak(),
        "start_bytes": start,
    }
    del setup, model, x, y
    result["left_bytes"] = release(device, count=count)
    return result


def _tensors_in(obj, out: list) -> list:
    if isinstance(obj, torch.Tensor):
        out.append(obj)
    elif isinstance(obj, dict):
        for v in obj.values():
            _tensors_in(v, out)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _tensors_in(v, out)
    return out


def optimizer_state_tensors(opt, _seen=None) -> list:
    """Every tensor of ``opt``'s state and of the optimizers it wraps (ZeroRedundancyOptimizer's
    ``optim``, a sharded optimizer's local optimizer under any attribute name)."""
    seen = set() if _seen is None else _seen
    if id(opt) in seen:
        return []
    seen.add(id(opt))
    tensors = _tensors_in(list(getattr(opt, "state", {}).values()), [])
    for value in vars(opt).values():
        if isinstance(value, torch.optim.Optimizer):
            tensors += optimizer_state_tensors(value, seen)
    return tensors


def _settle(rec) -> None:
    """Let late frees land before a phase boundary (Note [Late frees after a collective])."""
    rec.settle(quiet_steps=3, limit_s=0.2)


def rank_account(payload: dict) -> dict:
    """World job: the exact quantities of ``payload`` (a ``StepSpec.to_dict()``) on this rank.
    A ``"device"`` key in it (``"cuda"``) puts the step there whatever the backend: gloo moves
    CUDA tensors, so one GPU can run a W-rank step's schedule (``scripts/gpu_schedule.py``)."""
    import torch.distributed as dist

    # Imported before the watch patches torch: importing it scripts its functional optimizers
    # (torch.jit.script), which then compiles the watch's patched methods and raises (a torch
    # ZeroRedundancyOptimizer built first in a fresh rank process could not be accounted).
    import torch.distributed.optim  # noqa: F401

    from paracheck.accounting.record import Recorder, count_hooks
    from paracheck.accounting.schedule import ScheduleWatch
    from paracheck.bench._checkpoint import measure_checkpoint
    from paracheck.bench.variants import build_setup

    payload = dict(payload)
    forced = payload.pop("device", None)
    spec = StepSpec.from_dict(payload)
    device = rank_device() if forced is None else torch.device(forced)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    configure(spec, device)
    rank = dist.get_rank() if dist.is_initialized() else 0
    # The watch patches torch (Work.wait, syncing Tensor methods) in this persistent rank
    # process: the stack takes it off however the job ends.
    with count_hooks() as hooks, Recorder() as rec, contextlib.ExitStack() as stack:
        model = build_model(spec, device)
        x, y = rank_batch(spec, device, rank)
        watch = ScheduleWatch(
            rec,
            list(model.parameters()),
            [*model.parameters(), *model.buffers(), x, y],
            tokens=spec.batch * spec.model.context_length,
        )
        stack.enter_context(watch)
        setup = build_setup(
            spec.variant,
            model,
            bucket_mb=spec.bucket_mb,
            device=device,
            fused=spec.fused and device.type == "cuda",
        )
        peak_init = rec.peak_bytes
        init_calls = len(rec.calls)
        # Step 1 allocates the optimizer state; torch DDP rebuilds its buckets (two broadcasts)
        # during step 2. Step 3 is the steady state that every later step repeats.
        train_step(setup, x, y)
        train_step(setup, x, y)
        _settle(rec)
        rec.reset_calls()
        hooks.reset()
        rec.reset_peak()
        phase = {}

        def before_step(rec=rec, model=model):
            _settle(rec)
            params = list(model.parameters())
            phase.update(
                peak_before=rec.peak_bytes,
                params=rec.storage_bytes(params),
                grads=rec.storage_bytes([p.grad for p in params]),
            )
            rec.reset_peak()

        def before_step_timed(before_step=before_step, watch=watch):
            # The memory point's settling sleeps and reads storages: no part of the schedule.
            watch.stop()
            before_step()
            watch.resume()

        watch.start()
        try:
            with _cuda_sync_warnings(device) as cuda_syncs:
                train_step(setup, x, y, before_step=before_step_timed, mark=watch.mark)
        finally:
            stack.close()
        schedule = watch.schedule()
        _settle(rec)
        peak_step = rec.peak_bytes
        state_bytes = rec.storage_bytes(optimizer_state_tensors(setup.optimizer))
        calls = list(rec.calls)
        host = dict(
            operators=rec.operators,
            launches=rec.launches,
            allocations=rec.allocations,
            hooks=hooks.calls,
        )
        # After the step's readings: the save's consolidation is no part of the step.
        checkpoint = measure_checkpoint(model, setup.optimizer, rec, rank=rank)
    by_kind: dict[str, int] = {}
    for c in calls:
        by_kind[c.kind] = by_kind.get(c.kind, 0) + 1
    result = {
        "collectives": len(calls),
        "collectives_by_kind": by_kind,
        "payload_bytes": sum(c.payload_bytes for c in calls),
        "bus_bytes": sum(c.bus_bytes for c in calls),
        "init_collectives": init_calls,
        "optimizer_state_bytes": state_bytes,
        "param_bytes": phase["params"],
        "grad_bytes": phase["grads"],
        "peak_init_bytes": peak_init,
        "peak_before_step_bytes": phase["peak_before"],
        "peak_step_bytes": peak_step,
        **host,
        "schedule": schedule.to_dict(),
        # On CUDA, what torch.cuda.set_sync_debug_mode("warn") reported during the step (the
        # check of Note [Device syncs counted on the CPU]); -1 elsewhere.
        "cuda_sync_warnings": len(cuda_syncs) if device.type == "cuda" else -1,
        "cuda_sync_messages": sorted(set(cuda_syncs))[:20],
        **_schedule_fields(schedule),
        **checkpoint,
    }
    del setup, model, rec, before_step, watch, x, y
    release(device, count=False)
    return result


class _cuda_sync_warnings:
    """On CUDA, the warnings ``torch.cuda.set_sync_debug_mode("warn")`` gives while active (a
    list of messages); an empty list elsewhere."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"
        self.messages: list[str] = []

    def __enter__(self) -> list[str]:
        if self.cuda:
            import warnings

            self._catch = warnings.catch_warnings(record=True)
            self._caught = self._catch.__enter__()
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
        return self.messages

    def __exit__(self, *exc):
        if self.cuda:
            torch.cuda.set_sync_debug_mode("default")
            # torch says once per process that the mode "is a prototype feature": not a sync.
            self.messages += [
                str(w.message)
                for w in self._caught
                if "synchroniz" in str(w.message) and "prototype feature" not in str(w.message)
            ]
            self._catch.__exit__(*exc)
        return False


def _schedule_fields(schedule) -> dict:
    """The derived quantities of ``schedule`` under ``StepAccount``'s field names."""
    return {k.replace("-", "_"): v for k, v in schedule.metrics().items()}
