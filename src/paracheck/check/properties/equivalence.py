"""The equivalence family of properties: every rank's recorded trajectory equals the oracle's, and
ranks agree with each other.

Reads from each ``RankRecord``: ``initial_params`` and ``initial_buffers`` (equal to the
oracle's, bitwise: ``initial-state``), and per ``RankStep`` the synchronised ``grads`` (where the
kind records them: ``gradients``), the ``params`` after the step (``parameters``, and bitwise
across ranks: ``rank-agreement``) and, for the sharding kinds, each rank's ``state``
(``optimizer-state``; the union over ranks is ``paracheck.check.properties.state``'s). Compares
with the oracle's ``Trajectory`` under the tolerance policy (``paracheck.oracle.tolerance``).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator

import torch

from paracheck.check.properties._divergence import Divergence
from paracheck.check.properties.closeness import close, update_terms, worst_element, wrong_how
from paracheck.check.ranks.record import RankRecord
from paracheck.oracle import Trajectory
from paracheck.oracle.tolerance import (
    UNIT_ROUNDOFF,
    master_rtol,
    rounding_bracket,
    state_tolerance,
    step0_grad_rtol,
    tensor_tolerance,
    update_rtol,
)

__all__ = [
    "by_the_oracles_operations",
    "compare",
    "grad_rtol",
    "state_rtol_of",
    "state_terms",
]


def by_the_oracles_operations(device: str | None, *, derived: bool) -> bool:
    """Whether the ranks compute their local gradients by the oracle's operations: on the CPU, and
    not in a user's loop, which computes its loss its own way (``derived=False``: under autocast
    its gradients round at the compute dtype from step 0, wherever it runs; Note [Autocast])."""
    return derived and (device is None or torch.device(device).type == "cpu")


def compare(
    traj: Trajectory,
    ranks: list[RankRecord],
    names: list[str],
    *,
    check_state: bool = False,
    device: str | None = None,
    anchored: bool = False,
    derived: bool = True,
    judged_from: dict[int, int] | None = None,
) -> tuple[Divergence | None, float]:
    """The first divergence from the oracle (or None) and the worst relative error seen (for margin
    reports). Only the first step that diverges is meaningful: everything the ranks compute after
    it starts from a state the oracle never had (a gradient wrong at step k makes the parameters
    wrong after it), so the properties of the equivalence family (initial state, gradients,
    parameters, optimizer state, rank agreement) fail one per case. The first divergence carries
    the other tensors of its kind at its step that diverged another way (Note [Every way a step
    diverged]); a target's other bugs show on other cases, which the verdict table searches for
    row by row.

    ``anchored``: ``traj`` is the oracle anchored on rank 0's steps (Note [Anchored steps]), and
    every step is judged at step 0's tolerances. ``derived=False``: the ranks do not compute their
    local gradients by the oracle's operations (a user's loop), and no gradient is judged at the
    derived step-0 bound. Where ``traj`` applied each step to the gradients rank 0 recorded, the
    parameters are judged at Note [Comparing an update]'s bound whatever ``derived`` says.

    ``judged_from``: parameter index -> the first step whose gradient is judged (a ZeRO wrapper
    synchronises the gradients of the parameters its groups hold; one whose group is added at
    step k is judged from step k, Note [Gradients outside the groups] in
    ``paracheck.check.run``). Parameters are judged at every step.
    """
    dtypes = [str(p.dtype).removeprefix("torch.") for p in traj.initial_params]
    # The oracle trains on the CPU: ranks elsewhere run other kernels (Note [Parameters of two
    # dtypes]).
    same_operations = by_the_oracles_operations(device, derived=derived)
    bound = derived and same_operations
    state_rtol = state_tolerance(traj.case, same_operations)
    where = dict(anchored=anchored, bound=bound, same_operations=same_operations)
    n_elements = sum(p.numel() for p in traj.initial_params)
    worst = 0.0

    def check(step, what, rank, i, got, ref, rtol, scale_src=None, before=None):
        nonlocal worst
        ok, diff, allowed, ratio = close(got, ref, rtol, scale_src)
        if ok:
            worst = max(worst, ratio)
            return None
        detail = ""
        if got is not None and ref is not None and got.shape != ref.shape:
            detail = f"shape {tuple(got.shape)}, expected {tuple(ref.shape)}"
        elif (got is None) != (ref is None):
            detail = f"expected {'no gradient' if ref is None else 'a gradient'}, got {'None' if got is None else 'a tensor'}"
        elif got is not None and not torch.isfinite(got.detach().double()).all():
            detail = "non-finite values"
        elif got is not None and ref is not None:
            detail = worst_element(got, ref, rtol, scale_src) + wrong_how(got, ref, before)
        return Divergence(
            step,
            what,
            rank,
            i,
            names[i] if i is not None and i < len(names) else None,
            diff,
            allowed,
            detail,
            ratio,
        )

    grads = dict(n_elements=n_elements, bound=bound, same_operations=same_operations)

    def grad_divergences(k: int, t: int, r: int) -> Iterator[Divergence]:
        return _grad_divergences(k, t, r, traj, ranks, dtypes, judged_from, check, **grads)

    d = _initial_divergence(traj, ranks, names)
    if d:
        return d, worst
    for k, oref in enumerate(traj.steps):
        t = 0 if anchored else k  # the step whose tolerances apply
        for r, rec in enumerate(ranks):
            step = rec.steps[k]
            # The step's gradients, then its parameters: the first diverging on rank r, with the
            # other ways they diverged on it and the later ranks (Note [Every way a step
            # diverged]).
            d = _first_way(lambda q: grad_divergences(k, t, q), r, len(ranks))
            if d:
                return d, worst
            d = _first_way(
                lambda q: _param_divergences(
                    k, t, q, oref, traj, ranks, dtypes, same_operations, check
                ),
                r,
                len(ranks),
            )
            if d:
                return d, worst
            d = _compare_masters(k, r, step, oref, traj, ranks, check)
            if d:
                return d, worst
            if check_state:
                d = _compare_state(
                    k,
                    r,
                    step.state,
                    oref.state,
                    lambda i, k=k: state_rtol_of(traj, k, i, state_rtol, **where),
                    names,
                    check,
                    state_terms(traj, k),
                )
                if d:
                    return d, worst
        d = _rank_disagreement(k, ranks, names)
        if d:
            return d, worst
    return None, worst


def _grad_divergences(
    k, t, r, traj, ranks, dtypes, judged_from, check, *, n_elements, bound, same_operations
) -> Iterator[Divergence]:
    """Rank ``r``'s diverging gradients of step ``k``, those present or absent where the
    oracle's are not first (Note [Presence first])."""
    step, oref = ranks[r].steps[k], traj.steps[k]
    # A step the GradScaler skipped: its gradients are discarded by every design (and hold inf
    # or nan); the parameters, unchanged, are still compared.
    if step.grads is None or getattr(oref, "skipped", False):
        return
    for i in _presence_first(step.grads, oref.grads):
        got, ref = step.grads[i], oref.grads[i]
        if not _judged(k, i, got, ref, oref, judged_from):
            continue
        d = check(
            k,
            "grad",
            r,
            i,
            got,
            ref,
            step0_grad_rtol(traj.case, dtypes[i], n_elements, _coarsest(dtypes))
            if t == 0 and bound
            else tensor_tolerance(
                traj.case, t, dtypes[i], dtypes, same_operations=same_operations
            ).grads,
            oref.grad_absum[i],
        )
        if d:
            yield d


