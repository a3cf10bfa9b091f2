"""The reload rank program: load a consolidated state dict, saved at any world size, into a
fresh ``sharded`` or ``zero`` target and step once (Note [State dict conventions])."""

from __future__ import annotations

import torch
import torch.distributed as dist

from paracheck.cases import Case, add_late_groups, build_case_model, build_optimizer
from paracheck.check.kinds import GRADIENTS, KINDS, OPTIMIZER
from paracheck.check.ranks._common import on_every_rank, rank_device, snapshot, target_object
from paracheck.check.ranks._optimizer import build_zero, state_by_param, state_dict_of
from paracheck.check.ranks.job import RankJob
from paracheck.check.ranks.record import ReloadRecord

__all__ = ["run_reload"]


def run_reload(job: RankJob) -> ReloadRecord:
    """Load ``job.state_dict`` (consolidated, saved at any world size) into a fresh target
    whose parameters are ``job.params``, with every group of ``job.case``; record the
    consolidated state, then step once with the deterministic gradient ``job.grads``
    (identical on all ranks) and record parameters and state again. A per-rank-shards state dict
    cannot be loaded at another world size (Note [State dict conventions])."""
    job.require("params", "state_dict", "grads")
    case: Case = job.case
    rank = dist.get_rank()
    device = rank_device(job.device)
    model = build_case_model(case, rank, device=device)
    with torch.no_grad():
        for p, v in zip(model.parameters(), job.params):
            p.copy_(v)
    cls = target_object(job.path)
    # A wrapper that owns the gradients and the optimizer wraps the module and synchronises the
    # gradients itself (ZeRO); a sharded optimizer takes the parameters, its gradients given
    # synchronised.
    syncs = {GRADIENTS, OPTIMIZER} <= KINDS[job.kind].owns
    if syncs:
        params, opt = build_zero(case, model, cls)
        owner = opt.optimizer
    else:
        params = list(model.parameters())
        opt = build_optimizer(case, params, optimizer_cls=cls)
        owner = opt
    for step in range(case.steps):
        add_late_groups(case, opt, params, step)
    index = {id(p): i for i, p in enumerate(params)}

    def load():
        opt.load_state_dict(job.state_dict)
        return state_by_param(state_dict_of(opt), owner, index)[0]

    loaded = on_every_rank(load, device, "load_state_dict")
    opt.zero_grad(set_to_none=True)
    if syncs:
        # The gradient goes through the ZeRO wrapper's own synchronisation (identical on all ranks,
        # so the average is the gradient itself).
        for p, g in zip(params, job.grads):
            if g is not None and p.requires_grad:
                p.grad = g.to(device).clone()
        opt.finish_gradient_synchronization()
    else:
        for p, g in zip(params, job.grads):
            p.grad = None if g is None else g.to(device).clone()
    opt.step()
    return ReloadRecord(
        loaded, snapshot(params), state_by_param(state_dict_of(opt), owner, index)[0]
    )
