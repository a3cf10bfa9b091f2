"""What the asv suite's ``setup_cache`` functions call: measure a whole grid in one ``World``.

asv runs every benchmark in its own process; starting ranks costs seconds each time. So each
benchmark module has one ``setup_cache`` that measures its whole parameter grid here, on one
World, and returns plain dicts keyed by the grid point; the ``track_`` methods only look values
up, and ``setup`` raises ``NotImplementedError`` (asv: skipped) for points that could not be
measured (a variant this commit lacks, missing GPUs). Keys are ``"|"``-joined parameter values.
"""

from __future__ import annotations

__all__ = [
    "key",
    "skip_reason",
    "measure_steps",
    "measure_allreduce",
    "measure_buckets",
    "measure_lm",
    "measure_overlap",
    "measure_rmsnorm",
    "require",
]


def key(*params) -> str:
    return "|".join(str(p) for p in params)


def skip_reason(device: str, world_size: int) -> str | None:
    """Why a tier cannot run here (None when it can)."""
    if device != "cuda":
        return None
    import torch

    if not torch.cuda.is_available():
        return "no CUDA device"
    if torch.cuda.device_count() < world_size:
        return f"{torch.cuda.device_count()} CUDA device(s), the GPU tier needs {world_size}"
    return None


def require(results: dict, k: str) -> dict:
    """The measurement at ``k``, or ``NotImplementedError`` (asv's skip) saying why not."""
    if "skip" in results:
        raise NotImplementedError(results["skip"])
    if k not in results:
        raise NotImplementedError(
            f"{k} was not measured: {results.get('missing', {}).get(k, 'not available here')}"
        )
    value = results[k]
    if "error" in value:
        raise NotImplementedError(f"{k} failed: {value['error'][:300]}")
    return value


def _world(device: str, size: int):
    from paracheck.world import World

    return World(size, backend="nccl" if device == "cuda" else "gloo", timeout=600.0)


def measure_steps(
    *,
    device: str,
    models,
    variants,
    world_size: int = 2,
    bucket_mb: float = 25.0,
    steps: int = 8,
    warmup: int = 2,
    exact: bool = True,
) -> dict:
    """``{key(model, variant): StepTiming.to_dict() + {"account": ...}}`` for every available
    variant (``local`` on one rank)."""
    reason = skip_reason(device, world_size)
    if reason:
        return {"skip": reason}
    from paracheck.bench.step import StepSpec, account_step, time_step
    from paracheck.bench.suites import model_for
    from paracheck.bench.variants import available_variants

    present = available_variants(variants, include_local=True)
    out: dict = {
        "missing": {
            key(m, v): "not available in this commit"
            for m in models
            for v in variants
            if v not in present
        }
    }
    with _world(device, world_size) as world:
        for m in models:
            for v in present:
                spec = StepSpec(
                    v,
                    model_for(m),
                    world_size=1 if v == "local" else world_size,
                    bucket_mb=bucket_mb,
                    steps=steps,
                    warmup=warmup,
                )
                try:
                    d = time_step(world, spec).to_dict()
                    d["account"] = account_step(world, spec).to_dict() if exact else None
                except Exception as exc:  # noqa: BLE001 - recorded, reported by require()
                    d = {"error": f"{type(exc).__name__}: {exc}"}
                out[key(m, v)] = d
    return out


def measure_buckets(
    *,
    device: str,
    model: str,
    buckets,
    variants=("bucketed", "torch-ddp"),
    world_size: int = 2,
    steps: int = 8,
    warmup: int = 2,
) -> dict:
    reason = skip_reason(device, world_size)
    if reason:
        return {"skip": reason}
    from paracheck.bench.step import StepSpec, time_step
    from paracheck.bench.suites import model_for
    from paracheck.bench.variants import available_variants

    out: dict = {}
    with _world(device, world_size) as world:
        for v in available_variants(variants):
            for mb in buckets:
                spec = StepSpec(
                    v,
                    model_for(model),
                    world_size=world_size,
                    bucket_mb=float(mb),
                    steps=steps,
                    warmup=warmup,
                )
                try:
                    out[key(v, mb)] = time_step(world, spec).to_dict()
                except Exception as exc:  # noqa: BLE001
                    out[key(v, mb)] = {"error": f"{type(exc).__name__}: {exc}"}
    return out


def measure_allreduce(*, device: str, sizes_mb, world_sizes) -> dict:
    reason = skip_reason(device, max(world_sizes))
    if reason:
        return {"skip": reason}
    from paracheck.bench.comm import all_reduce_time

    out: dict = {}
    with _world(device, max(world_sizes)) as world:
        for w in world_sizes:
            for mb in sizes_mb:
                out[key(w, mb)] = all_reduce_time(world, mb, w).to_dict()
    return out


def measure_lm(*, device: str, models, steps: int = 5) -> dict:
    reason = skip_reason(device, 1)
    if reason:
        return {"skip": reason}
    from paracheck.bench.lm import time_lm
    from paracheck.bench.suites import model_for

    out: dict = {}
    for m in models:
        for ac in (False, True):
            try:
                out[key(m, ac)] = time_lm(
                    model_for(m), autocast=ac, device=device, steps=steps
                ).to_dict()
            except Exception as exc:  # noqa: BLE001
                out[key(m, ac)] = {"error": f"{type(exc).__name__}: {exc}"}
    return out


def measure_rmsnorm(*, shapes, dtypes=("float32",)) -> dict:
    """``{key(rows, d, dtype): RMSNormBandwidth.to_dict()}`` on one GPU (needs triton): GPU and
    back-to-back time, Liger-Kernel beside the others where it is installed."""
    reason = skip_reason("cuda", 1)
    if reason:
        return {"skip": reason}
    from paracheck.kernels import triton_available

    if not triton_available():
        return {"skip": "triton is not installed (pip install 'paracheck[triton]')"}
    import torch

    from paracheck.bench.rmsnorm import measure_rmsnorm as measure

    out: dict = {}
    for dtype in dtypes:
        try:
            for r in measure(
                device="cuda", shapes=shapes, dtype=getattr(torch, dtype), loop=True, liger=True
            ):
                out[key(r.rows, r.d, dtype)] = r.to_dict()
        except Exception as exc:  # noqa: BLE001 - recorded, reported by require()
            for rows, d in shapes:
                out[key(rows, d, dtype)] = {"error": f"{type(exc).__name__}: {exc}"}
    return out


def measure_overlap(*, model: str, variants, world_size: int = 2) -> dict:
    reason = skip_reason("cuda", world_size)
    if reason:
        return {"skip": reason}
    from paracheck.bench.overlap import overlap_share
    from paracheck.bench.step import StepSpec
    from paracheck.bench.suites import model_for
    from paracheck.bench.variants import available_variants

    out: dict = {}
    with _world("cuda", world_size) as world:
        for v in available_variants(variants):
            try:
                out[key(v)] = overlap_share(
                    world, StepSpec(v, model_for(model), world_size=world_size)
                ).to_dict()
            except Exception as exc:  # noqa: BLE001
                out[key(v)] = {"error": f"{type(exc).__name__}: {exc}"}
    return out
