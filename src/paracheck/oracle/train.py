"""Reference data-parallel training in one process.

Semantics (the contract every target must meet, see ``paracheck.cases.Case``):

* every rank starts from rank 0's initial model (a target must broadcast it);
* rank r computes ``g_r = sum_m grad(mean loss of batch (step, m, r))``, exactly as its own
  backward passes would, one rank at a time in this process (under ``case.loss``, the loss of a
  micro-batch is ``step_loss``'s share, and token-mean sums the g_r instead of averaging them:
  Note [Loss semantics]);
* the synchronised gradient is ``h + (g_0 + ... + g_{W-1}) / W``, a rank without a gradient
  contributing zeros, where ``h`` is the gradient the parameter held when the step began; a
  parameter that no rank used keeps ``h``, so the optimizer treats it exactly as in
  single-process training;
* ``h`` is what ``optimizer.zero_grad()`` leaves: None after ``zero_grad(set_to_none=True)``,
  zeros otherwise, for a parameter in one of the optimizer's groups; a parameter in none (its
  group is added later) keeps the synchronised gradient of the previous step, so it accumulates
  until its group is added, as in real training (``Case.zero_grad_module``: every parameter is
  cleared); a parameter that holds those zeros and that no rank's backward reached is stepped
  with them or, in the other reading a target may take, skipped as if its gradient were None
  (``skip_unreached``: Note [A parameter no rank reached]);
* with ``case.loss_scale``, each rank's loss is scaled by the ``GradScaler``'s scale before its
  backward, and the synchronised gradients of the optimizer's parameters are unscaled
  (``scaler.unscale_(optimizer)``) before anything reads them; ``scaler.step`` skips the step
  where one is not finite (``StepRecord.skipped``);
* every forward runs in ``forward_context(case)`` (autocast, Note [Precision of a case]);
* with ``case.clip_norm``, the synchronised gradients of the parameters in the optimizer's groups
  are clipped to that global norm (``clip_global_norm``);
* the optimizer (the case's torch optimizer, with its groups, late ``add_param_group`` calls,
  lr schedule and LR scheduler) then steps once: the parameters, or with
  ``case.master_weights`` their float32 masters, each parameter then being its master rounded
  (Note [Master weights] in ``paracheck.cases``).

Besides parameters, gradients and optimizer state after every step, the trajectory keeps, per
gradient element, ``sum_r |g_r|`` (``grad_absum``): the scale that bounds any reordering of the
rank sum, from which ``paracheck.oracle.tolerance`` derives its tolerances.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch

from paracheck.cases import (
    Case,
    add_late_groups,
    apply_lr_schedule,
    batch_for,
    build_case_model,
    build_grad_scaler,
    build_optimizer,
    build_scheduler,
    forward_context,
    micro_batches,
    params_in_groups,
    step_loss,
    step_scheduler,
)

__all__ = ["StepRecord", "Trajectory", "clip_global_norm", "train"]

# Note [A parameter no rank reached]
#   Under ``zero_grad(set_to_none=False)`` a parameter that once had a gradient holds a zero
#   tensor after each ``zero_grad()``. Where no rank's backward reaches it before the next step,
#   single-process training steps that zero tensor: weight decay, momentum and Adam's moments
#   move the parameter and its state (reading "step"). A wrapper that frees every ``.grad`` when
#   it synchronises and records which parameters some rank gave a gradient (a sharded design
#   whose ranks own the parameters) steps such a parameter as if its gradient were None, as
#   torch's optimizers do after ``zero_grad(set_to_none=True)`` (reading "skip"). Both are
#   readings of the interface, and paracheck accepts either, for such a parameter and step only:
#   one that some rank used gets the average of the ranks' gradients and is stepped, and skipping
#   it is a bug. A skipped parameter's gradient is None, or zeros (the value no backward changed).
#
#   The reading is chosen per parameter and step, not once per trajectory: a design's rule can
#   depend on its own history. ``corpus/zero1_owner_rs.py`` skips a parameter its owner never
#   stepped (its group added while no rank used it) and steps the zero gradient of one it did
#   (its ``step()`` leaves the gradient in ``.grad``, which ``zero_grad()`` then zeroes): in one
#   case of six steps it skips at step 3 and steps at step 5, and failed against either whole
#   trajectory. The choice for one parameter at one step changes nothing else in that step:
#   torch's optimizers keep each parameter's state apart, and a zero gradient adds nothing to a
#   clipped global norm (``clip_global_norm``) or to a GradScaler's search for an inf. It changes
#   every later step, whose gradients are computed from the parameter it left, so the oracle is
#   trained again for each choice (``train(..., skip_unreached=...)``: the (step, parameter)
#   pairs it skips), and the choices are searched in step order: ``on_its_reading`` (in
#   ``paracheck.check.properties.reading``) keeps a choice while the target still matches at its
#   step and stops at the first set of choices the whole trajectory matches, every other
#   parameter and step judged as before. Matching includes the union of the ranks' optimizer
#   states: Adam's step of a zero gradient leaves the parameter where it was (without weight
#   decay) and creates its state, which a skipped parameter does not have. Where no set of
#   choices matches, the failure reported is against the choices the target followed for longest.


@dataclass
class StepRecord:
    losses: list[list[float]]  # [rank][micro]
    grads: list[torch.Tensor | None]  # synchronised gradients, before the step
    grad_absum: list[torch.Tensor | None]  # sum over ranks and micro-steps of |local grad|
    params: list[torch.Tensor]  # after the step
    state: dict[int, dict[str, torch.Tensor]] = field(
        default_factory=dict
    )  # optimizer state after step
    # The parameters that held the zero tensor ``zero_grad()`` left and that no rank's backward
    # reached: stepped with it, or skipped (None in ``grads``) where the trajectory's
    # ``skipped_unreached`` says so (Note [A parameter no rank reached]).
    unreached: tuple[int, ...] = ()
    # The GradScaler found a gradient that is not finite and skipped the step (``Case.loss_scale``):
    # the step's gradients are discarded by every design and are not compared.
    skipped: bool = False
    # ``Case.master_weights``: the float32 master of every parameter in the optimizer's groups
    # after the step (None for one outside them, or frozen); None without master weights.
    masters: list[torch.Tensor | None] | None = None
    # Per parameter, the largest magnitude a term of the step's update can reach (the lr times a
    # bound on the update direction, ``update_scale``), None for one the step left alone: the
    # scale of Note [Comparing an update] in ``paracheck.oracle.tolerance``.
    update_scale: list[float | None] = field(default_factory=list)


@dataclass
class Trajectory:
    case: Case
    initial_params: list[torch.Tensor]
    initial_buffers: list[torch.Tensor]
    steps: list[StepRecord]
    # Each step was applied to the gradients the target recorded, where it recorded them
    # (``train(..., target_gradients=True)``).
    on_target_gradients: bool = False
    # The (step, parameter index) pairs of an unreached parameter that were skipped, not stepped
    # with their zero gradient (Note [A parameter no rank reached]).
    skipped_unreached: frozenset[tuple[int, int]] = frozenset()


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


def _local_grads(case: Case, model, params, step: int, rank: int, scaler=None, on=None):
    """Rank ``rank``'s local gradients of ``step`` (on the CPU) and its micro-steps' losses.
    ``on``: a copy of ``model`` on another device, on which they are computed instead, from the
    model's current parameters and buffers (Note [Local gradients on the ranks' device])."""
    device = "cpu"
    if on is not None:
        with torch.no_grad():
            for d, p in zip(on.parameters(), model.parameters()):
                d.copy_(p)
            for d, b in zip(on.buffers(), model.buffers()):
                d.copy_(b)
        model, params = on, list(on.parameters())
        device = next(on.parameters()).device
    for p in params:
        p.grad = None
    losses = []
    for micro in range(micro_batches(case, step)):
        x, y = batch_for(case, step, micro, rank)
        x, y = x.to(device), y.to(device)
        with forward_context(case, device):
            out = model(x)
        loss = step_loss(case, out, y, step)
        if scaler is not None:
            losses.append(loss.item())
            if on is None:
                loss = scaler.scale(loss)
            else:  # the CPU scaler's scale (a power of two: the product is exact) as a 0-d factor
                loss = loss * scaler.scale(torch.ones((), dtype=torch.float32))
        if case.double_backward:  # the micro-step's gradient counts twice, as on the ranks
            loss.backward(retain_graph=True)
        loss.backward()
        if scaler is None:
            losses.append(loss.item())
    grads = [None if p.grad is None else p.grad.detach().to("cpu", copy=True) for p in params]
    return grads, losses


def clip_global_norm(grads: list[torch.Tensor], max_norm: float, scales=()) -> float:
    """Scale ``grads`` in place as ``torch.nn.utils.clip_grad_norm_(params, max_norm)`` does (the
    2-norm of the per-tensor 2-norms; coefficient ``max_norm / (norm + 1e-6)``, at most 1), and
    ``scales`` (the tensors' ``grad_absum``) by the same coefficient: the bound on the rank sum's
    rounding scales with the gradient. Returns the coefficient."""
    if not grads:
        return 1.0
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    for t in list(grads) + list(scales):
        t.mul_(coef.to(t.dtype))
    return float(coef)


def _anchor(params, held, anchor, masters):
    """Set ``params`` to a target's ``anchor`` = (parameters, gradients[, masters]) (bitwise; a
    tensor of another shape is left as it is: the comparison reports it), and ``masters`` to its
    masters where it recorded them (else to its parameters in float32), and return the held
    gradients to use: the target's where it recorded them."""
    anchor_params, anchor_grads, *rest = anchor
    anchor_masters = rest[0] if rest else None
    with torch.no_grad():
        for p, a in zip(params, anchor_params):
            if a is not None and tuple(a.shape) == tuple(p.shape):
                p.copy_(a)
        for i, m in enumerate(masters or ()):
            a = anchor_masters[i] if anchor_masters is not None else None
            ok = a is not None and tuple(a.shape) == tuple(m.shape)
            m.copy_(a if ok else params[i])
    if anchor_grads is None or len(anchor_grads) != len(params):
        return held
    return [
        h if g is None or tuple(g.shape) != tuple(p.shape) else g.detach().to(p.dtype).clone()
        for p, h, g in zip(params, held, anchor_grads)
    ]


