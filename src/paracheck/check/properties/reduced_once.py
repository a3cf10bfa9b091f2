"""The ``reduced-once`` property (fsdp): no gradient is communicated more than once per
synchronised backward, and none inside ``no_sync()``.

Reads from each ``RankRecord``, per ``RankStep``, the synchronisation ``windows`` (recorded by
``paracheck.check.ranks._common.train_micro_steps``: every collective from a window's first
forward to its ``finish``, and how many of its backward passes were synchronised). Compares the
bytes of the reducing collectives with a bound computed from the case alone, not with the oracle.

The equivalence check proves the gradients right; this property catches the designs whose
gradients are right but which pay for them twice: a tied weight reduce-scattered at each of its
uses, or a reduce-scatter issued inside ``no_sync()`` (which exists to save exactly that).

Note [A bound on the gradient bytes an FSDP reduces]
    Per rank and window with b synchronised backward passes, let P be the payload bytes of its
    ``reduce_scatter``, ``all_reduce`` and ``reduce`` calls (a reduce-scatter's payload is its
    full input, Note [Exact quantities] in ``paracheck.accounting.record``). A correct design
    reduces each trainable parameter's gradient at most once per synchronised backward (once per
    window is enough), and nothing inside ``no_sync()``: P <= b * (G + A), where

    * G = sum over the parameters (each once: a tied weight is one parameter) of its elements
      padded as the roomiest common layout pads them: dim 0 rounded up to a multiple of W
      (torch's ``fully_shard``, ``Shard(0)``), ``ceil(d0 / W) * W * numel / d0`` elements, which is
      at least the flat layout's ``ceil(numel / W) * W`` and at least a replicated parameter's
      ``numel`` (all-reduced whole); one flat buffer per module or per model pads less. Each
      element counts ``max(element_size, 4)`` bytes: a design may reduce bfloat16 or float16
      gradients in float32 (the usual reduce dtype). Frozen parameters count too: a flat buffer
      that holds frozen and trainable parameters together (torch's FSDP1 flat parameters) reduces
      the frozen ones' zeros with the rest, which costs bytes but is no error;
    * A = 16 n bytes, n the number of parameters: room for one presence flag or count per
      parameter of up to 8 bytes, sent with the gradients or on their own, or for aligning each
      parameter to 16 bytes inside a flat buffer (torch's FSDP1 flat parameters do).

    A tied weight reduced at each of its two uses adds its padded bytes once more: it passes the
    bound once it outweighs the slack G - G' + A of the case, where G' is what the design
    actually sends; the strategies draw cases where it does. Inside ``no_sync()`` the rule is
    exact: no reducing collective at all (its whole point is to send no gradient). World size 1
    is not judged (nothing needs to be sent).
"""

from __future__ import annotations

import math

from paracheck.cases import Case
from paracheck.check.properties._divergence import Divergence, diverge
from paracheck.check.properties._sharding import CaseFacts
from paracheck.check.ranks.record import RankRecord

__all__ = ["REDUCING", "check_reduced_once", "gradient_bound"]

REDUCING = frozenset({"reduce_scatter", "all_reduce", "reduce"})


def gradient_bound(case: Case) -> int:
    """G + A of Note [A bound on the gradient bytes an FSDP reduces], in bytes."""
    facts, W = CaseFacts.of(case), case.world_size
    padded = 0
    for i, p in enumerate(facts.params):
        d0 = p.shape[0] if p.dim() else 1
        padded += math.ceil(d0 / W) * W * (p.numel() // max(d0, 1)) * max(facts.esize[i], 4)
    return padded + 16 * len(facts.params)


def check_reduced_once(case: Case, traj, ranks: list[RankRecord], kind: str) -> Divergence | None:
    """The first step and rank whose window reduced more than its bound, or None."""
    if case.world_size == 1:
        return None
    bound = gradient_bound(case)
    for k in range(len(traj.steps)):
        for r, rec in enumerate(ranks):
            for w, window in enumerate(rec.steps[k].windows):
                inside = [(name, b) for name, b in window.in_no_sync if name in REDUCING]
                if inside:
                    return diverge(
                        k,
                        "reduced-once",
                        r,
                        f"rank {r} issued {len(inside)} reducing collective(s) of "
                        f"{sum(b for _, b in inside)} bytes inside no_sync() in synchronisation "
                        f"window {w} ({inside[0][0]} first): no_sync() must send no gradient",
                        sum(b for _, b in inside),
                        0,
                    )
                calls = [(name, b) for name, b in window.calls if name in REDUCING]
                sent = sum(b for _, b in calls)
                allowed = window.backwards * bound
                if sent > allowed:
                    return diverge(
                        k,
                        "reduced-once",
                        r,
                        f"rank {r}'s synchronisation window {w} reduced {sent} bytes in "
                        f"{len(calls)} calls for {window.backwards} synchronised backward(s); "
                        f"reducing every gradient once per synchronised backward, padded, "
                        f"sends at most {allowed} (a gradient reduced twice, or inside "
                        "no_sync())",
                        sent,
                        allowed,
                    )
    return None
