"""The ``balance`` property (sharding kinds): the declared partition owns every trainable
parameter exactly once and is within its stated bound (Note [Balance bound] / Note [Flat layout]
in ``paracheck.zero.partition``).

Reads from each ``RankRecord`` the declared partition: ``owners`` per ``RankStep`` (``sharded``;
every rank must declare rank 0's) or ``pieces`` and ``bucket_numels`` (``zero``). Compares with the
case's parameters: for ``sharded``, every parameter in the optimizer at that step owned, and the
largest load at most total/W + (W-1)/W * largest parameter (frozen parameters weigh nothing); for
``zero``, the pieces tiling each trainable parameter exactly once, and the largest load at most
sum over buckets of ceil(n_b / W) elements. A ``sharded`` target that declares no partition is
judged on the state its ranks step (Note [Balance of the state stepped]), unless the contract
leaves that out (``stepped=False``: ``--contract cs336``); an undeclared ``zero`` is not judged.

Note [Balance of the state stepped]
    A sharded optimizer exists to divide the optimizer state, and the bytes of state a rank holds
    follow the parameter bytes it owns. Without a declared partition, what each rank owns is seen
    in what it steps: the parameters whose state changed on that rank in a step (``state_stepped``,
    the record of Note [State stepped on two ranks] in ``paracheck.check.properties.memory``),
    known from the second step on. At world size W >= 2, a step where some rank steps the state
    of more than total/W + largest bytes of parameters (total: the trainable parameters in the
    optimizer at that step, largest: the largest of them) is a ``balance`` divergence: any
    partition that fills ranks by size is within it (a greedy fill ends within
    total/W + (W-1)/W * largest; a contiguous fill below total/W + largest), while one that deals
    parameters round-robin by count can give one rank almost every large one. Parameters that
    no rank steps (no gradient in that step, state the watch does not see) count in the total
    but in no rank's load: the load seen is at most the rank's own, so a design within the bound
    is never judged over it. The CS336 contract asks for no particular balance: not judged there.
"""

from __future__ import annotations

from paracheck.cases import Case
from paracheck.check.properties._divergence import Divergence, diverge
from paracheck.check.properties._sharding import CaseFacts, owners_disagree
from paracheck.check.ranks.record import RankRecord

__all__ = ["check_balance"]


def check_balance(
    case: Case, traj, ranks: list[RankRecord], state_layout: str, *, stepped: bool = True
) -> Divergence | None:
    """``state_layout``: the kind's (``paracheck.check.kinds.Kind.state_layout``). The first step
    at which the declared partition breaks its bound or coverage, or (an
    undeclared ``sharded`` target, with ``stepped``) the state a rank steps breaks the bound of
    Note [Balance of the state stepped]; None if neither."""
    facts = CaseFacts.of(case)
    for k in range(len(traj.steps)):
        d = (
            _zero(k, ranks, facts, case.world_size)
            if state_layout == "flat"
            else _sharded(k, ranks, facts, case.world_size, stepped)
        )
        if d is not None:
            return d
    return None


def _stepped(k, ranks, facts: CaseFacts, W: int) -> Divergence | None:
    """Note [Balance of the state stepped]."""
    if W < 2:
        return None
    weights = {i: facts.nbytes[i] for i in facts.in_optimizer(k) if facts.params[i].requires_grad}
    loads = [sum(weights.get(i, 0) for i in rec.steps[k].state_stepped) for rec in ranks]
    total, largest = sum(weights.values()), max(weights.values(), default=0)
    if W * max(loads) <= total + W * largest:
        return None
    r = loads.index(max(loads))
    bound = total / W + largest
    return diverge(
        k,
        "balance",
        r,
        f"rank {r} steps the optimizer state of {max(loads)} bytes of parameters "
        f"({sorted(ranks[r].steps[k].state_stepped)}); the bound total/W + largest is "
        f"{total}/{W} + {largest} = {bound:g} (bytes whose state each rank steps: {loads}); the "
        f"target declares no partition, so its balance is judged on the state each rank steps",
        got=max(loads),
        expected=bound,
    )


def _sharded(k, ranks, facts: CaseFacts, W: int, stepped: bool = True) -> Divergence | None:
    owners = ranks[0].steps[k].owners
    if owners is None:
        return _stepped(k, ranks, facts, W) if stepped else None
    d = owners_disagree(k, ranks)
    if d is not None:
        return d
    in_opt = facts.in_optimizer(k)
    unowned = [i for i in in_opt if owners[i] is None]
    if unowned:
        return diverge(
            k,
            "balance",
            0,
            f"parameters {unowned} are in the optimizer but owned by no rank",
            index=unowned[0],
        )
    weights = {i: facts.nbytes[i] if facts.params[i].requires_grad else 0 for i in in_opt}
    loads = [sum(w for i, w in weights.items() if owners[i] == r) for r in range(W)]
    total, largest = sum(weights.values()), max(weights.values(), default=0)
    if W * max(loads) > total + (W - 1) * largest:
        r = loads.index(max(loads))
        bound = total / W + (W - 1) / W * largest
        return diverge(
            k,
            "balance",
            r,
            f"rank {r} owns {max(loads)} bytes of trainable parameters; the bound total/W + (W-1)/W * "
            f"largest is {total}/{W} + {W - 1}/{W} * {largest} = {bound:g} (loads {loads}, owners "
            f"{owners})",
            got=max(loads),
            expected=bound,
        )
    return None


def _zero(k, ranks, facts: CaseFacts, W: int) -> Divergence | None:
    declared = [rec.pieces for rec in ranks]
    if declared[0] is None:
        return None
    params = facts.params
    covered: dict[int, list[tuple[int, int]]] = {}
    for pieces in declared:
        for i, start, length in pieces:
            covered.setdefault(i, []).append((start, length))
    for i in facts.trainable:
        runs = sorted(covered.get(i, []))
        pos = 0
        for start, length in runs:
            if start != pos:
                break
            pos += length
        if pos != params[i].numel() or sum(n for _, n in runs) != params[i].numel():
            return diverge(
                k,
                "balance",
                0,
                f"the ranks' pieces of parameter #{i} ({params[i].numel()} elements) "
                f"are {runs}: they must tile it exactly once",
                index=i,
            )
    loads = [sum(n for _, _, n in pieces) for pieces in declared]
    bound = sum(-(-n // W) for n in ranks[0].bucket_numels)
    if max(loads) > bound:
        r = loads.index(max(loads))
        return diverge(
            k,
            "balance",
            r,
            f"rank {r} owns {max(loads)} elements; the bound sum_b ceil(n_b/W) is "
            f"{bound} (loads {loads})",
            max(loads),
            bound,
        )
    return None