def _inside(optimizer, params, stepped) -> set[int]:
    """The ids of the parameters whose tensor (itself, or its master) the optimizer holds."""
    held = {id(t) for g in optimizer.param_groups for t in g["params"]}
    return {id(p) for p, t in zip(params, stepped) if id(t) in held}


def _master_gradients(params, masters, own=None) -> None:
    """Give each master its parameter's gradient, for a step of the masters (Note [Master
    weights]). ``own``: the target's gradients where it recorded them, used whole where the
    parameter holds one (a float32 gradient of a wrapper that reduces in float32 is not rounded
    to the parameter's dtype first: Note [Compute dtype of an FSDP])."""
    for i, (p, m) in enumerate(zip(params, masters)):
        g = own[i] if own is not None and len(own) == len(params) else None
        if p.grad is None:
            m.grad = None
            continue
        use = g if g is not None and tuple(g.shape) == tuple(p.shape) else p.grad
        m.grad = use.detach().to(m.dtype)


def _round_from_masters(params, masters) -> None:
    """Every parameter rounded from its master after a step of the masters; the masters' gradients
    dropped."""
    with torch.no_grad():
        for p, m in zip(params, masters):
            p.copy_(m)
    for m in masters:
        m.grad = None


def update_scale(optimizer, stepped, directions: dict) -> list[float | None]:
    """Per tensor of ``stepped`` (in the optimizer's groups, holding a gradient: the step about to
    be taken), the largest magnitude a term of its update can reach, for the scale of Note
    [Comparing an update]; None for a tensor the step leaves alone. SGD: lr times the momentum
    recurrence run on magnitudes, b = mu * b + |g| + wd * |p| (kept in ``directions`` across
    steps, by tensor id); Adam and AdamW: lr / sqrt((1 - beta2) * beta2**n) after n earlier
    steps, which bounds |g_j| / sqrt(v_hat) for every gradient g_j the moments hold, and with it
    the update direction and its rounding error."""
    where = {id(t): i for i, t in enumerate(stepped)}
    out: list[float | None] = [None] * len(stepped)
    for group in optimizer.param_groups:
        lr = float(group["lr"])
        wd = float(group.get("weight_decay", 0.0))
        for t in group["params"]:
            i = where.get(id(t))
            if i is None or t.grad is None:
                continue
            if "betas" in group:
                beta2 = float(group["betas"][1])
                step = optimizer.state.get(t, {}).get("step", 0)
                n = float(step.item() if torch.is_tensor(step) else step)
                out[i] = lr / ((1.0 - beta2) * beta2**n) ** 0.5
                continue
            mu = float(group.get("momentum", 0.0))
            terms = (
                t.grad.detach().to(torch.float64).abs() + wd * t.detach().to(torch.float64).abs()
            )
            prev = directions.get(id(t))
            directions[id(t)] = terms if prev is None or mu == 0.0 else mu * prev + terms
            out[i] = lr * directions[id(t)].max().item() if terms.numel() else 0.0
    return out


