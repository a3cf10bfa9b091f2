"""The ``state`` property (and the opt-in ``state-consolidated``): the optimizer state the ranks'
``state_dict()`` return equals the oracle's after every step.

Reads from each ``RankRecord``, per ``RankStep``, ``state`` (by parameter index; None where the
rank could not read its ``state_dict()``, ``state_read`` saying why). Compares the union over
ranks with the oracle's ``StepRecord.state`` within the tolerance policy's ``state`` tolerance
(``paracheck.oracle.tolerance``); ``state-consolidated`` asks every rank for every parameter's
state.

Note [State dict conventions]
    Nothing in the CS336 interface asks ``state_dict()`` to consolidate. Two readings are
    accepted: *consolidated* (every rank returns every parameter's state) and *per-rank shards*
    (a rank returns the state of the parameters it owns, as ``torch.optim.Optimizer.state_dict()``
    does on a wrapper that keeps its shard in ``self.state``; several ranks may return the same
    parameter's state if they return it identically). Indices name the wrapper's
    ``param_groups`` (torch's convention), or, failing that, the wrapped optimizer's groups
    (a wrapper that returns its ``local_optimizer.state_dict()``). A dict with no parameter's
    state (``{}``, or an empty ``state`` whatever its ``param_groups``) is an empty shard, valid
    as it is: a rank that owns no parameter may keep no wrapped optimizer whose groups its dict
    could name. The ``state`` property checks the union over ranks; ``state-consolidated``
    (opt-in) asks every rank for everything, which is what loading the dict at another world size
    needs (``paracheck.check.ranks.reload``): a per-rank-shards dict can only be loaded back at
    the same world size, by the same rank.
"""

from __future__ import annotations

import torch

from paracheck.check.properties._case import param_names
from paracheck.check.properties._divergence import Divergence, diverge
from paracheck.check.properties.closeness import close
from paracheck.check.properties.equivalence import state_rtol_of, state_terms
from paracheck.check.ranks.record import RankRecord
from paracheck.oracle.tolerance import anchored, state_tolerance

__all__ = [
    "STATE_CONSOLIDATED",
    "STATE_SHARDS",
    "check_state",
    "compare_state_union",
    "sharding_notes",
    "state_convention",
]


STATE_CONSOLIDATED = "consolidated"
STATE_SHARDS = "per-rank shards"


def state_convention(states: list[dict], ref_state: dict) -> str | None:
    """How ranks returned the optimizer state of one step: ``"consolidated"`` (every rank holds every
    parameter's state), ``"per-rank shards"`` (some rank holds only part), None when the oracle has
    no state to tell them apart (or one rank: both at once)."""
    ref = {i for i, st in ref_state.items() if st}
    if not ref or len(states) == 1:
        return None
    return (
        STATE_CONSOLIDATED
        if all({i for i, st in s.items() if st} >= ref for s in states)
        else STATE_SHARDS
    )


