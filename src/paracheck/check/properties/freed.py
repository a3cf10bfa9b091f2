"""The ``freed`` property (fsdp): no parameter a step gathered is still held whole once the step's
gradients are synchronised.

Reads from each ``RankRecord``, per ``RankStep``, ``gathered``: how many storages of the step's
all-gathers still held bytes after its last ``finish`` (``paracheck.check.ranks.fsdp.GatherWatch``).

Note [Gathered parameters die with the step]
    A fully sharded design gathers a layer's parameters to use them and frees them after: at the
    end of the forward of the layer or of the model, and again after backward. Once the step's
    gradients are synchronised nothing needs a whole parameter until the next forward, so a
    gathered storage still holding bytes then is memory a correct design does not hold: the
    "gathered weights never freed" bug, whose values are right and whose memory is ZeRO-2's.

    What is watched: the full tensor of every floating-point all-gather dispatched during the
    step's forward and backward passes (the output of ``all_gather_into_tensor``, whichever the
    larger side of the call); integer and byte gathers (sizes, ``all_gather_object``) carry
    metadata a design may keep. A storage counts as freed when nothing references it, or when it
    was resized to zero bytes (torch's ``fully_shard`` frees its unsharded parameters that way);
    a count above zero is settled first (Note [Settling a count of live storages] in
    ``paracheck.check.ranks.fsdp``: the backend's threads may hold a finished work briefly).
    A design that all-gathers into a buffer, copies out into storages of its own and keeps those
    is not seen here. World size 1 is not judged (a design may skip the all-gather there).
"""

from __future__ import annotations

from paracheck.cases import Case
from paracheck.check.properties._divergence import Divergence, diverge
from paracheck.check.ranks.record import RankRecord

__all__ = ["check_freed"]


def check_freed(case: Case, traj, ranks: list[RankRecord], kind: str) -> Divergence | None:
    """The first step and rank that still holds a gathered storage after its backward, or None."""
    if case.world_size == 1:
        return None
    for k in range(len(traj.steps)):
        for r, rec in enumerate(ranks):
            gathered = rec.steps[k].gathered
            if gathered is not None and gathered[0]:
                count, nbytes = gathered
                return diverge(
                    k,
                    "freed",
                    r,
                    f"rank {r} still holds {count} gathered storage(s), {nbytes} bytes, after "
                    "the step's gradients were synchronised: whole parameters are kept after use",
                    nbytes,
                    0,
                )
    return None