def _masters_held(optimizer, masters) -> list | None:
    """A clone of each master the optimizer holds and steps (trainable), None for the others."""
    if masters is None:
        return None
    held = {id(t) for g in optimizer.param_groups for t in g["params"]}
    return [m.detach().clone() if id(m) in held and m.requires_grad else None for m in masters]


def _use_gradients(params, grads) -> None:
    """Set each parameter's gradient to the target's (a tensor of another shape, or none, leaves
    the oracle's: the gradient comparison reports it)."""
    if grads is None or len(grads) != len(params):
        return
    for p, g in zip(params, grads):
        if g is not None and tuple(g.shape) == tuple(p.shape) and p.grad is not None:
            p.grad = g.detach().to(p.dtype).clone()


# Note [Local gradients on the ranks' device]
#   The derived bound on a synchronised gradient (Note [Step 0: a derived bound]) holds where each
#   rank's local gradient is computed by the oracle's operations: then only the rank sum differs.
#   Ranks on GPUs compute theirs with CUDA kernels, and below float32 a CPU kernel's bfloat16
#   gradient can differ from them by more than any fixed fraction of the per-backward terms
#   (Note [Gradients across devices below float32]). ``train(..., device=...)`` therefore runs
#   each rank's forward and backward on a copy of the model on that device type (the same
#   kernels, deterministic for the same shapes on the same GPU model) and brings the local
#   gradients back; the sums over ranks, the optimizer and everything else stay on the CPU. A
#   GradScaler's scale is applied as the product it is (a power of two: exact).


