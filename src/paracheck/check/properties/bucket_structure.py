"""The ``bucket-structure`` property (DDP targets that take ``bucket_size_mb``): a target reduces
its gradients in buckets that respect the cap.

Reads from each ``RankRecord``, per ``RankStep``, the synchronisation ``windows``: the all-reduce
calls the rank issued in each (``paracheck.accounting.record_collectives``: one payload size per
call, recorded by ``paracheck.check.ranks._common.train_micro_steps``), its synchronised backward
passes and whether every gradient was present. Compares with bounds computed from the case alone
(the cap, the trainable parameters' bytes; Note [Bucket-structure rules]), not with the oracle.

The equivalence check already proves that the gradients come out right; this property catches
the designs whose gradients are right but whose buckets are not: the cap ignored (one bucket
always), or read in the wrong unit ("MB compared with bytes": every parameter alone, at a cap
meant to hold many).

Note [Bucket-structure rules]
    Notation, per rank and per synchronisation window with one synchronised backward: C the cap
    in bytes (``bucket_size_mb * 2**20``; infinite for ``bucket_size_mb=None``), T the bytes of
    the trainable gradients, L the largest trainable parameter's bytes, n the number of trainable
    parameters, P the sum of the all-reduce payloads, m the number of all-reduce calls. Metadata
    allowance A = 8 n bytes: room for one presence flag per parameter of up to 8 bytes, whether
    in the buckets (``BucketedDDP`` appends one per parameter) or in calls of their own.

    Two packings are read as respecting the cap: a bucket closed before the parameter that would
    take it above C (greedy; a parameter larger than C alone), and a bucket closed as soon as it
    reaches C, with the parameter that took it there (torch DDP's own reading of
    ``bucket_cap_mb``, and a common hand-written loop): it held less than C before its last
    parameter, so it holds less than C + L; a greedy bucket holds at most max(C, L) < C + L.

    1. No payload of C + L + A or more: less than C + L of gradients, plus at most every flag.
    2. P <= T + A: no gradient is reduced twice in one window.
    3. Where every trainable gradient is present on this rank after the window (then every
       correct design reduces every one of them) and P >= T (every gradient byte was seen by the
       recorder): m >= floor(T / (C + L)) + 1, since no bucket of either packing reaches C + L.
    4. m <= sum over runs of (2 ceil(T_run / C) - 1), + 1, a run being a maximal sequence of
       trainable parameters of one dtype in registration order. Greedy packing (in registration
       order or reversed) closes a bucket only when the next parameter would take it above C, so
       any two consecutive buckets of a run hold more than C together (a bucket closed on
       reaching C holds C or more on its own, so the same holds): k buckets have floor(k/2)
       disjoint such pairs, floor(k/2) C < T_run, so floor(k/2) <= ceil(T_run / C) - 1 and
       k <= 2 ceil(T_run / C) - 1. A parameter larger than C, alone, is one of such a pair;
       buckets per dtype across the whole model, first-fit, or any packing with fewer buckets stay
       below; the + 1 is one call of metadata (flags sent on their own). An unbounded cap counts
       ceil(T_run / C) as 1.
    5. At most r + 2 pairs of consecutive calls whose payloads sum to C or less, r the number of
       runs. Greedy packing launches its buckets in plan order (every rank must issue the same
       sequence), and two consecutive buckets of one run hold more than C together (rule 4), so
       their payloads (gradients plus flags) do too. A pair may sum to C or less only across a
       dtype boundary (at most r - 1 of them), next to a call of metadata of its own (at most 2
       pairs), or after a first bucket capped smaller on purpose (torch DDP's 1 MB first bucket):
       r + 2 in all. Every parameter alone under a cap that holds several gives n - 1 such pairs.

    A window holds the all-reduces that can carry gradients: a reduction by max, min, product or
    a bitwise operation cannot average one, so it is an agreement between the ranks (a flag that
    says whether to redo a bucket, an overflow, a count) and is not in the window
    (``CollectiveCall.is_control``). A design may send such agreements freely; a flag sent by
    sum counts as metadata within A.

    Every rule reads only what the recorder saw. The recorder is a dispatch mode, so it sees calls
    issued from C++ (torch DDP's reducer) and through functions bound before recording (``from
    torch.distributed import all_reduce``); a coalesced group (``_coalescing_manager``) is one
    message, as the backend receives it. Collectives it could still miss (a backend called
    outside torch's dispatcher) only lower P and m: rules 1, 2 and 4 cannot fail because of
    them, and rule 3 is gated on P >= T. Windows with several synchronised backward
    passes (``finish_once``, ``double_backward``) are judged by rule 1 only: a correct design may
    reduce once per backward or once per window. World size 1 is not judged (nothing needs to be
    sent).
"""

from __future__ import annotations

import math