def compare_state_union(
    k: int, states: list[dict], ref_state: dict, rtol, names: list[str], terms=None
) -> Divergence | None:
    """The optimizer state of step ``k`` held across ranks against the oracle's: the union over
    ranks must have state for exactly the oracle's parameters, each within ``rtol`` of it, and ranks
    that return the same parameter's state must return it bitwise identical. Accepts per-rank shards
    (each parameter's state on its owner, or identically on several ranks) and consolidated state.
    An empty state entry (a touched ``defaultdict``) counts as no state, on either side.
    ``rtol``: a number, or parameter index -> number (``state_rtol_of``). ``terms(i, key)``: the
    scale source of each comparison (Note [Terms of an update];
    ``paracheck.check.properties.equivalence.state_terms``), None: the oracle's value."""
    ref_state = {i: st for i, st in ref_state.items() if st}
    states = [{i: st for i, st in s.items() if st} for s in states]
    holders: dict[int, list[int]] = {}
    for r, st in enumerate(states):
        for i in st:
            holders.setdefault(i, []).append(r)
    missing = sorted(set(ref_state) - set(holders))
    extra = sorted(set(holders) - set(ref_state))
    if missing or extra:
        i = (missing or extra)[0]
        return Divergence(
            k,
            "state",
            (holders.get(i) or [0])[0],
            i,
            names[i] if i < len(names) else None,
            float("inf"),
            0.0,
            f"optimizer state for parameters {missing} is on no rank "
            f"(union of every rank's state_dict()), for {extra} on some rank but not in the oracle",
        )
    for i, rs in sorted(holders.items()):
        first = states[rs[0]][i]
        for r in rs[1:]:
            other = states[r][i]
            if set(other) != set(first) or any(
                not torch.equal(other[key], first[key]) for key in first
            ):
                diff = max(
                    (
                        float((other[key].double() - first[key].double()).abs().max())
                        for key in first
                        if key in other and other[key].shape == first[key].shape
                    ),
                    default=float("inf"),
                )
                return Divergence(
                    k,
                    "state",
                    r,
                    i,
                    names[i] if i < len(names) else None,
                    diff,
                    0.0,
                    f"ranks {rs[0]} and {r} return different optimizer state for this parameter "
                    f"(keys {sorted(first)} / {sorted(other)}): ranks that return a parameter's "
                    f"state must return the same",
                )
    for i, rs in sorted(holders.items()):
        for key, ref in ref_state[i].items():
            got = states[rs[0]][i].get(key)
            if got is None:
                return Divergence(
                    k, "state", rs[0], i, names[i], float("inf"), 0.0, f"state key {key!r} missing"
                )
            got = got.reshape(ref.shape) if got.numel() == ref.numel() else got
            tol = rtol(i) if callable(rtol) else rtol
            ok, diff, allowed, ratio = close(got, ref, tol, terms and terms(i, key))
            if not ok:
                return Divergence(
                    k, "state", rs[0], i, names[i], diff, allowed, f"state {key!r}.", ratio
                )
    return None


def check_state(
    case, traj, ranks: list[RankRecord], props, same_operations: bool = True
) -> Divergence | None:
    """``state`` (the union over ranks, Note [State dict conventions]) and ``state-consolidated``;
    ``same_operations``: the ranks run on the CPU, as the oracle (``state_tolerance``)."""
    names = param_names(case)
    rtol = state_tolerance(case, same_operations)
    # As the equivalence comparison judges the gradients (paracheck.check.run): anchored below
    # float32, the derived bound on the CPU.
    where = dict(anchored=anchored(case), bound=same_operations, same_operations=same_operations)
    if any(len(rec.steps) != len(traj.steps) for rec in ranks):
        return None  # the structure divergence is paracheck.check.compare's
    for k, oref in enumerate(traj.steps):
        states = []
        for r, rec in enumerate(ranks):
            step = rec.steps[k]
            if step.state is None:
                return diverge(
                    k,
                    "state",
                    r,
                    f"rank {r}'s state_dict() cannot be read: {step.state_read}",
                )
            states.append(step.state)
        d = compare_state_union(
            k,
            states,
            oref.state,
            lambda i, k=k: state_rtol_of(traj, k, i, rtol, **where),
            names,
            state_terms(traj, k),
        )
        if d is not None:
            return d
        if "state-consolidated" in props:
            for r, st in enumerate(states):
                missing = sorted(
                    {i for i, v in oref.state.items() if v} - {i for i, v in st.items() if v}
                )
                if missing:
                    return diverge(
                        k,
                        "state-consolidated",
                        r,
                        f"rank {r}'s state_dict() has no state for parameters {missing} (it holds "
                        f"{sorted(st)}): state-consolidated asks every rank for every parameter's state",
                        index=missing[0],
                        name=names[missing[0]],
                    )
    return None


def sharding_notes(traj, ranks: list[RankRecord]) -> dict:
    """What a report says about how the target met the interface: ``{"state_dict": convention}``
    (Note [State dict conventions]; "consolidated", "per-rank shards", or "no optimizer state to
    tell" when no step had any), or ``{"skipped": why}`` for a case the target cannot run."""
    skipped = next((rec.skipped for rec in ranks if rec.skipped is not None), None)
    if skipped is not None:
        return {"skipped": skipped}
    seen = set()
    for k, oref in enumerate(traj.steps):
        states = [rec.steps[k].state for rec in ranks if k < len(rec.steps)]
        if len(states) == len(ranks) and all(st is not None for st in states):
            seen.add(state_convention(states, oref.state))
    seen.discard(None)
    if not seen:
        return {"state_dict": "no optimizer state to tell" if len(ranks) > 1 else "one rank"}
    return {"state_dict": "per-rank shards" if "per-rank shards" in seen else "consolidated"}
