"""Reference data-parallel training steps: the whole step a user writes around a model, checked as
the ``loop`` kind (``paracheck check paracheck.loop:train_step --kind loop``).

A step is ``train_step(model, optimizer, micro_batches)``. Every rank calls it with its own replica
of the model (equal on every rank when the step begins), an optimizer over the model's
parameters, and its micro-batches of the step: a list of ``(inputs, targets)``, where ``model(
inputs)`` returns logits of shape (batch, tokens, vocabulary) and ``targets`` holds a token index
per position, or ``IGNORE_INDEX`` for padding. The step accumulates the gradients of every
micro-batch, synchronises them across ranks, and calls ``optimizer.step()`` once; the list may be
shorter than usual (the last window of an epoch).

What it minimises is its declared loss semantics (Note [Loss semantics] in ``paracheck.cases``):

* ``train_step``: the global token mean, the cross-entropy summed over every valid token of
  every rank's micro-batches, divided by their number. The number is all-reduced before any
  backward, so each rank's backward is already its share and the gradients are summed;
* ``train_step_batch_mean`` (``paracheck_loss = "batch-mean"``): the mean over ranks and
  micro-batches of each micro-batch's mean, divided by the micro-batches this step has;
* ``train_step_fp16``: ``train_step`` under float16 autocast with a ``torch.amp.GradScaler``
  (``paracheck_autocast = "float16"`` and a ``scaler`` parameter: Note [A loop's own precision]
  in ``paracheck.check.targets``): losses scaled, gradients unscaled after the all-reduce, and the
  step skipped on every rank alike where a gradient is not finite (every rank unscales the same
  summed gradients).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from paracheck.cases import IGNORE_INDEX

__all__ = [
    "IGNORE_INDEX",
    "fp16_gradients",
    "train_step",
    "train_step_batch_mean",
    "train_step_fp16",
]


def _logits(model, inputs: torch.Tensor) -> torch.Tensor:
    out = model(inputs).flatten(0, 1)
    # bfloat16 logits are taken to float32 for the cross-entropy; float32 and float64 stay.
    return out if out.dtype in (torch.float32, torch.float64) else out.float()


def _all_reduce_gradients(model, divide_by: int = 1) -> None:
    """Sum every parameter's gradient over ranks (a parameter without one contributes zeros), in
    one flat buffer per dtype, and divide by ``divide_by``."""
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    for dtype in dict.fromkeys(p.dtype for p in params):
        group = [p for p in params if p.dtype == dtype]
        flat = torch.cat([p.grad.reshape(-1) for p in group])
        dist.all_reduce(flat)
        if divide_by != 1:
            flat.div_(divide_by)
        offset = 0
        for p in group:
            p.grad.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()


def global_tokens(model, micro_batches) -> int:
    """The valid tokens of this step's micro-batches on every rank (one all-reduce)."""
    device = next(model.parameters()).device
    local = sum(int((targets != IGNORE_INDEX).sum()) for _, targets in micro_batches)
    total = torch.tensor([local], dtype=torch.int64, device=device)
    dist.all_reduce(total)
    return int(total.item())


def train_step(model, optimizer, micro_batches) -> None:
    """One step minimising the global token mean of the cross-entropy."""
    optimizer.zero_grad(set_to_none=True)
    tokens = global_tokens(model, micro_batches)
    for inputs, targets in micro_batches:
        ce = F.cross_entropy(
            _logits(model, inputs), targets.flatten(), ignore_index=IGNORE_INDEX, reduction="sum"
        )
        (ce / tokens).backward()
    _all_reduce_gradients(model)
    optimizer.step()


def fp16_gradients(model, optimizer, micro_batches, scaler) -> None:
    """``train_step``'s gradients under float16 autocast: each micro-batch's loss scaled by
    ``scaler`` before backward, the scaled gradients summed over ranks (not yet unscaled)."""
    optimizer.zero_grad(set_to_none=True)
    tokens = global_tokens(model, micro_batches)
    device_type = next(model.parameters()).device.type
    for inputs, targets in micro_batches:
        with torch.autocast(device_type, dtype=torch.float16):
            logits = model(inputs)
        ce = F.cross_entropy(
            logits.flatten(0, 1).float(),
            targets.flatten(),
            ignore_index=IGNORE_INDEX,
            reduction="sum",
        )
        scaler.scale(ce / tokens).backward()
    _all_reduce_gradients(model)


def train_step_fp16(model, optimizer, micro_batches, scaler) -> None:
    """``train_step`` with float16 autocast and loss scaling: the scaled losses' gradients are
    summed over ranks, unscaled, and stepped by ``scaler`` (skipped on every rank where one is not
    finite)."""
    fp16_gradients(model, optimizer, micro_batches, scaler)
    scaler.unscale_(optimizer)  # before anything reads the gradients (a clip would go here)
    scaler.step(optimizer)
    scaler.update()


train_step_fp16.paracheck_autocast = "float16"  # type: ignore[attr-defined]


def train_step_batch_mean(model, optimizer, micro_batches) -> None:
    """One step minimising the mean over ranks and micro-batches of each micro-batch's mean."""
    optimizer.zero_grad(set_to_none=True)
    for inputs, targets in micro_batches:
        ce = F.cross_entropy(_logits(model, inputs), targets.flatten(), ignore_index=IGNORE_INDEX)
        (ce / len(micro_batches)).backward()
    _all_reduce_gradients(model, divide_by=dist.get_world_size())
    optimizer.step()


train_step_batch_mean.paracheck_loss = "batch-mean"  # type: ignore[attr-defined]
