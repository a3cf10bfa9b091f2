"""Helpers every rank program uses: the target's object, the rank's device, CPU snapshots, one
step's forward/backward/synchronisation (``train_micro_steps``) and ``on_every_rank``."""

from __future__ import annotations

import torch
import torch.distributed as dist

from paracheck.accounting.traffic import record_collectives
from paracheck.cases import Case, batch_for, forward_context, loss_fn, params_in_groups
from paracheck.check.loading import load_object
from paracheck.check.ranks._drive import DDPDriver
from paracheck.check.ranks.record import Window
from paracheck.world import PeerFailed

__all__ = [
    "CLIP_SKIPPED",
    "LOSS_SCALE_SKIPPED",
    "clip_gradients",
    "declared_unsupported",
    "on_every_rank",
    "rank_device",
    "snapshot",
    "step_optimizer",
    "target_object",
    "train_micro_steps",
    "unscale",
]

_CLASS_CACHE: dict[str, object] = {}


def target_object(path: str):
    if path not in _CLASS_CACHE:
        _CLASS_CACHE[path] = load_object(path)
    return _CLASS_CACHE[path]


def declared_unsupported(cls, case: Case, path: str) -> str | None:
    """Why ``case`` is skipped for the target ``cls`` at ``path``, or None: the first feature of
    the case that the class declares unsupported (``unsupported_case_features``: the name of a
    field of the case or of its model -> why), present where that field is set (True, or a model
    field's value other than None: ``float32_layer`` 0 is a layer)."""
    declared = getattr(cls, "unsupported_case_features", None) or {}
    for field, why in declared.items():
        value = getattr(case, field, getattr(case.model, field, None))
        if value is not None and value is not False:
            return f"{path} declares {field}={value!r} unsupported: {why}"
    return None


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
    scaler=None,
) -> None:
    """One step's forward and backward passes and their synchronisation, by the case's protocol
    (see ``Case``): finish after every backward, ``no_sync()`` for all but the last, or
    ``finish_once`` after the last; each loss backpropagated twice with ``double_backward``. Every
    forward runs in ``forward_context`` (autocast), and with ``scaler`` every loss is scaled.

    With ``windows`` (a list), appends a ``Window`` per synchronisation window (from its first
    forward to its ``finish``): the collectives recorded in it as (name, payload bytes), the number
    of synchronised backward passes in it, those of its calls made inside ``no_sync()``, and
    whether every parameter of ``trainable`` has a gradient after the finish
    (``paracheck.check.properties.bucket_structure``).
    """
    last = case.accumulation - 1
    per_micro = 2 if case.double_backward else 1
    recorder, synced = None, 0
    unsynced: list = []
    in_passes: list = []
    for micro in range(case.accumulation):
        skip = case.no_sync and drv.no_sync is not None and micro < last
        if windows is not None and recorder is None:
            # Gradient windows hold the messages that can carry gradients: a max/min/bitwise
            # reduction is an agreement between the ranks (a flag), never an average.
            recording = record_collectives(control=False)
            recorder = recording.__enter__()
        before = len(recorder.calls) if recorder is not None else 0
        with drv.sync_context(skip):
            x, y = batch_for(case, step, micro, rank, device=device)
            with forward_context(case, device):
                out = drv.forward(x)
            loss = loss_fn(case, out, y)
            if scaler is not None:
                loss = scaler.scale(loss)
            if case.double_backward:
                loss.backward(retain_graph=True)
            loss.backward()
        synced += 0 if skip else per_micro
        if recorder is not None:
            (unsynced if skip else in_passes).extend(recorder.calls[before:])
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
                        tuple(recorder.typed_calls),
                        tuple(unsynced),
                        tuple(in_passes),
                    )
                )
                recorder, synced, unsynced, in_passes = None, 0, [], []
    if recorder is not None:  # a target without no_sync() still ends every window with finish
        recording.__exit__(None, None, None)


def clip_gradients(case: Case, target, params: list, step: int, device, *, own_only: bool) -> bool:
    """Clip the step's synchronised gradients to ``case.clip_norm`` (Note [Clipping the global
    norm]); False where the case cannot be run on this target (``own_only`` and no method).

    Note [Clipping the global norm]
        The oracle clips the synchronised gradients of the parameters the optimizer holds at that
        step to ``clip_norm`` as ``torch.nn.utils.clip_grad_norm_`` over all of them does in one
        process. The rank program calls the target's own ``clip_grad_norm_(max_norm)`` where it
        has one (a sharded optimizer or a ZeRO wrapper, which must see the norm of every shard,
        not its own: the classic bug). Otherwise it calls ``torch.nn.utils.clip_grad_norm_``
        itself over the same parameters: every rank holds every synchronised gradient after a
        DDP, so that is the global norm on each, and a DDP target is checked for leaving the
        same gradients on every rank before the clip reads them. A ZeRO target without the
        method (``own_only``: its full gradients exist on no rank) skips the case with a note.
    """
    if case.clip_norm is None:
        return True
    method = getattr(target, "clip_grad_norm_", None)
    if method is not None and callable(method):
        on_every_rank(lambda: method(case.clip_norm), device, "clip_grad_norm_()")
        return True
    if own_only:
        return False
    held = [p for p in params_in_groups(case, params, step) if p.grad is not None]
    if held:
        torch.nn.utils.clip_grad_norm_(held, case.clip_norm)
    return True


def unscale(scaler, optimizer) -> None:
    """Divide the synchronised gradients by the loss scale (``scaler.unscale_``), before anything
    reads them: clipping, the snapshot, the step."""
    if scaler is not None and has_gradients(optimizer):
        scaler.unscale_(optimizer)


def has_gradients(optimizer) -> bool:
    """Whether a parameter of ``optimizer.param_groups`` holds a gradient: ``GradScaler.step`` and
    ``update`` raise where none does ("No inf checks were recorded")."""
    return any(p.grad is not None for g in optimizer.param_groups for p in g["params"])


def step_optimizer(scaler, optimizer) -> None:
    """``optimizer.step()``, or with a scaler ``scaler.step(optimizer)`` (skipped where a gradient
    is not finite) and ``scaler.update()``; without any gradient in the optimizer's groups,
    ``optimizer.step()`` and no update (the oracle does the same)."""
    if scaler is None or not has_gradients(optimizer):
        optimizer.step()
    else:
        scaler.step(optimizer)
        scaler.update()


LOSS_SCALE_SKIPPED = (
    "loss scaling is not checked: torch.amp.GradScaler decides to skip a step from the gradients "
    "each rank holds, and a ZeRO wrapper's gradients are sharded (no rank holds them all)"
)

CLIP_SKIPPED = (
    "clipping the global norm is not checked: the target has no clip_grad_norm_(max_norm), and "
    "its gradients are sharded (no rank holds them all)"
)


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
