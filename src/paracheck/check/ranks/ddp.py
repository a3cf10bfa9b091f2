"""The ``ddp`` kind's rank program: train a case with the DDP target; one ``RankRecord`` per rank."""

from __future__ import annotations

import torch.distributed as dist

from paracheck.cases import (
    Case,
    add_late_groups,
    apply_lr_schedule,
    build_case_model,
    build_grad_scaler,
    build_optimizer,
    build_scheduler,
    step_scheduler,
)
from paracheck.check.ranks._common import (
    clip_gradients,
    rank_device,
    snapshot,
    step_optimizer,
    target_object,
    train_micro_steps,
    unscale,
)
from paracheck.check.ranks._compiled import CompiledRun, run_compiled
from paracheck.check.ranks._drive import ddp_driver
from paracheck.check.ranks.job import RankJob
from paracheck.check.ranks.record import RankRecord, RankStep
from paracheck.world import set_step

__all__ = ["run_ddp"]


def run_ddp(job: RankJob) -> RankRecord:
    """Train ``job.case`` with the DDP wrapper at ``job.path``; record every step; a compiled
    case through ``torch.compile`` (Note [Compiled cases]), its cost in ``RankRecord.compiled``.

    Returns ``RankRecord.skip(why)`` instead, on every rank alike, where the case uses a feature the
    target's class declares unsupported (``unsupported_case_features``: feature name -> why, e.g.
    ``{"double_backward": "..."}``), or where the case passes ``bucket_size_mb=None`` and the
    constructor refuses it with a TypeError or ValueError.
    """
    return run_compiled(job, _run_ddp)


def _run_ddp(job: RankJob, compiled: CompiledRun) -> RankRecord:
    case: Case = job.case
    rank = dist.get_rank()
    device = rank_device(job.device)
    cls = target_object(job.path)
    unsupported = [
        f for f in getattr(cls, "unsupported_case_features", {}) if getattr(case, f, False)
    ]
    if unsupported:
        return RankRecord.skip(
            f"{job.path} declares {unsupported[0]}=True unsupported: "
            f"{cls.unsupported_case_features[unsupported[0]]}"
        )
    model = build_case_model(case, rank, device=device)
    try:
        drv = compiled.driver(ddp_driver(job, model, case, cls))
    except (TypeError, ValueError) as exc:
        if not (case.unbounded_bucket and job.takes_bucket):
            raise
        # bucket_size_mb=None is a reading of the interface a correct DDP may refuse: not a failure.
        return RankRecord.skip(
            f"the constructor refuses bucket_size_mb=None ({type(exc).__name__}: {exc})"
        )
    params = list(model.parameters())
    initial_params, initial_buffers, steps = snapshot(params), snapshot(model.buffers()), []
    optimizer = build_optimizer(case, params)
    scheduler = build_scheduler(case, optimizer)
    scaler = build_grad_scaler(case, device)
    for step in range(case.steps):
        set_step(step)  # named if the rank exceeds its memory cap
        add_late_groups(case, optimizer, params, step)
        optimizer.zero_grad(set_to_none=case.set_to_none)
        if drv.batch_start is not None:
            drv.batch_start(optimizer)
        windows: list = []
        train_micro_steps(
            case,
            drv,
            optimizer,
            rank,
            device,
            step,
            windows,
            [p for p in params if p.requires_grad],
            scaler,
        )
        unscale(scaler, optimizer)
        clip_gradients(case, None, params, step, device, own_only=False)
        grads = snapshot([p.grad for p in params])
        step_optimizer(scaler, optimizer)
        apply_lr_schedule(case, optimizer)
        step_scheduler(scheduler)
        steps.append(RankStep(snapshot(params), grads, windows=tuple(windows)))
    return RankRecord(initial_params, initial_buffers, tuple(steps))