from paracheck.cases import Case, build_case_model
from paracheck.check.properties._divergence import Divergence
from paracheck.check.ranks.record import RankRecord

__all__ = ["METADATA_BYTES_PER_PARAM", "check_bucket_structure", "window_violation"]

METADATA_BYTES_PER_PARAM = 8  # one presence flag of up to 8 bytes per trainable parameter
MB = 2**20


def _trainable(case: Case) -> list[tuple[int, str]]:
    """(bytes, dtype) of each trainable parameter, in registration order."""
    model = build_case_model(case, 0)
    return [
        (p.numel() * p.element_size(), str(p.dtype)) for p in model.parameters() if p.requires_grad
    ]


def _runs(params: list[tuple[int, str]]) -> list[int]:
    runs: list[int] = []
    last = None
    for nbytes, dtype in params:
        if dtype != last:
            runs.append(0)
            last = dtype
        runs[-1] += nbytes
    return runs


def _ceil(x: float, cap: float) -> int:
    return 1 if math.isinf(cap) else math.ceil(x / cap)


def window_violation(
    payloads: list[int],
    params: list[tuple[int, str]],
    cap: float,
    *,
    backwards: int = 1,
    all_present: bool = True,
) -> tuple[float, float, str] | None:
    """The first rule of Note [Bucket-structure rules] that one window breaks, as (observed, bound,
    why), or None. ``payloads``: the all-reduce payload bytes of the window, in call order;
    ``params``: (bytes, dtype) of each trainable parameter in registration order; ``cap`` in
    bytes (``math.inf``: unbounded)."""
    if not payloads or not params:
        return None
    total = sum(b for b, _ in params)
    largest = max(b for b, _ in params)
    allowance = METADATA_BYTES_PER_PARAM * len(params)
    limit = cap + largest + allowance
    if max(payloads) >= limit:
        return (
            max(payloads),
            limit,
            (
                f"an all-reduce carries cap + largest parameter + {allowance} bytes of "
                "presence flags or more"
            ),
        )
    if backwards != 1:
        return None
    sent = sum(payloads)
    if sent > total + allowance:
        return (
            sent,
            total + allowance,
            (
                "more bytes all-reduced than the trainable gradients plus their presence "
                "flags: some gradient was reduced twice, or in a wider dtype than its own"
            ),
        )
    min_calls = 1 if math.isinf(cap) else math.floor(total / (cap + largest)) + 1
    if all_present and sent >= total and len(payloads) < min_calls:
        return (
            len(payloads),
            min_calls,
            (
                f"{len(payloads)} all-reduce calls, fewer than the {min_calls} buckets "
                "that a cap-respecting packing needs (is the cap ignored?)"
            ),
        )
    max_calls = sum(2 * _ceil(r, cap) - 1 for r in _runs(params)) + 1
    if len(payloads) > max_calls:
        return (
            len(payloads),
            max_calls,
            (
                f"{len(payloads)} all-reduce calls, more than the {max_calls} that greedy "
                "packing under the cap can make (cap read in the wrong unit?)"
            ),
        )
    runs = len(_runs(params))
    mergeable = sum(a + b <= cap for a, b in zip(payloads, payloads[1:]))
    if mergeable > runs + 2:
        return (
            mergeable,
            runs + 2,
            (
                f"{mergeable} pairs of consecutive all-reduces fit in one bucket together, "
                f"more than the {runs + 2} that greedy packing leaves (cap read in the wrong unit?)"
            ),
        )
    return None


def check_bucket_structure(case: Case, ranks: list[RankRecord]) -> Divergence | None:
    """The first window on any rank that breaks Note [Bucket-structure rules], as a Divergence
    with ``what="bucket-structure"``, or None."""
    if case.world_size < 2:
        return None
    params = _trainable(case)
    # What the rank program passed (paracheck.check.ranks._drive): None (one bucket) or the cap.
    cap = math.inf if case.unbounded_bucket else case.bucket_mb * MB
    cap_text = "None (unbounded)" if math.isinf(cap) else f"{cap:.0f} bytes"
    for r, rec in enumerate(ranks):
        for k, step in enumerate(rec.steps):
            for window in step.windows:
                payloads = [b for name, b in window.calls if name == "all_reduce"]
                found = window_violation(
                    payloads,
                    params,
                    cap,
                    backwards=window.backwards,
                    all_present=window.all_present,
                )
                if found is not None:
                    value, bound, why = found
                    return Divergence(
                        k,
                        "bucket-structure",
                        r,
                        None,
                        None,
                        float(value),
                        float(bound),
                        f"{why}; cap {cap_text}, trainable gradients {sum(b for b, _ in params)} "
                        f"bytes in {len(params)} parameters (largest {max(b for b, _ in params)}); "
                        f"all-reduce payloads in this synchronisation: {payloads}",
                    )
    return None
