"""The ``sharded`` kind's rank program: a sharded optimizer ``Class(params, optimizer_cls,
**kwargs)`` (a ``torch.optim.Optimizer``, CS336 ``ShardedOptimizer``) trained on gradients that
paracheck's ``FlatDDP`` (checked on its own) synchronises before ``step()``. Optional:
``partition`` (an object with ``owners``, one per parameter of ``param_groups`` flattened) and
``local_optimizer`` (or ``optim``), the wrapped optimizer.

The rank program calls only what the interface offers: the harness never resets a gradient
itself, so ``zero_grad()`` must clear every parameter of the optimizer's groups (not only this
rank's shard). Per case it follows the case's protocols (``Case``): an LR scheduler built on the
target and stepped after every step (a target that is not a ``torch.optim.Optimizer`` cannot
carry one: the case is skipped with a note), parameter groups as dicts of generators,
``add_param_group`` mid-training, ``step(closure)``, and ``state_dict()`` -> a fresh instance ->
``load_state_dict()`` mid-training (``reload_at_step``).

Every step records parameters, gradients, the optimizer state this rank's ``state_dict()`` returns
(mapped to parameter indices as ``paracheck.oracle.train.optimizer_state`` does; Note [State dict
conventions]), the bytes of optimizer state this rank holds, the collectives issued during the
step (``record_collectives``; ``state_dict()``, the gradient gathering for the check and the
closure's gradient synchronisation are outside it) and the declared owners.
"""

from __future__ import annotations

import torch.distributed as dist

from paracheck.accounting.traffic import record_collectives
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
    declared_unsupported,
    on_every_rank,
    rank_device,
    snapshot,
    step_optimizer,
    target_object,
    train_micro_steps,
    unscale,
)
from paracheck.check.ranks._drive import DDPDriver
from paracheck.check.ranks._optimizer import (
    Closure,
    StateWatch,
    declared_owners,
    minus,
    read_state,
    record_masters,
    scheduler_or_skip,
    state_bytes,
    state_dict_of,
)
from paracheck.check.ranks.job import RankJob
from paracheck.check.ranks.record import RankRecord, RankStep
from paracheck.world import set_step

__all__ = ["run_sharded"]


def _reload(case: Case, opt, scheduler, params, cls, step: int, device):
    """Before step ``step``: save ``opt`` (and the scheduler), build a fresh instance over the same
    parameters with the constructor's groups, its scheduler, then the groups added so far, and
    load both dicts (the usual checkpoint order: construct, then load)."""

    def fresh():
        saved = state_dict_of(opt)
        saved_scheduler = None if scheduler is None else scheduler.state_dict()
        new = build_optimizer(case, params, optimizer_cls=cls)
        new_scheduler = build_scheduler(case, new) if scheduler is not None else None
        for k in range(step):
            add_late_groups(case, new, params, k)
        new.load_state_dict(saved)
        if new_scheduler is not None:
            new_scheduler.load_state_dict(saved_scheduler)
        return new, new_scheduler

    return on_every_rank(fresh, device, "building a fresh optimizer and load_state_dict()")


def run_sharded(job: RankJob) -> RankRecord:
    """Train ``job.case`` with FlatDDP for the gradients and the sharded optimizer at ``job.path``."""
    from paracheck.ddp import FlatDDP

    case: Case = job.case
    rank = dist.get_rank()
    device = rank_device(job.device)
    cls = target_object(job.path)
    unsupported = declared_unsupported(cls, case, job.path)
    if unsupported:
        return RankRecord.skip(unsupported)
    model = build_case_model(case, rank, device=device)
    ddp = DDPDriver.of(FlatDDP(model))
    params = list(model.parameters())
    index = {id(p): i for i, p in enumerate(params)}
    opt = on_every_rank(
        lambda: build_optimizer(case, params, optimizer_cls=cls),
        device,
        "constructing the optimizer",
    )
    scheduler, skipped = scheduler_or_skip(case, opt, device)
    if skipped:
        return RankRecord.skip(skipped)
    scaler = build_grad_scaler(case, device)
    if scaler is not None and not hasattr(opt, "param_groups"):
        return RankRecord.skip(
            "loss scaling is not checked: torch.amp.GradScaler unscales the gradients of "
            "optimizer.param_groups, and the target has none"
        )
    initial_params, initial_buffers, steps = snapshot(params), snapshot(model.buffers()), []
    watch = StateWatch(index)
    for step in range(case.steps):
        set_step(step)  # named if the rank exceeds its memory cap
        if case.reload_at_step == step:
            opt, scheduler = _reload(case, opt, scheduler, params, cls, step, device)
        add_late_groups(case, opt, params, step)
        if case.closure:
            closure = Closure(case, ddp, opt, rank, device, step)
            with record_collectives() as rec:
                opt.step(closure)
            traffic = minus(rec.traffic(), closure.traffic)
            grads = snapshot([p.grad for p in params])  # after the step: the closure computed them
        else:
            opt.zero_grad(set_to_none=case.set_to_none)
            train_micro_steps(case, ddp, opt, rank, device, step, scaler=scaler)
            unscale(scaler, opt)
            clip_gradients(case, opt, params, step, device, own_only=False)
            grads = snapshot([p.grad for p in params])
            with record_collectives() as rec:
                step_optimizer(scaler, opt)
            traffic = rec.traffic()
        apply_lr_schedule(case, opt)
        step_scheduler(scheduler)
        masters = record_masters(case, opt, index, len(params), device)
        sd, state, how = on_every_rank(lambda: read_state(opt, index), device, "state_dict()")
        steps.append(
            RankStep(
                snapshot(params),
                grads,
                state=state,
                state_read=how,
                state_bytes=state_bytes(opt),
                traffic=traffic.entries,
                masters=masters,
                owners=declared_owners(opt, index, len(params)),
                state_stepped=watch.stepped(opt),
            )
        )
    return RankRecord(initial_params, initial_buffers, tuple(steps), final_state_dict=sd)
