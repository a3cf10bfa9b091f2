"""What each rank runs for one case (called by ``paracheck.world``). Returns plain tensors."""

from __future__ import annotations

import torch
import torch.distributed as dist

from paracheck.accounting.traffic import record_collectives
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
    return (
        torch.device("cuda", torch.cuda.current_device())
        if dist.get_backend() == "nccl"
        else torch.device("cpu")
    )


def _snapshot(ts) -> list:
    return [None if t is None else t.detach().to("cpu", copy=True) for t in ts]


def train_micro_steps(
    case: Case,
    drv: DDPDriver,
    optimizer,
    rank: int,
    device,
    step: int,
    windows: list | None = None,
    trainable=(),
) -> None:
    """One step's forward and backward passes and their synchronisation, by the case's protocol
    (see ``Case``): finish after every backward, ``no_sync()`` for all but the last, or
    ``finish_once`` after the last; each loss backpropagated twice with ``double_backward``.

    With ``windows`` (a list), appends per synchronisation window (from its first forward to its
    ``finish``) the collectives recorded in it, ``calls`` as (name, payload bytes), and
    ``backwards``, the number of synchronised backward passes in it, and ``all_present``, whether
    every parameter of ``trainable`` has a gradient after the finish
    (``paracheck.check.bucket_structure``).
    """
    last = case.accumulation - 1
    per_micro = 2 if case.double_backward else 1
    recorder, synced = None, 0
    for micro in range(case.accumulation):
        skip = case.no_sync and drv.no_sync is not None and micro < last
        if windows is not None and recorder is None:
            recording = record_collectives()
            recorder = recording.__enter__()
        with drv.sync_context(skip):
            x, y = batch_for(case, step, micro, rank, device=device)
            loss = loss_fn(case, drv.forward(x), y)
            if case.double_backward:
                loss.backward(retain_graph=True)
            loss.backward()
        synced += 0 if skip else per_micro
        if not skip and (not case.finish_once or micro == last):
            # CS336 protocol: synchronise before anything reads .grad. Accumulating without
            # no_sync() synchronises after every backward (as torch DDP does), or, with
            # finish_once, once after the last: the usual loop, where a DDP meets several
            # synchronised backward passes in one synchronisation window.
            drv.finish(optimizer)
            if recorder is not None:
                recording.__exit__(None, None, None)
                windows.append(
                    {
                        "calls": list(recorder.calls),
                        "backwards": synced,
                        "all_present": all(p.grad is not None for p in trainable),
                    }
                )
                recorder, synced = None, 0
    if recorder is not None:  # a target without no_sync() still ends every window with finish
        recording.__exit__(None, None, None)


def run_ddp(payload: dict) -> dict:
    """Train ``case`` with the DDP wrapper at ``payload['path']``; record every step.

    Returns ``{"skipped": why}`` instead, on every rank alike, where the case uses a feature the
    target's class declares unsupported (``unsupported_case_features``: feature name -> why, e.g.
    ``{"double_backward": "..."}``), or where the case passes ``bucket_size_mb=None`` and the
    constructor refuses it with a TypeError or ValueError.
    """
    case: Case = payload["case"]
    rank = dist.get_rank()
    device = _device(payload.get("device"))
    cls = _cls(payload["path"])
    unsupported = [
        f for f in getattr(cls, "unsupported_case_features", {}) if getattr(case, f, False)
    ]
    if unsupported:
        return {
            "skipped": f"{payload['path']} declares {unsupported[0]}=True unsupported: "
            f"{cls.unsupported_case_features[unsupported[0]]}"
        }
    model = build_case_model(case, rank, device=device)
    try:
        drv = ddp_driver(payload, model, case, cls)
    except (TypeError, ValueError) as exc:
        if not (case.unbounded_bucket and payload.get("takes_bucket")):
            raise
        # bucket_size_mb=None is a reading of the interface a correct DDP may refuse: not a failure.
        return {
            "skipped": f"the constructor refuses bucket_size_mb=None ({type(exc).__name__}: {exc})"
        }
    params = list(model.parameters())
    record = {
        "initial_params": _snapshot(params),
        "initial_buffers": _snapshot(model.buffers()),
        "steps": [],
    }
    optimizer = build_optimizer(case, params)
    scheduler = build_scheduler(case, optimizer)
    for step in range(case.steps):
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
        )
        grads = _snapshot([p.grad for p in params])
        optimizer.step()
        apply_lr_schedule(case, optimizer)
        if scheduler is not None:
            scheduler.step()
        record["steps"].append({"grads": grads, "params": _snapshot(params), "windows": windows})
    return record