def train(
    case: Case,
    anchors=None,
    *,
    target_gradients: bool = False,
    device: str | None = None,
    skip_unreached: frozenset[tuple[int, int]] = frozenset(),
) -> Trajectory:
    """Train ``case`` in this process and return the whole trajectory (see module docstring).

    ``anchors``: a target's own steps, as (parameters after the step, synchronised gradients or
    None[, float32 masters or None]) per step. Step k >= 1 then starts from the target's parameters after step k-1 (and
    the gradients it held), not from the oracle's own: each step is the oracle's step from the
    target's state (Note [Anchored steps] in ``paracheck.oracle.tolerance``). Optimizer state,
    scaler and schedules stay the oracle's own. With ``target_gradients``, each step's update is
    applied to the gradients the target's step used (``anchors[k]``'s, where it recorded them)
    instead of the oracle's: the parameters then judge the update alone (the recorded gradients,
    the oracle's, judge the gradients), and no optimizer amplifies a rounding difference of the
    gradients into the parameters (Note [Anchored steps]). ``device`` (not the CPU): the local
    gradients are computed there (Note [Local gradients on the ranks' device]).
    ``skip_unreached``: the (step, parameter index) pairs at which a parameter that holds zeros
    and that no rank reached is skipped instead of stepped (Note [A parameter no rank reached])."""
    model = build_case_model(case, rank=0)
    on = None
    if device is not None and torch.device(device).type != "cpu":
        on = copy.deepcopy(model).to(device)
    params = list(model.parameters())
    initial = [p.detach().clone() for p in params]
    buffers = [b.detach().clone() for b in model.buffers()]
    masters = _masters(case, params)
    stepped = params if masters is None else masters
    optimizer = build_optimizer(case, stepped)
    scheduler = build_scheduler(case, optimizer)
    scaler = build_grad_scaler(case)
    W = case.world_size
    # The gradient each parameter holds when a step begins (see the module docstring).
    held: list[torch.Tensor | None] = [None] * len(params)
    records = []
    directions: dict = {}  # update_scale's magnitude recurrence, across steps
    for step in range(case.steps):
        if anchors is not None and 0 < step <= len(anchors):
            held = _anchor(params, held, anchors[step - 1], masters)
        add_late_groups(case, optimizer, stepped, step)
        held, zeroed = _zero_grad(case, params, held, _inside(optimizer, params, stepped))
        per_rank = []
        losses = []
        for rank in range(W):
            grads, ls = _local_grads(case, model, params, step, rank, scaler, on)
            per_rank.append(grads)
            losses.append(ls)
        synced, absum = _synchronise(case, params, per_rank, held)
        alone = _unreached(step, zeroed, per_rank, synced, absum, skip_unreached)
        for p, g in zip(params, synced):
            p.grad = None if g is None else g.clone()
        skipped = False
        scaling = scaler is not None and any(
            p.grad is not None for g in optimizer.param_groups for p in g["params"]
        )  # GradScaler.step and update raise where no gradient is held: the ranks do the same
        if scaling:
            # torch's own unscale_ (the optimizer's parameters only, as on the ranks); the scale
            # is a power of two, so grad_absum is unscaled exactly alike.
            inv = 1.0 / scaler.get_scale()
            scaler.unscale_(optimizer)
            inside = _inside(optimizer, params, stepped)
            synced = [
                p.grad if id(p) in inside and g is not None else g for p, g in zip(params, synced)
            ]
            absum = [
                a * inv if id(p) in inside and a is not None else a for p, a in zip(params, absum)
            ]
        if case.clip_norm is not None:
            _clip(case.clip_norm, case, params, synced, absum, step)
        for p, g in zip(params, synced):
            p.grad = None if g is None else g.clone()
        own = None
        if target_gradients and anchors is not None and step < len(anchors):
            own = anchors[step][1]
            _use_gradients(params, own)
        if masters is not None and not scaling:
            _master_gradients(params, masters, own)
        scales = update_scale(optimizer, stepped, directions)
        if scaling:
            before = scaler.get_scale()
            scaler.step(optimizer)
            scaler.update()
            # The scale never grows within a case (GROWTH_INTERVAL): it falls iff a step is skipped.
            skipped = scaler.get_scale() < before
        elif masters is not None:
            optimizer.step()
            _round_from_masters(params, masters)
        else:
            optimizer.step()
        apply_lr_schedule(case, optimizer)
        step_scheduler(scheduler)
        records.append(
            StepRecord(
                losses=losses,
                grads=[None if g is None else g.clone() for g in synced],
                grad_absum=absum,
                params=[p.detach().clone() for p in params],
                state=optimizer_state(optimizer, stepped),
                skipped=skipped,
                masters=_masters_held(optimizer, masters),
                update_scale=scales,
                unreached=alone,
            )
        )
        held = [None if g is None else g.clone() for g in synced]
        for p in params:
            p.grad = None
    _all_unreached(skip_unreached, records)
    return Trajectory(
        case=case,
        initial_params=initial,
        initial_buffers=buffers,
        steps=records,
        on_target_gradients=target_gradients and anchors is not None,
        skipped_unreached=frozenset(skip_unreached),
    )


