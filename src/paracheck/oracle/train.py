"""Reference data-parallel training in one process.

Semantics (the contract every target must meet, see ``paracheck.cases.Case``):

* every rank starts from rank 0's initial model (a target must broadcast it);
* rank r computes ``g_r = sum_m grad(mean loss of batch (step, m, r))``, exactly as its own
  backward passes would, one rank at a time in this process;
* the synchronised gradient is ``(g_0 + ... + g_{W-1}) / W``, a rank without a gradient
  contributing zeros; a parameter that no rank used keeps the gradient it had (None after
  ``zero_grad(set_to_none=True)``, zeros otherwise), so the optimizer treats it exactly as in
  single-process training;
* the optimizer (the case's torch optimizer, with its groups, late ``add_param_group`` calls and
  lr schedule) then steps once.

Besides parameters, gradients and optimizer state after every step, the trajectory keeps, per
gradient element, ``sum_r |g_r|`` (``grad_absum``): the scale that bounds any reordering of the
rank sum, from which ``paracheck.check.tolerance`` derives its tolerances.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from paracheck.cases import (
    Case,
    add_late_groups,
    apply_lr_schedule,
    batch_for,
    build_case_model,
    build_optimizer,
    loss_fn,
)

__all__ = ["StepRecord", "Trajectory", "train"]


@dataclass
class StepRecord:
    losses: list[list[float]]  # [rank][micro]
    grads: list[torch.Tensor | None]  # synchronised gradients, before the step
    grad_absum: list[torch.Tensor | None]  # sum over ranks and micro-steps of |local grad|
    params: list[torch.Tensor]  # after the step
    state: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)  # optimizer state after step


@dataclass
class Trajectory:
    case: Case
    initial_params: list[torch.Tensor]
    initial_buffers: list[torch.Tensor]
    steps: list[StepRecord]


def optimizer_state(optimizer, params: list) -> dict[int, dict[str, torch.Tensor]]:
    """The optimizer's per-parameter state keyed by index into ``params`` (tensors cloned)."""
    index = {id(p): i for i, p in enumerate(params)}
    out = {}
    for p, st in optimizer.state.items():
        if id(p) in index:
            out[index[id(p)]] = {
                k: (v.detach().clone() if torch.is_tensor(v) else torch.tensor(float(v)))
                for k, v in st.items()
            }
    return out


def _local_grads(case: Case, model, params, step: int, rank: int):
    for p in params:
        p.grad = None
    losses = []
    for micro in range(case.accumulation):
        x, y = batch_for(case, step, micro, rank)
        loss = loss_fn(case, model(x), y)
        loss.backward()
        losses.append(loss.item())
    grads = [None if p.grad is None else p.grad.detach().clone() for p in params]
    return grads, losses


def train(case: Case) -> Trajectory:
    """Train ``case`` in this process and return the whole trajectory (see module docstring)."""
    model = build_case_model(case, rank=0)
    params = list(model.parameters())
    initial = [p.detach().clone() for p in params]
    buffers = [b.detach().clone() for b in model.buffers()]
    optimizer = build_optimizer(case, params)
    W = case.world_size
    # The gradient each parameter holds between steps: None, or zeros after zero_grad(False).
    held: list[torch.Tensor | None] = [None] * len(params)
    records = []
    for step in range(case.steps):
        add_late_groups(case, optimizer, params, step)
        per_rank = []
        losses = []
        for rank in range(W):
            grads, ls = _local_grads(case, model, params, step, rank)
            per_rank.append(grads)
            losses.append(ls)
        synced, absum = [], []
        for i, p in enumerate(params):
            local = [g[i] for g in per_rank]
            if all(g is None for g in local):
                synced.append(held[i])
                absum.append(None if held[i] is None else torch.zeros_like(p))
                continue
            total = torch.zeros_like(p)
            mag = torch.zeros_like(p)
            for g in local:
                if g is not None:
                    total += g
                    mag += g.abs()
            total /= W
            if held[i] is not None:
                total += held[i]
            synced.append(total)
            absum.append(mag)
        for p, g in zip(params, synced):
            p.grad = None if g is None else g.clone()
        optimizer.step()
        apply_lr_schedule(case, optimizer)
        records.append(
            StepRecord(
                losses=losses,
                grads=[None if g is None else g.clone() for g in synced],
                grad_absum=absum,
                params=[p.detach().clone() for p in params],
                state=optimizer_state(optimizer, params),
            )
        )
        held = [None if (case.set_to_none or g is None) else torch.zeros_like(g) for g in synced]
        for p in params:
            p.grad = None
    return Trajectory(case=case, initial_params=initial, initial_buffers=buffers, steps=records)
