"""Placement properties: what each rank holds, judged from outside the design. ``grads-sharded``
(zero2): once a step's gradients are synchronised, each rank holds its shard of them, not whole
gradients. ``params-sharded`` (fsdp): after each step each rank holds its shard of the
parameters, not whole ones.

Read from each ``RankRecord``, per ``RankStep``: ``scattered`` and ``held_grad_elements``
(``paracheck.check.ranks.zero.run_zero2``), ``held_param_elements``
(``paracheck.check.ranks.fsdp.run_fsdp``).

Note [Gradients kept as shards]
    ZeRO-2's saving over ZeRO-1 is the gradients: each bucket's full gradient exists only until
    its reduce-scatter has completed, and what stays is this rank's shard. Its two classic bugs
    keep the values right and the memory ZeRO-1's (or DDP's): the full bucket buffer is kept
    for the next step, and the parameters' own gradients are zeroed or left in place instead of
    freed. So, after each step's last synchronisation (``finish_gradient_synchronization()``
    after its last backward), before ``step()``:

    1. *Reduced buffers are freed.* No storage that a floating-point reduce-scatter of the step
       read whole (the larger of its input and output) still holds bytes; counted as the
       ``freed`` property counts gathers (Note [Settling a count of live storages] in
       ``paracheck.check.ranks.fsdp``). A design that reduces by all-reduce is not watched
       here (an all-reduced tensor a correct design keeps, a flag or a norm, cannot be told
       from a gradient), only by 2.
    2. *No gradient is held whole on every rank.* Each rank's gradient storage reachable from
       ``.grad`` (of the module's parameters and of the tensors its optimizer steps: pieces,
       masters; each storage once, whole) is summed over the ranks; it may not exceed
       P + (W - 1) * sum of the parameters' row sizes, P the trainable elements. Every correct
       placement is below that bound: per-parameter ownership holds each gradient on its owner
       only (P); flat shards hold P plus less than W elements of padding per bucket, and a
       sharding along dimension 0 at most W - 1 padding rows per parameter. A rank that keeps
       its whole gradients adds P by itself (every trainable element it used). A design that
       pads its shards further (to an alignment) can exceed the bound: select the other
       properties for it (``--properties equivalence,state,memory,balance,traffic``).

    World size 1 is not judged (a shard is the whole gradient there), nor a step run by a
    closure (its synchronisation is inside ``step()``).
"""

from __future__ import annotations

from paracheck.cases import Case
from paracheck.check.properties._divergence import Divergence, diverge
from paracheck.check.properties._sharding import CaseFacts
from paracheck.check.ranks.record import RankRecord

__all__ = [
    "check_grads_sharded",
    "check_params_sharded",
    "held_gradient_bound",
    "held_parameter_bound",
]


def held_gradient_bound(params, trainable, world_size: int) -> int:
    """The most gradient elements all ranks together may hold once synchronised (Note [Gradients
    kept as shards], 2): the trainable elements, plus W - 1 rows of padding per parameter."""
    total = sum(params[i].numel() for i in trainable)
    rows = sum(
        params[i].numel() // params[i].shape[0]
        if params[i].dim() >= 1 and params[i].shape[0]
        else 1
        for i in trainable
    )
    return total + (world_size - 1) * rows


def check_grads_sharded(case: Case, traj, ranks: list[RankRecord], kind: str) -> Divergence | None:
    """The first step and rank holding a reduced buffer, or the first step whose ranks together
    hold more gradient than shards can (Note [Gradients kept as shards]), or None."""
    W = case.world_size
    if W == 1:
        return None
    facts = CaseFacts.of(case)
    bound = held_gradient_bound(facts.params, facts.trainable, W)
    for k in range(len(traj.steps)):
        for r, rec in enumerate(ranks):
            scattered = rec.steps[k].scattered
            if scattered is not None and scattered[0]:
                count, nbytes = scattered
                return diverge(
                    k,
                    "grads-sharded",
                    r,
                    f"rank {r} still holds {count} storage(s) that the step's reduce-scatters "
                    f"read whole, {nbytes} bytes, after the step's gradients were synchronised: "
                    "full gradient buffers are kept (ZeRO-1's memory, not ZeRO-2's)",
                    nbytes,
                    0,
                )
        held = [rec.steps[k].held_grad_elements for rec in ranks]
        d = _over(
            k,
            "grads-sharded",
            held,
            bound,
            f"after the step's gradients were synchronised the ranks hold {{total}} gradient "
            f"elements in all (per rank {held}) on their parameters' and optimizer's .grad; "
            f"shards of the {sum(facts.params[i].numel() for i in facts.trainable)} trainable "
            f"elements come to at most {bound} (padding included): whole gradients are kept",
        )
        if d is not None:
            return d
    return None


def _over(k: int, what: str, held: list, bound: int, detail: str) -> Divergence | None:
    """A divergence at step ``k`` where the ranks' ``held`` elements (None: not recorded) sum
    above ``bound``, blamed on the rank holding most; ``{total}`` in ``detail`` is the sum."""
    if any(h is None for h in held) or sum(held) <= bound:
        return None
    r = max(range(len(held)), key=lambda i: held[i])
    return diverge(k, what, r, detail.format(total=sum(held)), sum(held), bound)


# Note [Parameters kept as shards]
#   ZeRO-3's saving is the parameters: between uses each rank keeps its shard of every sharded
#   parameter and nothing more. The classic bug keeps the values right and the memory DDP's: the
#   shard is a view of the whole parameter (``p.data = p.data.chunk(W)[r]``), whose storage then
#   stays alive, or the module keeps its original parameters beside the shards. After each
#   optimizer step the rank program sums, per rank, the storage behind the wrapper's and the
#   module's parameters (a DTensor's local shard; each storage once, whole), and the sum over the
#   ranks may not exceed P + (W - 1) * (the elements of each vector and each frozen parameter,
#   which a design may replicate, plus one row of each trainable matrix: padding of a shard along
#   dimension 0, or of a flat shard). A design that keeps every trainable matrix whole on every
#   rank adds (W - 1) times their elements. Not judged at world size 1.


def held_parameter_bound(params, trainable, world_size: int) -> int:
    """The most parameter elements all ranks together may hold (Note [Parameters kept as
    shards])."""
    total = sum(p.numel() for p in params)
    slack = 0
    for i, p in enumerate(params):
        sharded = i in trainable and p.dim() >= 2 and p.shape[0] > 0
        slack += p.numel() // p.shape[0] if sharded else p.numel()
    return total + (world_size - 1) * slack


def check_params_sharded(case: Case, traj, ranks: list[RankRecord], kind: str) -> Divergence | None:
    """The first step after which the ranks together hold more parameter storage than shards
    and replicated vectors can (Note [Parameters kept as shards]), or None."""
    W = case.world_size
    if W == 1:
        return None
    facts = CaseFacts.of(case)
    bound = held_parameter_bound(facts.params, set(facts.trainable), W)
    for k in range(len(traj.steps)):
        held = [rec.steps[k].held_param_elements for rec in ranks]
        d = _over(
            k,
            "params-sharded",
            held,
            bound,
            f"after the step the ranks hold {{total}} parameter elements in all (per rank "
            f"{held}) behind the wrapper's and the module's parameters; shards of the "
            f"{sum(p.numel() for p in facts.params)} elements, vectors and frozen parameters "
            f"replicated, come to at most {bound}: whole parameters are kept",
        )
        if d is not None:
            return d
    return None