def _unreached(step: int, zeroed, per_rank, synced: list, absum: list, skip) -> tuple[int, ...]:
    """The parameters of ``zeroed`` that no rank's backward reached at ``step``; those whose
    (step, index) pair is in ``skip`` lose their gradient and bound (Note [A parameter no rank
    reached])."""
    alone = tuple(i for i in zeroed if all(g[i] is None for g in per_rank))
    for i in alone:
        if (step, i) in skip:
            synced[i] = absum[i] = None
    return alone


def _all_unreached(skip, records: list[StepRecord]) -> None:
    """Refuse a ``skip_unreached`` pair that names no unreached parameter of ``records``."""
    left = set(skip) - {(k, i) for k, r in enumerate(records) for i in r.unreached}
    if left:
        raise ValueError(
            f"skip_unreached={sorted(skip)} names {sorted(left)}: (step, parameter) pairs that "
            "held no zero gradient or that some rank's backward reached"
        )


def _zero_grad(case: Case, params: list, held: list, inside: set[int]) -> tuple[list, tuple]:
    """What ``optimizer.zero_grad()`` (or, with ``Case.zero_grad_module``, the target's) leaves
    of the ``held`` gradients (see the module docstring), and the indices it left zeros in."""
    out: list[torch.Tensor | None] = []
    zeroed = []
    for i, (p, h) in enumerate(zip(params, held)):
        if h is None or (id(p) not in inside and not case.zero_grad_module):
            out.append(h)
        elif case.set_to_none:
            out.append(None)
        else:
            out.append(torch.zeros_like(h))
            zeroed.append(i)
    return out, tuple(zeroed)