# Note [Every way a step diverged]
#   One divergence is reported per case (``compare``), but the step it is found at may show two
#   bugs in every case a design draws: a flat DDP that leaves its first weight out of the buffer
#   and sums its biases diverges first on the weight, a wrong value, and its biases, scaled by the
#   world size, were found only in a feature row whose cases happened to diverge first on them;
#   filed there, or after the feature row's own causes, or "as above". So the first divergence of
#   gradients (or of parameters) carries the other tensors of that kind at its step, on its rank
#   and on the later ones, that diverged another way (``Divergence.how``): the first of each way.
#   Each is a reading of the case's failure (``readings`` in ``paracheck.check.verdict``), a cause
#   of its own where it is not known (Note [Causes, not properties] there). Tensors diverging the
#   way the first did add nothing a cause tells apart, and are not kept.
def _first_way(of_rank, r: int, w: int) -> Divergence | None:
    """The first divergence of rank ``r`` (``of_rank(q)`` yields rank q's in order), carrying the
    first of each other way rank ``r``'s rest and the ranks after it diverged, or None."""
    found = of_rank(r)
    first = next(found, None)
    if first is None:
        return None
    return _with_others(first, itertools.chain(found, *(of_rank(q) for q in range(r + 1, w))))


def _with_others(first: Divergence, rest: Iterable[Divergence]) -> Divergence:
    """``first``, carrying the first of ``rest`` to diverge each way it did not."""
    ways, others = {first.how}, []
    for d in rest:
        if d.how not in ways:
            ways.add(d.how)
            others.append(d)
    first.others = tuple(others)
    return first


