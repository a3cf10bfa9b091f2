"""The ``memory`` property (sharding kinds): each rank holds exactly the optimizer-state bytes its
declared partition implies: the state *is* sharded, and as declared.

Reads from each ``RankRecord``, per ``RankStep``, ``state_bytes`` (what the rank's innermost
optimizer holds) and the declared partition: ``owners`` per step (``sharded``, and every rank must
declare rank 0's: a ``balance`` divergence otherwise) or ``pieces`` (``zero``). Compares with
``paracheck.accounting.memory``'s model of those parameters' state (``sharded_state_bytes``,
``flat_state_bytes``), for the parameters that have state in the oracle at that step. A
``sharded`` target that declares no partition is judged only by Note [State stepped on two ranks].

Note [State stepped on two ranks]
    Without a declared partition nothing says which rank should hold which state, and a correct
    design may place it as it likes (round-robin over every parameter, frozen ones included; a
    contiguous fill that leaves a rank nothing; state kept by the wrapper or by an optimizer it
    wraps under any name). One thing no sharded optimizer does: step the same parameter's state
    on two ranks. Each rank records (``StateWatch``) the parameters whose state it *stepped*:
    tensors of the parameter's shape, keyed by the parameter itself in any optimizer reachable
    from the target, that it held before the step and that changed in it (bitwise). A stale copy
    never counts: state that ``load_state_dict`` left in the wrapper, or that a re-partition left
    behind, does not change. At world size 2 and above, a parameter stepped on two ranks is a
    ``memory`` divergence: every rank holds and updates its state, and nothing is sharded
    (``sharded-no-shard-undeclared``). State keyed by copies (float32 masters, flat shards) is not
    seen, and neither is a design whose state does not change; those pass unjudged, as before.
"""

from __future__ import annotations

from paracheck.accounting.memory import flat_state_bytes, sharded_state_bytes
from paracheck.cases import Case
from paracheck.check.kinds import KINDS
from paracheck.check.properties._divergence import Divergence, diverge
from paracheck.check.properties._sharding import CaseFacts, owners_disagree
from paracheck.check.ranks.record import RankRecord
from paracheck.zero.partition import Piece

__all__ = ["check_memory"]


def check_memory(case: Case, traj, ranks: list[RankRecord], kind: str) -> Divergence | None:
    """The first step and rank whose optimizer-state bytes are not its partition's, or None."""
    facts = CaseFacts.of(case)
    for k, oref in enumerate(traj.steps):
        stateful = set(oref.state)
        d = (_zero if KINDS[kind].state_layout == "flat" else _sharded)(k, ranks, facts, stateful)
        if d is not None:
            return d
    return None


def _sharded(k, ranks, facts: CaseFacts, stateful) -> Divergence | None:
    owners = ranks[0].steps[k].owners
    if owners is None:
        return _stepped_twice(k, ranks)
    d = owners_disagree(k, ranks)
    if d is not None:
        return d
    for r, rec in enumerate(ranks):
        got = rec.steps[k].state_bytes
        expected = sharded_state_bytes(
            owners,
            r,
            numels=[p.numel() for p in facts.params],
            element_sizes=facts.state_esize,
            models=facts.models,
            stateful=stateful,
        )
        if got != expected:
            return diverge(
                k,
                "memory",
                r,
                f"rank {r} holds {got} bytes of optimizer state; its declared "
                f"partition gives {expected} (owners {owners}, parameters with "
                f"state {sorted(stateful)})",
                got,
                expected,
            )
    return None


def _stepped_twice(k: int, ranks: list[RankRecord]) -> Divergence | None:
    """Note [State stepped on two ranks]."""
    if len(ranks) < 2:
        return None
    by_param: dict[int, list[int]] = {}
    for r, rec in enumerate(ranks):
        for i in rec.steps[k].state_stepped:
            by_param.setdefault(i, []).append(r)
    twice = {i: rs for i, rs in sorted(by_param.items()) if len(rs) > 1}
    if not twice:
        return None
    i, rs = next(iter(twice.items()))
    return diverge(
        k,
        "memory",
        rs[1],
        f"ranks {rs} each hold and update the optimizer state of parameter {i} "
        f"({len(twice)} of the {len(by_param)} parameters with state stepped here are stepped "
        f"on more than one rank): a sharded optimizer keeps each parameter's state on one rank",
        len(rs),
        1,
        index=i,
    )


def _zero(k, ranks, facts: CaseFacts, stateful) -> Divergence | None:
    if ranks[0].pieces is None:
        return None
    e = facts.state_esize[facts.trainable[0]]
    for r, rec in enumerate(ranks):
        pieces = [Piece(i, s, n, 0, 0) for i, s, n in rec.pieces]
        expected = flat_state_bytes(pieces, element_size=e, models=facts.models, stateful=stateful)
        got = rec.steps[k].state_bytes
        if got != expected:
            return diverge(
                k,
                "memory",
                r,
                f"rank {r} holds {got} bytes of optimizer state; its pieces give "
                f"{expected} (parameters with state {sorted(stateful)})",
                got,
                expected,
            )
    return None