def _masters(case: Case, params: list) -> list | None:
    """What the optimizer steps instead of the parameters: their float32 masters (Note [Master
    weights]), or None to step the parameters."""
    if not case.master_weights:
        return None
    start = params
    if case.masters_from_float32:  # Note [Compute dtype of an FSDP]
        start = list(build_case_model(case, rank=0, masters=True).parameters())
    return [
        s.detach().to(torch.float32).requires_grad_(p.requires_grad) for s, p in zip(start, params)
    ]


def _clip(max_norm: float, case: Case, params: list, synced: list, absum: list, step: int) -> None:
    """Clip to ``max_norm``, in place, the global norm of the gradients of the parameters the
    optimizer holds at ``step`` (Note [Clipping the global norm]), their bounds scaled alike."""
    inside = {id(p) for p in params_in_groups(case, params, step)}
    clip_global_norm(
        [g for p, g in zip(params, synced) if g is not None and id(p) in inside],
        max_norm,
        scales=[a for p, a in zip(params, absum) if a is not None and id(p) in inside],
    )


def _synchronise(case: Case, params: list, per_rank: list, held: list) -> tuple[list, list]:
    """Each parameter's synchronised gradient from the ranks' local ones and the gradient it
    held, and the sum of magnitudes that bounds its rounding (None where it has none)."""
    W = case.world_size
    synced: list = []
    absum: list = []
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
        if case.loss != "token-mean":  # Note [Loss semantics]: token-mean sums over ranks
            total /= W
        h = held[i]
        if h is not None:
            # Every rank holds h and sums it into its local gradient: W * |h| bounds that sum.
            total += h
            mag += W * h.abs()
        synced.append(total)
        absum.append(mag)
    return synced, absum
