"""The ``zero`` kind's rank program: a ZeRO wrapper ``Class(module, optimizer_cls, *, params,
bucket_size_mb, **kwargs)`` with ``forward``, ``finish_gradient_synchronization()``,
``no_sync()``, ``step()``, ``zero_grad()`` (of every parameter of the module:
``Case.zero_grad_module``), ``param_groups``, ``add_param_group``, ``state_dict()``; optional
``full_gradients()`` (then gradients are compared too), ``layout`` and ``pieces``
(``paracheck.zero.Zero1``), ``optimizer`` (the ``torch.optim.Optimizer`` an LR scheduler is built
on). It synchronises gradients itself; its traffic includes that synchronisation.

As for ``sharded`` (``paracheck.check.ranks.sharded``), the rank program calls only what the
interface offers and records, per step, parameters, the optimizer state, its bytes and the
collectives; the declared pieces once. The ``zero2`` kind's program (``run_zero2``) records, in
addition, what gradients each rank still holds once a step's gradients are synchronised (Note
[Gradients kept as shards] in ``paracheck.check.properties.placement``).
"""

from __future__ import annotations

import contextlib

import torch.distributed as dist

from paracheck.accounting.traffic import record_collectives
from paracheck.cases import (
    Case,
    add_late_groups,
    apply_lr_schedule,
    build_case_model,
    step_scheduler,
)
from paracheck.check.ranks._common import (
    CLIP_SKIPPED,
    LOSS_SCALE_SKIPPED,
    clip_gradients,
    declared_unsupported,
    on_every_rank,
    rank_device,
    snapshot,
    target_object,
    train_micro_steps,
)
from paracheck.check.ranks._drive import DDPDriver
from paracheck.check.ranks._optimizer import (
    Closure,
    build_zero,
    read_state,
    record_masters,
    scheduler_or_skip,
    state_bytes,
)
from paracheck.check.ranks.fsdp import CollectiveWatch, in_module_order, storage_elements
from paracheck.check.ranks.job import RankJob
from paracheck.check.ranks.record import RankRecord, RankStep
from paracheck.world import set_step

__all__ = ["held_gradient_elements", "run_zero", "run_zero2"]


def run_zero2(job: RankJob) -> RankRecord:
    """``run_zero``, recording after each step's synchronisation the gradients the rank holds
    (Note [Gradients kept as shards] in ``paracheck.check.properties.placement``)."""
    return run_zero(job, watch=True)


def _full_gradients(got, model, params: list, trainable: list, index: dict) -> list:
    """What ``full_gradients()`` returned, one entry per parameter in module order. Accepted: one
    gradient per trainable parameter (in the wrapper's ``trainable`` order where it declares one),
    one per parameter (None for frozen ones), or a dict by name."""
    names = [n for n, _ in model.named_parameters()]
    mask = [p.requires_grad for p in params]
    if isinstance(got, dict) or len(names) != len(params):
        return in_module_order(got, names, "full_gradients()", mask)
    got = list(got)
    if len(got) == len(trainable):
        grads = [None] * len(params)
        for p, g in zip(trainable, got):
            grads[index[id(p)]] = g
        return grads
    return in_module_order(got, names, "full_gradients()", mask)


def run_zero(job: RankJob, *, watch: bool = False) -> RankRecord:
    """Train ``job.case`` with the ZeRO wrapper at ``job.path`` (gradient sync included). The
    LR scheduler is built on its ``optimizer`` (itself if it has none); ``reload_at_step`` is not
    exercised here (a second wrapper over the same module would hook it twice). With ``watch``,
    each step also records ``scattered`` and ``held_grad_elements``."""
    case: Case = job.case
    rank = dist.get_rank()
    device = rank_device(job.device)
    unsupported = declared_unsupported(target_object(job.path), case, job.path)
    if unsupported:
        return RankRecord.skip(unsupported)
    model = build_case_model(case, rank, device=device)
    params, zero = on_every_rank(
        lambda: build_zero(case, model, target_object(job.path)),
        device,
        "constructing the optimizer",
    )
    index = {id(p): i for i, p in enumerate(params)}
    trainable = getattr(zero, "trainable", [p for p in params if p.requires_grad])
    scheduler, skipped = scheduler_or_skip(case, getattr(zero, "optimizer", zero), device)
    if skipped:
        return RankRecord.skip(skipped)
    if case.clip_norm is not None and not callable(getattr(zero, "clip_grad_norm_", None)):
        return RankRecord.skip(CLIP_SKIPPED)
    if case.loss_scale is not None:
        return RankRecord.skip(LOSS_SCALE_SKIPPED)
    initial_params, initial_buffers, steps = snapshot(params), snapshot(model.buffers()), []
    full_gradients = getattr(zero, "full_gradients", None)
    drv = DDPDriver.of(zero)
    stepped = getattr(zero, "optimizer", zero)
    for step in range(case.steps):
        set_step(step)  # named if the rank exceeds its memory cap
        add_late_groups(case, zero, params, step)
        scattered = held = None
        if case.closure:
            with record_collectives() as rec:
                zero.step(Closure(case, drv, zero, rank, device, step))
            traffic = rec.traffic()  # the synchronisation is ZeRO's own traffic
        else:
            zero.zero_grad(set_to_none=case.set_to_none)
            scatters = CollectiveWatch("reduce_scatter") if watch else contextlib.nullcontext()
            with record_collectives() as rec, scatters:
                train_micro_steps(case, drv, zero, rank, device, step)
            if watch:
                scattered = scatters.settled()
                held = held_gradient_elements(model.parameters(), stepped)
            clip_gradients(
                case, zero, params, step, device, own_only=True
            )  # not the step's traffic
        grads = None
        if full_gradients is not None:
            grads = snapshot(_full_gradients(full_gradients(), model, params, trainable, index))
        if not case.closure:
            with record_collectives() as rec_step:
                zero.step()
            traffic = rec.traffic() + rec_step.traffic()
        apply_lr_schedule(case, zero)
        step_scheduler(scheduler)
        masters = record_masters(case, zero, index, len(params), device)
        sd, state, how = on_every_rank(lambda: read_state(zero, index), device, "state_dict()")
        steps.append(
            RankStep(
                snapshot(params),
                grads,
                state=state,
                state_read=how,
                state_bytes=state_bytes(zero),
                traffic=traffic.entries,
                masters=masters,
                scattered=scattered,
                held_grad_elements=held,
            )
        )
    pieces = getattr(zero, "pieces", None)
    declared, bucket_numels = None, None
    if pieces is not None:
        declared = tuple((index[id(trainable[pc.param])], pc.start, pc.length) for pc in pieces)
        bucket_numels = tuple(b.numel for b in zero.layout.buckets)
    return RankRecord(
        initial_params,
        initial_buffers,
        tuple(steps),
        pieces=declared,
        bucket_numels=bucket_numels,
        final_state_dict=sd,
    )


def held_gradient_elements(module_params, optimizer) -> int:
    """Elements of gradient storage reachable from the ``.grad`` of the module's parameters and of
    the tensors ``optimizer`` steps (its ``param_groups``): each storage once, whole (a view into a
    larger buffer counts the buffer)."""
    tensors = list(module_params)
    for group in getattr(optimizer, "param_groups", ()):
        tensors += list(group["params"])
    return storage_elements(t.grad for t in tensors if t.grad is not None)
