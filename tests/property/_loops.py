"""Correct training steps written another way than paracheck.loop's, checked as users' loops."""

import torch
import torch.distributed as dist
import torch.nn.functional as F

IGNORE = -100


def clipped_step(model, optimizer, micro_batches):
    """Global token mean, gradients all-reduced one parameter at a time, then clipped to a global
    norm of 0.01 (after the all-reduce: every rank sees the same norm)."""
    optimizer.zero_grad()
    count = torch.tensor(float(sum(int((y != IGNORE).sum()) for _, y in micro_batches)))
    dist.all_reduce(count)
    for x, y in micro_batches:
        logits = model(x)
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum") / count
        loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.01)
    optimizer.step()


clipped_step.paracheck_clip_norm = 0.01


class BatchMeanStep:
    """A class whose instances are the step: the mean of micro-batch means, the loss scaled by the
    world size so that an all-reduce SUM averages."""

    paracheck_loss = "batch-mean"

    def __call__(self, model, optimizer, micro_batches):
        for p in model.parameters():
            p.grad = None
        w = dist.get_world_size()
        for x, y in micro_batches:
            loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten(), ignore_index=IGNORE)
            (loss / (len(micro_batches) * w)).backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        optimizer.step()


def fp16_clipped_step(model, optimizer, micro_batches, scaler):
    """Global token mean under float16 autocast with a GradScaler: gradients all-reduced one
    parameter at a time, unscaled, clipped to a global norm of 0.01 and stepped by the scaler."""
    optimizer.zero_grad()
    device = next(model.parameters()).device
    count = torch.tensor(
        float(sum(int((y != IGNORE).sum()) for _, y in micro_batches)), device=device
    )
    dist.all_reduce(count)
    for x, y in micro_batches:
        with torch.autocast(device.type, dtype=torch.float16):
            logits = model(x)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten(), reduction="sum") / count
        scaler.scale(loss).backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.01)
    scaler.step(optimizer)
    scaler.update()


fp16_clipped_step.paracheck_autocast = "float16"
fp16_clipped_step.paracheck_clip_norm = 0.01
