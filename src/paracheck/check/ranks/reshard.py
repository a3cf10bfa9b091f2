"""The resume rank program of the ``reshard`` property (Note [Resuming at another world size] in
``paracheck.check.properties.reshard``): a fresh world, of another size than the one that saved
the checkpoint, builds the model and the target the way its kind's rank program does, loads the
checkpoint, and trains the steps that were left.

The checkpoint (``RankJob.checkpoint``) is what a user saves: the model's parameters (whole on
every rank after a sharded optimizer's or a ZeRO wrapper's step) and the dict the target's
``state_dict()`` returned (``paracheck.check.ranks._optimizer.state_dict_of``: consolidated onto
every rank, or through ``consolidate_state_dict(to=0)``). Loading follows the usual order:
construct over the model holding the saved parameters, add the groups the training had added
by then, build the LR scheduler and bring it to the saved step, then ``load_state_dict()`` on
every rank. Every step after it records what the kinds' programs record for the comparison
(parameters, gradients where readable, the optimizer state, the masters).
"""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist

from paracheck.cases import (
    Case,
    add_late_groups,
    apply_lr_schedule,
    build_case_model,
    build_optimizer,
    step_scheduler,
)
from paracheck.check.kinds import KINDS
from paracheck.check.ranks._common import (
    CLIP_SKIPPED,
    clip_gradients,
    on_every_rank,
    rank_device,
    snapshot,
    target_object,
    train_micro_steps,
)
from paracheck.check.ranks._drive import DDPDriver
from paracheck.check.ranks._optimizer import (
    build_zero,
    read_state,
    record_masters,
    scheduler_or_skip,
)
from paracheck.check.ranks.job import RankJob
from paracheck.check.ranks.record import RankRecord, RankStep
from paracheck.world import set_step

__all__ = ["bring_to", "run_resumed"]


def _build(case: Case, model, cls, syncs: bool):
    """(params, the target, its driver, the optimizer a scheduler is built on), as the kind's
    program builds them: a ZeRO wrapper over the module, or a sharded optimizer behind FlatDDP."""
    if syncs:
        params, zero = build_zero(case, model, cls)
        return params, zero, DDPDriver.of(zero), getattr(zero, "optimizer", zero)
    from paracheck.ddp import FlatDDP

    ddp = DDPDriver.of(FlatDDP(model))
    params = list(model.parameters())
    opt = build_optimizer(case, params, optimizer_cls=cls)
    return params, opt, ddp, opt


def bring_to(case: Case, opt, params, scheduler, start: int) -> None:
    """The groups added before step ``start`` and the scheduler stepped ``start`` times, as a
    resumed run has them before ``load_state_dict()``: the scheduler with the count and base
    rates ``scheduler.load_state_dict()`` restores, every group with the rate it was built with
    (a scheduler's ``load_state_dict()`` sets no group's rate), so that the rates the saving run
    had at the save are the optimizer's ``load_state_dict()``'s to restore, as they are in use."""
    built = [group["lr"] for group in opt.param_groups]
    with warnings.catch_warnings():
        # "lr_scheduler.step() before optimizer.step()": no step is taken here on purpose.
        warnings.simplefilter("ignore", UserWarning)
        for step in range(start):
            add_late_groups(case, opt, params, step)
            built += [group["lr"] for group in opt.param_groups[len(built) :]]
            step_scheduler(scheduler)
    for group, lr in zip(opt.param_groups, built):
        group["lr"] = lr


def run_resumed(job: RankJob) -> RankRecord:
    """Load ``job.checkpoint`` (``{"params": [...], "state_dict": {...}}``, saved after
    ``job.start`` steps at another world size) into a fresh ``job.kind`` target at ``job.path``
    and train the steps ``start..case.steps-1`` of ``job.case``; the record holds those steps
    only."""
    job.require("checkpoint")
    case: Case = job.case
    start = job.start
    checkpoint = job.checkpoint
    rank = dist.get_rank()
    device = rank_device(job.device)
    cls = target_object(job.path)
    syncs = KINDS[job.kind].syncs_its_groups
    model = build_case_model(case, rank, device=device)
    with torch.no_grad():
        for p, v in zip(model.parameters(), checkpoint["params"]):
            p.copy_(v.to(device=device, dtype=p.dtype))
    params, target, drv, stepped = on_every_rank(
        lambda: _build(case, model, cls, syncs), device, "constructing the optimizer"
    )
    index = {id(p): i for i, p in enumerate(params)}
    scheduler, skipped = scheduler_or_skip(case, stepped, device)
    if skipped:
        return RankRecord.skip(skipped)
    if (
        syncs
        and case.clip_norm is not None
        and not callable(getattr(target, "clip_grad_norm_", None))
    ):
        return RankRecord.skip(CLIP_SKIPPED)
    bring_to(case, target, params, scheduler, start)
    on_every_rank(
        lambda: target.load_state_dict(checkpoint["state_dict"]), device, "load_state_dict()"
    )
    initial_params, initial_buffers, steps = snapshot(params), snapshot(model.buffers()), []
    full_gradients = getattr(target, "full_gradients", None) if syncs else None
    for step in range(start, case.steps):
        set_step(step)
        add_late_groups(case, target, params, step)
        target.zero_grad(set_to_none=case.set_to_none)
        train_micro_steps(case, drv, target, rank, device, step)
        clip_gradients(case, target, params, step, device, own_only=syncs)
        if syncs:
            grads = (
                None if full_gradients is None else _full(full_gradients(), model, params, target)
            )
        else:
            grads = snapshot([p.grad for p in params])
        target.step()
        apply_lr_schedule(case, target)
        step_scheduler(scheduler)
        masters = record_masters(case, target, index, len(params), device)
        _, state, how = on_every_rank(lambda: read_state(target, index), device, "state_dict()")
        steps.append(
            RankStep(snapshot(params), grads, state=state, state_read=how, masters=masters)
        )
    return RankRecord(initial_params, initial_buffers, tuple(steps))


def _full(got, model, params: list, target) -> list:
    """``full_gradients()`` in module order, read as the zero kind's program reads it."""
    from paracheck.check.ranks.zero import _full_gradients  # the zero kind's own reading

    trainable = getattr(target, "trainable", [p for p in params if p.requires_grad])
    index = {id(p): i for i, p in enumerate(params)}
    return snapshot(_full_gradients(got, model, params, trainable, index))
