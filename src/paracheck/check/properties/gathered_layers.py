"""The ``gathered-layers`` property (fsdp, for a wrapper built with a prefetch depth): no more
modules' parameters are gathered at once than the depth allows.

Reads ``RankRecord.prefetch`` (the ``prefetch=k`` the wrapper was built with; None: its
constructor takes no such keyword, and nothing is judged) and, per ``RankStep``,
``peak_gathered`` (``paracheck.check.ranks.fsdp.GatherWatch``).

Note [Gathered layers and the prefetch depth]
    Prefetching gathers the next modules' parameters while the current one computes; what it
    costs is memory: with depth k, k + 1 modules' full parameters are alive at once, and a
    design that gathers further ahead than it declares (or never frees what it prefetched)
    holds more than the memory it was sized for. Measured by storage lifetimes, not by peak
    memory: every floating-point all-gather's full tensor is watched (as for ``freed``), and as
    each is dispatched the watched storages still alive with bytes are counted, the new one
    included; the step's largest count is its peak (a count above k + 1 is settled first: Note
    [Settling a count of live storages] in ``paracheck.check.ranks.fsdp``). The bound, for every step and rank at world
    size >= 2:

        peak <= (k + 1) * P

    where P is the most parameters that the wrapper may gather one module of the case's model
    owns directly, with its children's where it owns one such itself (``gather_units``: Note [A
    module reads its children's parameters] in ``paracheck.fsdp``; no module of the generated
    models does) (a design may gather a module's weight and bias in one all-gather or in one
    each): every parameter but those every rank provably holds whole after the last step
    (``paracheck.check.ranks.fsdp.kept_whole``: still the module's own tensor, every element
    and byte of it; a 1-element parameter always counts, its shard looks whole). The
    reference replicates biases, so P is 1 on the MLP and the bound is exact; a design that
    shards everything gets P = 2 on a layer with a bias, and a bound loose by up to that
    factor. Backward counts too: a
    design that keeps every forward's gathered parameter until its backward (no resharding
    after forward) holds them all at once. World size 1 is not judged (a design may skip the
    all-gather there).
"""

from __future__ import annotations

from torch import nn

from paracheck.cases import Case, build_case_model
from paracheck.check.properties._divergence import Divergence, diverge
from paracheck.check.ranks.record import RankRecord
from paracheck.fsdp import gather_units

__all__ = ["check_gathered_layers", "most_parameters_per_module"]


def most_parameters_per_module(case: Case, whole=None) -> int:
    """P of Note [Gathered layers and the prefetch depth]: the most parameters one module of the
    case's model owns directly, leaving out those ``whole`` (per parameter, in ``parameters()``
    order; None: none) marks as held whole; at least 1."""
    model = build_case_model(case, rank=0)
    index = {id(p): i for i, p in enumerate(model.parameters())}
    kept = set() if whole is None else {i for i, w in enumerate(whole) if w}
    # A module and the children it may read without calling them, where it shards a parameter.
    units = gather_units(model, lambda p: index[id(p)] not in kept)
    owned: dict[nn.Module, set[int]] = {}
    for m in model.modules():
        for p in m._parameters.values():
            if p is not None and index[id(p)] not in kept:
                owned.setdefault(units[m], set()).add(index[id(p)])
    return max([1, *map(len, owned.values())])


def check_gathered_layers(
    case: Case, traj, ranks: list[RankRecord], kind: str
) -> Divergence | None:
    """The first step and rank whose peak of gathered storages passes the bound, or None."""
    depth = ranks[0].prefetch if ranks else None
    if depth is None or case.world_size == 1:
        return None
    marks = [rec.kept_whole for rec in ranks]
    whole = None
    if all(m is not None for m in marks):  # held whole on every rank
        whole = [all(ws) for ws in zip(*marks)]
    per_module = most_parameters_per_module(case, whole)
    bound = (depth + 1) * per_module
    for k in range(len(traj.steps)):
        for r, rec in enumerate(ranks):
            peak = rec.steps[k].peak_gathered
            if peak is not None and peak > bound:
                return diverge(
                    k,
                    "gathered-layers",
                    r,
                    f"rank {r} held {peak} gathered storages at once, where prefetch={depth} "
                    f"allows {depth + 1} modules' parameters ({per_module} per module at most): "
                    "gathered further ahead than declared, or kept after use",
                    peak,
                    bound,
                )
    return None
