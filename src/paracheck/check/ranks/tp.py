"""The ``tp`` kind's rank program: a tensor-parallel plan ``plan(model, mesh) -> model`` (torch's
``parallelize_module`` styles, or the user's own tensor-parallel modules), trained on the 2-D
mesh ``("dp", "tp")`` of a ``paracheck.tp.TPCase`` (Note [A tensor-parallel case]).

Every rank builds the case's model from the same seed and calls the plan with it and the mesh
(and ``sequence_parallel=`` where the plan takes it: Note [Readings of a tensor-parallel plan]).
Per step it zeroes the gradients, runs each micro-batch of its tensor-parallel group (the batches
of the group's members concatenated, the loss the mean of the members' mean losses), averages the
gradients over "dp", clips (the model's own ``clip_grad_norm_(max_norm)`` where the plan gave it
one, else ``torch.nn.utils.clip_grad_norm_`` over its parameters) and steps the case's optimizer.
It records every parameter and gradient whole (Note [Reading a tensor-parallel parameter]).

Note [Readings of a tensor-parallel plan]
    The target is a function (or a class called so) ``plan(model, mesh)`` returning the model to
    train: the model given, parallelised in place, or another module holding the same parameters
    in the same order (``parameters()`` is what the optimizer gets and what is compared). ``mesh``
    is a 2-D ``DeviceMesh`` named ("dp", "tp"); the plan parallelises over ``mesh["tp"]`` and
    leaves the data dimension alone (none: the rank program averages the gradients over "dp").
    A plan taking ``sequence_parallel`` (a keyword) is called with the case's draw; one without
    it is checked on cases without sequence parallelism only. The returned model may output a
    tensor that every rank of a tensor-parallel group holds whole, or a DTensor (gathered with
    ``full_tensor()``, whose backward is the plan's). A model with a method
    ``clip_grad_norm_(max_norm)`` clips its own gradients (every shard's norm must count).

Note [Reading a tensor-parallel parameter]
    A parameter or gradient that is a DTensor sharded on the mesh is gathered, and a partial
    gradient (that of a replicated parameter computed from sharded activations, which torch leaves
    unreduced until something reads it) is summed (``full_tensor()``: every rank of the group then
    holds the same tensor). Any other is read as this rank's local tensor, never reduced: a
    replicated one, a plain tensor, and a parameter placed partial (its value is what the rank
    holds; a plan that sums it in its forward computes with another value, which its gradients
    show). So a replicated parameter or gradient that differs between the ranks of a group is
    seen as it is: rank-agreement compares the parameters bitwise, and equivalence compares every
    rank's gradients with the oracle's.
"""

from __future__ import annotations

import inspect

import torch
import torch.distributed as dist

from paracheck.cases import batch_for, build_case_model, build_optimizer, loss_fn, micro_batches
from paracheck.check.ranks._common import on_every_rank, rank_device, target_object
from paracheck.check.ranks.job import RankJob
from paracheck.check.ranks.record import RankRecord, RankStep
from paracheck.world import set_step

__all__ = ["read_whole", "run_tp", "tp_mesh"]

# (dp, tp, device type) -> (the default group it was made in, its DeviceMesh): made once per
# world (a mesh's groups are made by every rank in the same order, and cost a rendezvous each);
# a world started again has another default group, and its meshes are made again. Every rank of
# a world meets the same cases in the same order, so every rank remakes a mesh or none does.
_MESHES: dict[tuple, tuple] = {}


def tp_mesh(dp: int, tp: int, device_type: str):
    """The mesh (dp, tp) named ("dp", "tp") over this world's ranks."""
    from torch.distributed.device_mesh import init_device_mesh

    key = (dp, tp, device_type)
    world = dist.group.WORLD
    if key not in _MESHES or _MESHES[key][0] is not world or not _alive(_MESHES[key][1]):
        mesh = init_device_mesh(device_type, (dp, tp), mesh_dim_names=("dp", "tp"))
        _MESHES[key] = (world, mesh)
    return _MESHES[key][1]


def _alive(mesh) -> bool:
    """Whether every group of ``mesh`` is still registered (a world started again destroyed
    them: measured, a cached mesh's groups unresolvable after the World's reset)."""
    try:
        for dim in range(mesh.ndim):
            dist.get_process_group_ranks(mesh.get_group(dim))
    except (RuntimeError, KeyError, ValueError):
        return False
    return True


