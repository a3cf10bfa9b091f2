"""The ``traffic`` property (sharding kinds): each rank's collectives per step equal the analytic
communication model exactly (``paracheck.accounting.traffic``).

Reads from each ``RankRecord``, per ``RankStep``, ``traffic`` (the collectives the step issued, as
``StepTraffic.entries``: for ``sharded`` the optimizer's ``step()`` only, for ``zero`` its gradient
synchronisation too). Compares with the owner-broadcast model over the trainable parameters in
the optimizer at that step (``sharded``), or the ZeRO-1 model of the case's flat layout, with one
synchronisation per micro-step (one with ``no_sync``) (``zero``). A step the GradScaler skipped
(``StepRecord.skipped``) never calls ``step()``: the model for it is no collective at all.

Note [Traffic judges a declared design]
    The models are those of paracheck's own designs: one broadcast per trainable parameter from
    its owner, or one reduce-scatter and one all-gather per bucket of the flat layout. A design
    that is correct by the interface can communicate otherwise: broadcast its frozen parameters
    too (anything that loops over ``param_groups``), coalesce a rank's parameters into one
    broadcast, all-gather flat shards, lay its buckets out its own way, or agree on a flag with an
    extra small collective. Exact traffic is a property of a *declared* design, like ``balance``
    and ``memory``: it is judged only for a target that declares its partition (``partition``
    with ``owners``, or ``pieces`` and ``layout``), as the built-in designs and adapters do. A
    target that declares none is not judged (and no mutant is seen by this property alone: the
    bugs that train correctly are caught by ``balance`` and ``memory``).
"""

from __future__ import annotations

from paracheck.accounting.traffic import StepTraffic, owner_broadcast_traffic, zero1_traffic
from paracheck.cases import Case
from paracheck.check.kinds import KINDS
from paracheck.check.properties._divergence import Divergence, diverge
from paracheck.check.properties._sharding import CaseFacts, declares_partition
from paracheck.check.ranks.record import RankRecord
from paracheck.zero.partition import flat_layout

__all__ = ["check_traffic"]


def check_traffic(case: Case, traj, ranks: list[RankRecord], kind: str) -> Divergence | None:
    """The first step and rank whose collectives differ from the model, or None."""
    facts = CaseFacts.of(case)
    W = case.world_size
    if not declares_partition(ranks):
        return None  # Note [Traffic judges a declared design]
    for k in range(len(traj.steps)):
        if KINDS[kind].state_layout == "flat":
            params, e = facts.params, facts.params[facts.trainable[0]].element_size()
            bucket = case.bucket_mb
            layout = flat_layout(
                [params[i].numel() for i in facts.trainable],
                W,
                bucket_numel=max(1, int(bucket * 2**20) // e),
            )
            expected = zero1_traffic(layout, e, syncs=1 if case.no_sync else case.accumulation)
            model = "the ZeRO-1 model"
        elif traj.steps[k].skipped:
            expected = StepTraffic(())
            model = "a step the GradScaler skipped (step() is not called)"
        else:
            in_opt = facts.in_optimizer(k)
            expected = owner_broadcast_traffic(
                [facts.nbytes[i] for i in in_opt if facts.params[i].requires_grad], W
            )
            model = "the owner-broadcast model"
        for r, rec in enumerate(ranks):
            got = StepTraffic(tuple(tuple(e) for e in rec.steps[k].traffic))
            if got != expected:
                return diverge(
                    k,
                    "traffic",
                    r,
                    f"rank {r}'s step issued {got.as_dict()}; {model} gives "
                    f"{expected.as_dict()} (name: (calls, payload bytes))",
                    got.payload_bytes,
                    expected.payload_bytes,
                )
    return None