# Note [Presence first]
#   A step's gradients are judged in two passes: first whether each is present where the
#   oracle's is (a tensor where no rank used the parameter, None where one did), then their
#   values. One divergence is reported per case (``compare``), and a wrong value on the first
#   parameter (a narrower buffer, a wrong weighting: in every case a design draws) would hide a
#   zero gradient given to a parameter no rank used, in every case of the row that draws one:
#   the row failed "as above" with the core's cause. Which gradient is reported first changes
#   no verdict, only which of two bugs of one case is named.
def _presence_first(got: list, ref: list) -> list[int]:
    """The indices of a step's gradients, those whose presence differs from the oracle's first."""
    differ = [i for i, (g, r) in enumerate(zip(got, ref)) if (g is None) != (r is None)]
    rest = set(range(min(len(got), len(ref)))) - set(differ)
    return differ + sorted(rest)


def _judged(k: int, i: int, got, ref, oref, judged_from: dict[int, int] | None) -> bool:
    """Whether parameter ``i``'s gradient of step ``k`` is judged: not before its group is added
    (``judged_from``), nor where the oracle skipped it unreached and the rank holds None or zeros
    (Note [A parameter no rank reached])."""
    if judged_from is not None and k < judged_from.get(i, 0):
        return False
    skipped = ref is None and i in getattr(oref, "unreached", ())
    return not (skipped and (got is None or not bool(got.detach().ne(0).any())))


def _initial_divergence(traj: Trajectory, ranks: list[RankRecord], names: list[str]):
    """The first rank whose steps or parameters do not have the oracle's structure, or whose
    initial parameters or buffers are not exactly the oracle's (or None)."""
    for r, rec in enumerate(ranks):
        if len(rec.steps) != len(traj.steps) or len(rec.initial_params) != len(traj.initial_params):
            return Divergence(
                -1,
                "structure",
                r,
                None,
                None,
                float("inf"),
                0.0,
                f"rank returned {len(rec.steps)} steps / {len(rec.initial_params)} parameters, "
                f"expected {len(traj.steps)} / {len(traj.initial_params)}",
            )
        for i, (got, ref) in enumerate(zip(rec.initial_params, traj.initial_params)):
            if got.shape != ref.shape:
                return Divergence(
                    -1,
                    "structure",
                    r,
                    i,
                    names[i],
                    float("inf"),
                    0.0,
                    f"rank returned parameter {names[i]} of shape {tuple(got.shape)}; the "
                    f"module's is {tuple(ref.shape)} (a wrapper holding shards is read whole "
                    "by the fsdp kind: --kind fsdp, --gather NAME)",
                )
            if not torch.equal(got.double(), ref.double()):
                return Divergence(
                    -1,
                    "param",
                    r,
                    i,
                    names[i],
                    (got.double() - ref.double()).abs().max().item(),
                    0.0,
                    "initial parameters must equal rank 0's exactly (missing broadcast?)",
                )
        for j, (got, ref) in enumerate(zip(rec.initial_buffers, traj.initial_buffers)):
            if not torch.equal(got.double(), ref.double()):
                return Divergence(
                    -1,
                    "buffer",
                    r,
                    None,
                    f"buffer #{j}",
                    (got.double() - ref.double()).abs().max().item(),
                    0.0,
                    "buffers must be broadcast from rank 0",
                )
    return None


def _param_divergences(
    k, t, r, oref, traj, ranks, dtypes, same_operations, check
) -> Iterator[Divergence]:
    """Rank ``r``'s parameters after step ``k`` that diverge from the oracle's, at step ``t``'s tolerances
    (or Note [Comparing an update]'s bound, where the oracle stepped rank 0's gradients)."""
    before = traj.steps[k - 1].params if k else traj.initial_params
    # Where the oracle's step was applied to the gradients rank 0 recorded, from rank 0's
    # parameters, the update is judged alone (Note [Comparing an update]).
    on_update = traj.on_target_gradients and ranks[0].steps[k].grads is not None
    start = ranks[0].steps[k - 1].params if k else traj.initial_params
    step = ranks[r].steps[k]
    own = ranks[r].steps[k - 1].params if k else ranks[r].initial_params  # how it was updated
    for i, (got, ref) in enumerate(zip(step.params, oref.params)):
        rtol = tensor_tolerance(
            traj.case, t, dtypes[i], dtypes, same_operations=same_operations
        ).params
        terms = update_terms(ref, before[i])  # Note [Terms of an update]
        if on_update and update_rtol(k, dtypes[i]) < rtol:
            rtol = update_rtol(k, dtypes[i])
            terms = update_terms(ref, before[i], start[i], _scale_of(oref, i))
        d = check(k, "param", r, i, got, ref, rtol, terms, own[i] if i < len(own) else None)
        if d:
            yield d