def read_whole(t, *, gradient: bool = False):
    """``t`` on the CPU, detached: a sharded DTensor gathered, a partial gradient summed, any
    other this rank's local tensor (Note [Reading a tensor-parallel parameter])."""
    from torch.distributed.tensor import DTensor, Partial, Shard

    if t is None:
        return None
    if isinstance(t, DTensor):
        whole = (Shard, Partial) if gradient else (Shard,)
        t = t.full_tensor() if any(isinstance(p, whole) for p in t.placements) else t.to_local()
    return t.detach().to("cpu", copy=True)


def _whole(out):
    from torch.distributed.tensor import DTensor

    return out.full_tensor() if isinstance(out, DTensor) else out


def _average_over_dp(params: list, mesh) -> None:
    """Each gradient's local tensor averaged over the "dp" dimension (no data-parallel wrapper:
    the rank program owns the data dimension)."""
    from torch.distributed.tensor import DTensor

    dp = mesh["dp"]
    if dp.size() == 1:
        return
    group = dp.get_group()
    with torch.no_grad():
        for p in params:
            if p.grad is None:
                continue
            local = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
            dist.all_reduce(local, group=group)
            local.div_(dp.size())


def _clip(model, params: list, max_norm: float | None) -> None:
    if max_norm is None:
        return
    own = getattr(model, "clip_grad_norm_", None)
    if callable(own):
        own(max_norm)
    else:
        torch.nn.utils.clip_grad_norm_(params, max_norm)


def _group_batch(case, step: int, micro: int, group: range, device):
    """The batches of the group's member ranks, concatenated, and each one's row range."""
    parts = [batch_for(case, step, micro, r, device=device) for r in group]
    xs, ys = zip(*parts)
    bounds, start = [], 0
    for y in ys:
        bounds.append((start, start + y.shape[0]))
        start += y.shape[0]
    return torch.cat(xs), torch.cat(ys), bounds


def run_tp(job: RankJob) -> RankRecord:
    """Train ``job.case`` (a ``TPCase``) with the plan at ``job.path``."""
    case = job.case
    rank, world = dist.get_rank(), dist.get_world_size()
    device = rank_device(job.device)
    dp_size, tp_size = getattr(case, "mesh_shape", (case.world_size, 1))
    if world != dp_size * tp_size:
        raise ValueError(
            f"the mesh ({dp_size}, {tp_size}) needs {dp_size * tp_size} ranks, not {world}"
        )
    plan = target_object(job.path)
    if inspect.isclass(plan):
        plan = plan()
    sequence_parallel = getattr(case, "sequence_parallel", False)
    takes_sp = "sequence_parallel" in inspect.signature(plan).parameters
    if sequence_parallel and not takes_sp:
        return RankRecord.skip(
            f"{job.path} takes no sequence_parallel=: checked without sequence parallelism"
        )
    mesh = tp_mesh(dp_size, tp_size, device.type)
    model = build_case_model(case, 0, device=device)
    extra = {"sequence_parallel": sequence_parallel} if takes_sp else {}
    model = on_every_rank(lambda: plan(model, mesh, **extra), device, "the plan")
    params = list(model.parameters())
    optimizer = build_optimizer(case, params)
    group = range((rank // tp_size) * tp_size, (rank // tp_size + 1) * tp_size)
    initial = [read_whole(p) for p in params]
    buffers = [read_whole(b) for b in model.buffers()]
    steps = []
    for step in range(case.steps):
        set_step(step)  # named if the rank exceeds its memory cap
        optimizer.zero_grad(set_to_none=case.set_to_none)
        for micro in range(micro_batches(case, step)):
            x, y, bounds = _group_batch(case, step, micro, group, device)
            out = _whole(model(x))
            losses = [loss_fn(case, out[a:b], y[a:b]) for a, b in bounds]
            loss = torch.stack(losses).sum() / tp_size
            loss.backward()
        _average_over_dp(params, mesh)
        _clip(model, params, case.clip_norm)
        grads = [read_whole(p.grad, gradient=True) for p in params]
        optimizer.step()
        steps.append(RankStep([read_whole(p) for p in params], grads))
    return RankRecord(initial, buffers, tuple(steps))
