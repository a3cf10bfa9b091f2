"""Helpers every rank program uses: the target's object, the rank's device, CPU snapshots, one
step's forward/backward/synchronisation (``train_micro_steps``) and ``on_every_rank``."""

from __future__ import annotations

import torch
import torch.distributed as dist

from paracheck.accounting.traffic import record_collectives
from paracheck.cases import Case, batch_for, loss_fn
from paracheck.check.ranks._drive import DDPDriver
from paracheck.check.ranks.record import Window
from paracheck.check.targets import load_object
from paracheck.world import PeerFailed

__all__ = ["on_every_rank", "rank_device", "snapshot", "target_object", "train_micro_steps"]

_CLASS_CACHE: dict[str, object] = {}


def target_object(path: str):
    if path not in _CLASS_CACHE:
        _CLASS_CACHE[path] = load_object(path)
    return _CLASS_CACHE[path]


def rank_device(case_device: str | None):
    if case_device:
        return torch.device(case_device)
    return (
        torch.device("cuda", torch.cuda.current_device())
        if dist.get_backend() == "nccl"
        else torch.device("cpu")
    )


def snapshot(ts) -> list:
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

    With ``windows`` (a list), appends a ``Window`` per synchronisation window (from its first
    forward to its ``finish``): the collectives recorded in it as (name, payload bytes), the number
    of synchronised backward passes in it, and whether every parameter of ``trainable`` has a
    gradient after the finish (``paracheck.check.properties.bucket_structure``).
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
                    Window(
                        tuple(recorder.calls),
                        synced,
                        all(p.grad is not None for p in trainable),
                    )
                )
                recorder, synced = None, 0
    if recorder is not None:  # a target without no_sync() still ends every window with finish
        recording.__exit__(None, None, None)


def on_every_rank(fn, device, what: str):
    """``fn()``, raising on every rank when it raises on any (the rank's own error where it has
    one). The harness's per-rank reading of a target's state_dict can fail on some ranks only (a
    consolidation bug leaves a rank without state it should see); the other ranks would go on to
    the next collective and wait there until the process-group timeout, so such a bug cost a
    timeout per example and per shrink step instead of failing at once. The same holds for a
    constructor that raises on some ranks only (a rank that owns no parameter)."""
    try:
        result, failure = fn(), None
    except Exception as e:  # re-raised below, on every rank
        result, failure = None, e
    flag = torch.tensor([0 if failure is None else 1], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    if failure is not None:
        raise failure
    if flag.item():
        raise PeerFailed(f"{what} raised on another rank (that rank reports the error)")
    return result