def _rank_disagreement(k: int, ranks: list[RankRecord], names: list[str]):
    """The first rank whose parameters after step ``k`` are not bitwise rank 0's (or None)."""
    # Ranks must agree bit-for-bit on parameters after every step (they apply the same update).
    base = ranks[0].steps[k].params
    for r in range(1, len(ranks)):
        for i, (a, b) in enumerate(zip(base, ranks[r].steps[k].params)):
            if not torch.equal(a, b):
                return Divergence(
                    k,
                    "rank-agreement",
                    r,
                    i,
                    names[i],
                    (a.double() - b.double()).abs().max().item(),
                    0.0,
                    "ranks must hold bitwise identical parameters after each step",
                )
    return None


def _compare_masters(k, r, step, oref, traj, ranks, check):
    """Rank ``r``'s float32 masters after step ``k`` against the oracle's step from rank 0's
    masters (Note [Comparing master weights]): where the case keeps master weights and the rank
    recorded the step's gradients (the oracle's update was applied to them). A master the oracle
    keeps must be there."""
    got_all = getattr(step, "masters", None)
    ref_all = getattr(oref, "masters", None)
    if ref_all is None:
        return None
    if got_all is not None:
        d = _unrounded(k, r, step.params, got_all)
        if d:
            return d
    if step.grads is None:
        return None
    if got_all is None:
        got_all = [None] * len(ref_all)
    before = ranks[0].steps[k - 1].masters if k else None
    for i, ref in enumerate(ref_all):
        if ref is None:
            continue
        prev = before[i] if before is not None and i < len(before) else None
        got = got_all[i] if i < len(got_all) else None
        terms = update_terms(ref, prev, _scale_of(oref, i))  # Note [Comparing an update]
        d = check(k, "master", r, i, got, ref, master_rtol(k), terms)
        if d:
            if got is not None:
                d.detail = f"master weight ({got.dtype}). " + d.detail
            return d
    return None


def _unrounded(k, r, params, masters) -> Divergence | None:
    """The first parameter of rank ``r`` after step ``k`` that is not its float32 master rounded
    to the parameter's dtype by some rounding rule (Note [Comparing master weights]), or None."""
    for i, (p, m) in enumerate(zip(params, masters)):
        if p is None or m is None or p.dtype not in (torch.bfloat16, torch.float16):
            continue
        if m.dtype != torch.float32 or m.shape != p.shape:
            continue  # a master of another shape is the master comparison's to judge
        nearest, other = rounding_bracket(m, p.dtype)
        bad = ~((p == nearest) | (p == other))
        if bool(bad.any()):
            j = int(bad.reshape(-1).nonzero()[0])
            got, want = p.reshape(-1)[j].item(), m.reshape(-1)[j].item()
            return Divergence(
                k,
                "master",
                r,
                i,
                None,
                abs(got - want),
                0.0,
                f"parameter #{i} ({p.dtype}) is not its float32 master rounded: element {j} is "
                f"{got!r}, its master {want!r} lies between {nearest.reshape(-1)[j].item()!r} "
                f"and {other.reshape(-1)[j].item()!r} ({int(bad.sum())} of {p.numel()} "
                "elements off); the parameters a forward uses must be the masters just stepped",
            )
    return None


def _scale_of(oref, i: int) -> torch.Tensor | None:
    """The oracle's ``update_scale`` of tensor ``i`` in step record ``oref``, as a tensor for
    ``update_terms`` (None where the step left it alone)."""
    scales = getattr(oref, "update_scale", None) or []
    s = scales[i] if i < len(scales) else None
    return None if s is None else torch.tensor([s], dtype=torch.float64)


def grad_rtol(traj, k: int, i: int, *, anchored: bool, bound: bool, same_operations: bool):
    """The tolerance parameter ``i``'s synchronised gradient of step ``k`` is judged at: the
    derived bound where the step is a step 0 on the CPU (Note [Step 0: a derived bound]), else its
    dtype's tolerance."""
    dtypes = [str(p.dtype).removeprefix("torch.") for p in traj.initial_params]
    t = 0 if anchored else k
    if t == 0 and bound:
        n_elements = sum(p.numel() for p in traj.initial_params)
        return step0_grad_rtol(traj.case, dtypes[i], n_elements, _coarsest(dtypes))
    return tensor_tolerance(traj.case, t, dtypes[i], dtypes, same_operations=same_operations).grads


