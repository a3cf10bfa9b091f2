"""The ``loop`` kind's rank program: a user's whole training step, ``train_step(model, optimizer,
micro_batches)``, with ``scaler=`` where it takes one (``paracheck.loop`` states the interface),
called once per step of a case.

Every rank builds the case's model from rank 0's initial parameters (the step is checked, not
the initial broadcast) and the case's optimizer over its parameters; the step does everything
else: zeroing, forward and backward of each micro-batch, the loss normalisation it declares
(``Case.loss``, Note [Loss semantics]), synchronisation and ``optimizer.step()``. The target is a
function, or a class whose instance (built once per rank, with no arguments) is called so.
Every step records the parameters after it and the gradients ``optimizer.step()`` was called
with (read by a step pre-hook, at its first call in the step: many loops clear the gradients after
stepping, and under Adam a gradient wrong by a constant factor barely shows in the parameters).
"""

from __future__ import annotations

import inspect

from paracheck.cases import (
    Case,
    batch_for,
    build_case_model,
    build_grad_scaler,
    build_optimizer,
    micro_batches,
)
from paracheck.check.ranks._common import rank_device, snapshot, target_object
from paracheck.check.ranks._compiled import CompiledRun, run_compiled
from paracheck.check.ranks.job import RankJob
from paracheck.check.ranks.record import RankRecord, RankStep
from paracheck.world import set_step

__all__ = ["run_loop"]


def run_loop(job: RankJob) -> RankRecord:
    """Train ``job.case`` with the step at ``job.path``; record every step; in a compiled case
    the model compiled, or the whole step (Note [Compiled loops] in ``paracheck.cases._compile``),
    its cost in ``RankRecord.compiled``."""
    return run_compiled(job, _run_loop)


def _run_loop(job: RankJob, compiled: CompiledRun) -> RankRecord:
    case: Case = job.case
    import torch.distributed as dist

    rank = dist.get_rank()
    device = rank_device(job.device)
    step_fn = target_object(job.path)
    if inspect.isclass(step_fn):
        step_fn = step_fn()
    model = build_case_model(case, 0, device=device)
    params = list(model.parameters())
    initial_params, initial_buffers, steps = snapshot(params), snapshot(model.buffers()), []
    optimizer = build_optimizer(case, params)
    # A step that takes a scaler gets one for the case's loss scale (Note [A loop's own precision]).
    extra = {"scaler": build_grad_scaler(case, device)} if job.scaler else {}
    seen: list = []
    step_fn = compiled.loop(step_fn, model)

    def before_step(opt, args, kwargs):
        if not seen:
            seen.append(snapshot([p.grad for p in params]))

    optimizer.register_step_pre_hook(before_step)
    for step in range(case.steps):
        set_step(step)  # named if the rank exceeds its memory cap
        batches = [
            batch_for(case, step, m, rank, device=device) for m in range(micro_batches(case, step))
        ]
        seen.clear()
        step_fn(model, optimizer, batches, **extra)
        # Never stepped: no gradients to compare; the parameters say what happened.
        steps.append(RankStep(snapshot(params), seen[0] if seen else None))
    return RankRecord(initial_params, initial_buffers, tuple(steps))
