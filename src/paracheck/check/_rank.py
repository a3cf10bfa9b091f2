"""What each rank runs for one case (called by ``paracheck.world``). Returns plain tensors."""

from __future__ import annotations

import torch
import torch.distributed as dist

from paracheck.cases import (
    Case,
    add_late_groups,
    apply_lr_schedule,
    batch_for,
    build_case_model,
    build_optimizer,
    build_scheduler,
    loss_fn,
)
from paracheck.check._drive import DDPDriver, ddp_driver
from paracheck.check.targets import load_object

_CLASS_CACHE: dict[str, object] = {}


def _cls(path: str):
    if path not in _CLASS_CACHE:
        _CLASS_CACHE[path] = load_object(path)
    return _CLASS_CACHE[path]


def _device(case_device: str | None):
    if case_device:
        return torch.device(case_device)
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def _snapshot(ts) -> list:
    return [None if t is None else t.detach().to("cpu", copy=True) for t in ts]


def train_micro_steps(case: Case, drv: DDPDriver, optimizer, rank: int, device, step: int) -> None:
    """One step's forward and backward passes and their synchronisation, by the case's protocol."""
    for micro in range(case.accumulation):
        skip = case.no_sync and drv.no_sync is not None and micro < case.accumulation - 1
        with drv.sync_context(skip):
            x, y = batch_for(case, step, micro, rank, device=device)
            loss = loss_fn(case, drv.forward(x), y)
            loss.backward()
        if not skip:
            # CS336 protocol: synchronise before anything reads .grad. Accumulating without
            # no_sync() therefore synchronises after every backward (as torch DDP does).
            drv.finish(optimizer)


def run_ddp(payload: dict) -> dict:
    """Train ``case`` with the DDP wrapper at ``payload['path']``; record every step."""
    case: Case = payload["case"]
    rank = dist.get_rank()
    device = _device(payload.get("device"))
    model = build_case_model(case, rank, device=device)
    drv = ddp_driver(payload, model, case, _cls(payload["path"]))
    params = list(model.parameters())
    record = {"initial_params": _snapshot(params), "initial_buffers": _snapshot(model.buffers()), "steps": []}
    optimizer = build_optimizer(case, params)
    scheduler = build_scheduler(case, optimizer)
    for step in range(case.steps):
        add_late_groups(case, optimizer, params, step)
        optimizer.zero_grad(set_to_none=case.set_to_none)
        if drv.batch_start is not None:
            drv.batch_start(optimizer)
        train_micro_steps(case, drv, optimizer, rank, device, step)
        grads = _snapshot([p.grad for p in params])
        optimizer.step()
        apply_lr_schedule(case, optimizer)
        if scheduler is not None:
            scheduler.step()
        record["steps"].append({"grads": grads, "params": _snapshot(params)})
    return record