def _coarsest(dtypes: list[str]) -> str:
    """The dtype of ``dtypes`` with the largest unit roundoff: the one a clip's norm over all of
    them is rounded at (Note [Clipping across dtypes])."""
    return max(dtypes, key=UNIT_ROUNDOFF.__getitem__)


def state_rtol_of(traj, k: int, i: int, base: float, **where) -> float:
    """The tolerance of parameter ``i``'s optimizer state after step ``k`` (Note [Terms of an
    update]): the state's own, or, where larger, what the gradients it sums may carry: a momentum
    buffer or moment is a combination of the gradients of steps 0..k with coefficients at most 1
    (twice the gradient's relative error for a squared one), so it differs from the oracle's by
    at most 2 (k + 1) times the gradients' tolerance. That matters below float32, where every
    step is anchored and its gradients judged by the derived bound (bfloat16 at world size 4:
    about 8e-2 a step); elsewhere the state's own tolerance stands.

    The state's own is the case's (``base``: ``state_tolerance``) or, where larger, that of the
    parameter's dtype: the state is computed in the parameter's dtype from its gradients, so a
    float32 layer's state in a float64 model carries float32 rounding from step 0, as its
    gradients and parameters do (Note [Parameters of two dtypes]). Where the step's gradients are
    judged by the derived bound, that is the bound above (2 (k + 1) times theirs, at the
    parameter's unit roundoff); elsewhere the dtype's tolerance at this step
    (``tensor_tolerance``), the smaller of the two where both apply."""
    dtypes = [str(p.dtype).removeprefix("torch.") for p in traj.initial_params]
    t = 0 if where.get("anchored") else k
    own = tensor_tolerance(
        traj.case, t, dtypes[i], dtypes, same_operations=where.get("same_operations", True)
    ).state
    if t == 0 and where.get("bound"):
        own = min(own, 2 * (k + 1) * grad_rtol(traj, k, i, **where))
    base = max(base, own)
    if not where.get("anchored"):
        return base
    return max(base, 2 * (k + 1) * grad_rtol(traj, k, i, **where))


def state_terms(traj, k: int):
    """``terms(i, key)``: the scale source of parameter ``i``'s state ``key`` after step ``k`` of
    ``traj`` (Note [Terms of an update]): its value after step k and before it, and the step's
    gradient where it has the state's shape."""
    prev = traj.steps[k - 1].state if k else {}
    now, grads = traj.steps[k].state, traj.steps[k].grads
    absums = getattr(traj.steps[k], "grad_absum", None) or []

    def terms(i: int, key: str):
        ref = now.get(i, {}).get(key)
        if not isinstance(ref, torch.Tensor):
            return None
        before = prev.get(i, {}).get(key)
        g = grads[i] if i < len(grads) else None
        g = g if isinstance(g, torch.Tensor) and g.numel() == ref.numel() else None
        # The scale the gradient itself was judged on (Note [Step 0: a derived bound]).
        absum = absums[i] if i < len(absums) else None
        absum = absum if isinstance(absum, torch.Tensor) and absum.numel() == ref.numel() else None
        return update_terms(ref, before if isinstance(before, torch.Tensor) else None, g, absum)

    return terms


def _compare_state(k, r, got_state, ref_state, rtol_of, names, check, terms=None):
    """Rank ``r``'s optimizer state against the oracle's, parameter by parameter: every parameter
    whose state the rank returns must have the oracle's state. Which parameters each rank returns
    (its shard, or all of them) is judged across ranks by ``compare_state_union``, as is a
    state_dict() the ranks could not read (``got_state`` None)."""
    if got_state is None:
        return None
    extra = sorted(i for i, st in got_state.items() if st and not ref_state.get(i))
    if extra:
        return Divergence(
            k,
            "state",
            r,
            extra[0],
            None,
            float("inf"),
            0.0,
            f"optimizer state for parameters {extra}, which have none in the oracle",
        )
    for i in sorted(i for i, st in got_state.items() if st):
        for key, ref in ref_state[i].items():
            got = got_state[i].get(key)
            if got is None:
                return Divergence(
                    k, "state", r, i, names[i], float("inf"), 0.0, f"state key {key!r} missing"
                )
            d = check(
                k,
                "state",
                r,
                i,
                got.reshape(ref.shape) if got.numel() == ref.numel() else got,
                ref,
                rtol_of(i),
                None if terms is None else terms(i, key),
            )
            if d:
                d.detail = f"state {key!r}. " + d.detail
                return d
    return None
