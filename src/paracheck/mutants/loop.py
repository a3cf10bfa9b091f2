"""Broken training steps (the ``loop`` kind): each is ``paracheck.loop``'s reference with one bug
of the kind users report in gradient accumulation and loss normalisation."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from paracheck.cases import IGNORE_INDEX
from paracheck.loop import _all_reduce_gradients, _logits, fp16_gradients

__all__ = [
    "averaged_twice",
    "decay_applied_twice",
    "last_micro_batch_only",
    "local_norm_clipped",
    "local_token_count",
    "micro_batch_normalised",
    "partial_window_not_rescaled",
    "unscale_skipped_on_one_rank",
]


def _ce(model, inputs, targets, reduction: str = "mean") -> torch.Tensor:
    return F.cross_entropy(
        _logits(model, inputs), targets.flatten(), ignore_index=IGNORE_INDEX, reduction=reduction
    )


def _global_tokens(model, micro_batches) -> int:
    """The valid tokens of the step on every rank (the reference's count)."""
    device = next(model.parameters()).device
    total = torch.tensor(
        [sum(int((t != IGNORE_INDEX).sum()) for _, t in micro_batches)], device=device
    )
    dist.all_reduce(total)
    return int(total.item())


def micro_batch_normalised(model, optimizer, micro_batches) -> None:
    """Declares the global token mean, but each micro-batch's loss is its own token mean and the
    micro-batches are averaged: micro-batches with fewer valid tokens weigh more."""
    optimizer.zero_grad(set_to_none=True)
    for inputs, targets in micro_batches:
        (_ce(model, inputs, targets) / len(micro_batches)).backward()  # BUG: per-micro-batch mean
    _all_reduce_gradients(model, divide_by=dist.get_world_size())
    optimizer.step()


def local_token_count(model, optimizer, micro_batches) -> None:
    """Declares the global token mean, but normalises by this rank's valid tokens and averages the
    ranks: ranks with fewer valid tokens weigh more."""
    optimizer.zero_grad(set_to_none=True)
    tokens = sum(int((t != IGNORE_INDEX).sum()) for _, t in micro_batches)  # BUG: not all-reduced
    for inputs, targets in micro_batches:
        (_ce(model, inputs, targets, "sum") / max(tokens, 1)).backward()
    _all_reduce_gradients(model, divide_by=dist.get_world_size())
    optimizer.step()


def averaged_twice(model, optimizer, micro_batches) -> None:
    """Normalises by the global token count, then averages the gradients over ranks as well: the
    gradient is W times too small."""
    optimizer.zero_grad(set_to_none=True)
    total = _global_tokens(model, micro_batches)
    for inputs, targets in micro_batches:
        (_ce(model, inputs, targets, "sum") / total).backward()
    _all_reduce_gradients(model, divide_by=dist.get_world_size())  # BUG: already a global mean
    optimizer.step()


def last_micro_batch_only(model, optimizer, micro_batches) -> None:
    """Clears the gradients before every micro-batch, not once per step: only the last
    micro-batch's gradient is kept (an accumulation engine that overwrites instead of adding)."""
    total = _global_tokens(model, micro_batches)
    for inputs, targets in micro_batches:
        optimizer.zero_grad(set_to_none=True)  # BUG: inside the accumulation loop
        (_ce(model, inputs, targets, "sum") / total).backward()
    _all_reduce_gradients(model)
    optimizer.step()


def partial_window_not_rescaled(model, optimizer, micro_batches) -> None:
    """Declares the mean of the micro-batches' means, but divides by the accumulation it was
    configured with (the first window's length), not by the micro-batches this step has: a partial
    last window's gradient is too small."""
    optimizer.zero_grad(set_to_none=True)
    # Configured once per training run, from its first step.
    accumulation = optimizer.__dict__.setdefault("_accumulation", len(micro_batches))
    for inputs, targets in micro_batches:
        (_ce(model, inputs, targets) / accumulation).backward()  # BUG: not len(micro_batches)
    _all_reduce_gradients(model, divide_by=dist.get_world_size())
    optimizer.step()


partial_window_not_rescaled.paracheck_loss = "batch-mean"  # type: ignore[attr-defined]


def local_norm_clipped(model, optimizer, micro_batches) -> None:
    """Clips to a global norm of 0.01, but computes the norm of this rank's gradients before they
    are synchronised: each rank scales by its own coefficient."""
    optimizer.zero_grad(set_to_none=True)
    total = _global_tokens(model, micro_batches)
    for inputs, targets in micro_batches:
        (_ce(model, inputs, targets, "sum") / total).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.01)  # BUG: before the all-reduce
    _all_reduce_gradients(model)
    optimizer.step()


local_norm_clipped.paracheck_clip_norm = 0.01  # type: ignore[attr-defined]


def decay_applied_twice(model, optimizer, micro_batches) -> None:
    """The reference step with decoupled weight decay applied by hand, p *= 1 - lr * weight_decay,
    to every parameter with a gradient, before ``optimizer.step()``, whose groups carry the same
    weight decay: twice the decay a step (1e-4 relative at AdamW's lr 1e-3 and decay 0.1). The
    gradients are right; only the step is wrong (Note [Comparing an update])."""
    optimizer.zero_grad(set_to_none=True)
    total = _global_tokens(model, micro_batches)
    for inputs, targets in micro_batches:
        (_ce(model, inputs, targets, "sum") / total).backward()
    _all_reduce_gradients(model)
    with torch.no_grad():
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:  # BUG: the optimizer applies its weight decay too
                    p.mul_(1 - group["lr"] * group["weight_decay"])
    optimizer.step()


def unscale_skipped_on_one_rank(model, optimizer, micro_batches, scaler) -> None:
    """float16 autocast with a GradScaler, clipping the global norm to 0.01, but the last rank
    never calls ``scaler.unscale_`` before clipping: it clips the scaled gradients (a norm the
    loss scale times too large), and ``scaler.step`` unscales them afterwards."""
    fp16_gradients(model, optimizer, micro_batches, scaler)
    if dist.get_rank() != dist.get_world_size() - 1:  # BUG: every rank must unscale
        scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.01)
    scaler.step(optimizer)
    scaler.update()


unscale_skipped_on_one_rank.paracheck_autocast = "float16"  # type: ignore[attr-defined]
unscale_skipped_on_one_rank.paracheck_clip_norm = 0.01  # type: ignore[attr-defined]
