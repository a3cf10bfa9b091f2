"""The ``reshard`` property's rank program for a fully sharded wrapper checkpointed through
``torch.distributed.checkpoint`` (Note [Resuming at another world size] in
``paracheck.check.properties.reshard``): a wrapper whose class declares
``paracheck_checkpoint = "torch.distributed.checkpoint"`` (torch's FSDP2 behind ``TorchFSDP``)
keeps DTensor shards, which DCP saves with their layout and reshards on load.

One program, two phases: ``"save"`` trains the steps ``0..k-1`` and saves the model and optimizer
state (``get_state_dict`` of the wrapped module and the optimizer, ``dcp.save`` into the real
directory ``RankJob.checkpoint_dir``); ``"load"``, in a world of another size, builds the
wrapper and the optimizer, adds the groups added so far, brings the scheduler to step k, loads
(``dcp.load`` into its own state dicts, then ``set_state_dict``) and trains the steps left. Each
step records what the ``fsdp`` kind's program records for the comparison: the parameters (read
whole, Note [Reading an FSDP]) and the gradients where ``full_gradients()`` reads them.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from paracheck.cases import (
    Case,
    add_late_groups,
    apply_lr_schedule,
    build_case_model,
    build_optimizer,
    build_scheduler,
    step_scheduler,
)
from paracheck.check.ranks._common import (
    on_every_rank,
    rank_device,
    snapshot,
    target_object,
    train_micro_steps,
)
from paracheck.check.ranks._drive import DDPDriver
from paracheck.check.ranks.fsdp import in_module_order
from paracheck.check.ranks.job import RankJob
from paracheck.check.ranks.record import RankRecord, RankStep
from paracheck.check.ranks.reshard import bring_to
from paracheck.world import set_step

__all__ = ["DCP", "run_dcp_phase"]

# What a wrapper's class declares (``paracheck_checkpoint``) to be checkpointed through DCP.
DCP = "torch.distributed.checkpoint"


def _checkpoint(wrapper, optimizer, directory: str, phase: str) -> None:
    """Save or load the wrapped module's and the optimizer's state through DCP (collectives)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import DefaultLoadPlanner
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_state_dict,
        set_state_dict,
    )

    module = getattr(wrapper, "module", wrapper)
    model_sd, optim_sd = get_state_dict(module, optimizer)
    state: dict[str, Any] = {"model": model_sd, "optim": optim_sd}
    if phase == "save":
        dcp.save(state, checkpoint_id=directory)
        return
    # torch's get_state_dict gives the fresh optimizer state for every parameter (it steps zero
    # gradients to build it), so a parameter no step had reached before the save (a branch no
    # rank uses) is in this template and not in the checkpoint: missing by design, not an error.
    # Nor is a parameter whose optimizer keeps no state for it (SGD without momentum): torch's
    # strict load raises "Missing optimizer state" for it. What the load restores is judged by
    # the trajectory after it, not by the keys (Note [Resuming at another world size]).
    dcp.load(state, checkpoint_id=directory, planner=DefaultLoadPlanner(allow_partial_load=True))
    set_state_dict(
        module,
        optimizer,
        model_state_dict=state["model"],
        optim_state_dict=state["optim"],
        options=StateDictOptions(strict=False),
    )


def run_dcp_phase(job: RankJob) -> RankRecord:
    """Train ``job.case``'s steps ``job.start..job.stop-1`` (``stop`` None: through its last step)
    with the wrapper at ``job.path``: after them save (``phase="save"``, from step 0), or load
    before them (``phase="load"``) from ``job.checkpoint_dir``."""
    case: Case = job.case
    phase, start = job.phase, job.start
    stop = case.steps if job.stop is None else job.stop
    if phase not in ("save", "load"):
        raise ValueError(f"phase={phase!r} must be 'save' or 'load'")
    job.require("checkpoint_dir")
    if case.masters_from_float32:
        return RankRecord.skip(
            "a compute dtype is not resumed: the wrapper is built over the case's own dtype"
        )
    rank = dist.get_rank()
    device = rank_device(job.device)
    cls = target_object(job.path)
    model = build_case_model(case, rank, device=device)
    names = [n for n, _ in model.named_parameters()]
    trainable = [p.requires_grad for p in model.parameters()]
    wrapper = on_every_rank(lambda: cls(model), device, "constructing the wrapper")
    params = list(wrapper.parameters())
    if len(params) != len(names):
        return RankRecord.skip(
            f"the wrapper's parameters() gives {len(params)} tensors for the module's "
            f"{len(names)}: parameter groups by index cannot be built"
        )
    optimizer = build_optimizer(case, params)
    scheduler = build_scheduler(case, optimizer)
    if phase == "load":
        bring_to(case, optimizer, params, scheduler, start)
        on_every_rank(
            lambda: _checkpoint(wrapper, optimizer, job.checkpoint_dir, phase),
            device,
            "loading the checkpoint (torch.distributed.checkpoint)",
        )
    full_gradients = getattr(wrapper, "full_gradients", None)

    def whole(got, what, mask=None):
        return snapshot(in_module_order(got, names, what, mask))

    initial = whole(wrapper.gather_full_params(), "gather_full_params()")
    steps, drv = [], DDPDriver.of(wrapper)
    for step in range(start, stop):
        set_step(step)
        add_late_groups(case, optimizer, params, step)
        optimizer.zero_grad(set_to_none=case.set_to_none)
        train_micro_steps(case, drv, optimizer, rank, device, step)
        grads = None
        if full_gradients is not None:
            grads = whole(full_gradients(), "full_gradients()", trainable)
        optimizer.step()
        apply_lr_schedule(case, optimizer)
        step_scheduler(scheduler)
        steps.append(RankStep(whole(wrapper.gather_full_params(), "gather_full_params()"), grads))
    if phase == "save":
        on_every_rank(
            lambda: _checkpoint(wrapper, optimizer, job.checkpoint_dir, phase),
            device,
            "saving the checkpoint (torch.distributed.checkpoint)",
        )
    return RankRecord(initial, snapshot(model.buffers()), tuple(steps))
