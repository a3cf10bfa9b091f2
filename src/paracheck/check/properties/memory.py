"""The ``memory`` property (sharding kinds): each rank holds exactly the optimizer-state bytes its
declared partition implies: the state *is* sharded, and as declared.

Reads from each ``RankRecord``, per ``RankStep``, ``state_bytes`` (what the rank's innermost
optimizer holds) and the declared partition: ``owners`` per step (``sharded``, and every rank must
declare rank 0's: a ``balance`` divergence otherwise) or ``pieces`` (``zero``). Compares with
``paracheck.accounting.memory``'s model of those parameters' state (``sharded_state_bytes``,
``flat_state_bytes``), for the parameters that have state in the oracle at that step. A target
that declares no partition is not judged.
"""

from __future__ import annotations

from paracheck.accounting.memory import flat_state_bytes, sharded_state_bytes
from paracheck.cases import Case
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
        d = (_zero if kind in ("zero", "zero2") else _sharded)(k, ranks, facts, stateful)
        if d is not None:
            return d
    return None


def _sharded(k, ranks, facts: CaseFacts, stateful) -> Divergence | None:
    owners = ranks[0].steps[k].owners
    if owners is None:
        return None
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
