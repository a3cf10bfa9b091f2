"""The ``reshard`` property (the sharding kinds): training saved at one world size and resumed in a
fresh world of another goes on as if it had never stopped, against the single-process oracle.

Reads, for a case with ``reshard_at_step`` (the ``reshard`` feature), two more runs of the target:
its kind's rank program on the first k steps at world size W, whose ``RankRecord`` carries the
parameters and ``final_state_dict``, and ``paracheck.check.ranks.reshard.run_resumed`` on the
steps k.. at W'. Judges the trajectory they make together with
``paracheck.check.properties.equivalence.compare``: parameters, gradients where readable,
optimizer state and masters after every step, ranks bitwise alike.

Note [Resuming at another world size]
    Checkpoints that change world size are where sharded optimizers lose state silently: a
    reshardable checkpoint that reads every parameter past the first bucket from the wrong
    offset, unseen while every test used one bucket; optimizer state not restored when the
    number of ranks changed; Adam's moments dropped on load. A reload at the same world size
    (the ``reload`` feature) sees none of them. So a case of the ``reshard`` row is trained k
    steps at its world size W (``reshard_at_step``: k in 1..steps-1), saved as users save it
    (the model's parameters, whole on every rank of these kinds, and the target's
    ``state_dict()``, consolidated: Note [State dict conventions]; a sharding case is saved by two
    ranks or more, as one rank's dict cannot tell a consolidated state from its own shard, and a
    class whose ranks' dicts differ is not judged), loaded into a fresh world of
    W' (``reshard_world_size``, drawn among the check's world sizes, another than W wherever there
    is one, 1 included), which trains the remaining steps (``paracheck.check.ranks.reshard``).
    There the groups keep the rates they were built with until the load (a scheduler's own
    ``load_state_dict()`` restores its count, never a group's rate), so the rates at the save are
    the target's ``load_state_dict()``'s to restore, as in use.
    Around it the sharding cases draw what decides where state lives: bucket sizes from below
    one parameter to above the model (state spanning several buckets), frozen and unused
    parameters, uneven and empty shards (more ranks than parameters), several groups with their
    own hyper-parameters, groups added before and after the save, a scheduler, Adam and SGD with
    momentum, bfloat16 parameters with float32 masters (one bfloat16 sharding case in two is
    resumed by its seed: ``paracheck.strategies._reshard.resumed_by_seed``). Hypothesis shrinks
    k toward 1 and W' toward the smallest world.

    The oracle never changes world size, so the data must not either: the global batch of a
    step must be the same at W and W'. Both runs therefore take the same U = lcm(W, W') equal
    batches per micro-step, rank r of a world of size w receiving U/w of them concatenated
    (``Case.merged_ranks``, as the world-size relation feeds one rank): each rank's mean over
    its rows, averaged over ranks, is the mean over the U batches at either size. That is why a
    resumed case has equal batch sizes and no branch whose use depends on the data (its use would
    depend on which batch comes first), and why it starts from rank 0's initial parameters; the
    protocols that leave the result unchanged (``closure``, ``reload_at_step``, a held-back
    rank) and float16 loss scaling (whose scale a checkpoint would have to carry) are left out
    of the two runs. So is a group added at or after the save where ``zero_grad()`` clears only
    the optimizer's groups (``Case``): its parameters' gradients accumulate until it is added, and
    gradients are no part of a checkpoint; such a group is given to the constructor instead (a
    ZeRO wrapper, which clears the whole module, keeps its groups added after the save). Each
    half is judged against the oracle of its own world's batches (Note [Anchored steps], Note
    [Comparing an update]): the saving run's k steps against the oracle at W as the kind's steps
    always are, then the whole trajectory against the oracle at W', anchored on every step and
    each update applied to the gradients the target recorded, so that its optimizer state is
    built from every step's gradients, the saving run's included, and a state lost at the load
    shows in the first step after it (its own gradients of the steps before the save would come
    from other rows: an autocast FSDP's differed at bfloat16's rounding, and its parameters after
    step 0 failed). The gradients of the steps before the load are judged in the first
    comparison only: the ranks at W computed them on other rows than the oracle at W'
    concatenates. So each half's gradients are computed by the operations of its own oracle,
    and judged at the derived step-0 bound, as the check judges any case. (Judged instead at the table's tolerance, with the whole trajectory against the
    oracle at W', a correct bfloat16 design with masters failed: a bias gradient after the load
    8.9e-3 from the oracle's where 5.4e-3 was allowed, in one of 20 drawn cases.)

    A target whose ``state_dict()`` is each rank's own shard (ranks hold different parameters'
    state) cannot be loaded at another world size by construction: such a case is not judged (no
    failure), and a class says so up front with ``unsupported_case_features =
    {"reshard_at_step": why}``, which makes every case of the row skipped with its reason. A fully
    sharded wrapper's optimizer steps each rank's own shard parameters: its state is per-rank by
    contract, and its row says "not supported" (``paracheck.check.interfaces``), unless its class
    declares ``paracheck_checkpoint = "torch.distributed.checkpoint"``: its shards are DTensors,
    saved and resharded by DCP (``paracheck.check.ranks.reshard_dcp``).

Note [A resumed case wrong before its save]
    The saving run's k steps are the kind's own trajectory: nothing has been saved or loaded
    yet. A divergence there (a sharded optimizer that divides its gradients twice) is the plain
    case's failure, so the property returns it as it is, under the property it breaks
    (``parameters``, ``gradients``, ``optimizer-state``), its detail saying it came before the
    save. Reported as ``reshard``, the verdict table took it for a cause of its own, printed
    beside the core's in the ``+reshard`` row (three such blocks for one sharded design whose
    every update was wrong); as what it is, it is the core's cause again, or is attributed to the
    core when the case without the feature fails the same way. Only a divergence after the load,
    or of a step after the save, is a resharding failure.
"""

from __future__ import annotations

import contextlib
import math
import shutil
import tempfile
from dataclasses import replace

import torch

from paracheck.cases import Case
from paracheck.check.features import without
from paracheck.check.kinds import KINDS
from paracheck.check.properties._case import case_params, group_of, param_names
from paracheck.check.properties._divergence import Divergence
from paracheck.check.properties.equivalence import compare
from paracheck.check.ranks.record import RankRecord
from paracheck.oracle import train
from paracheck.oracle.tolerance import anchored

__all__ = [
    "DCP_FN",
    "NAME",
    "NOT_JUDGED",
    "PER_RANK_NOT_JUDGED",
    "RESUME_FN",
    "check_reshard",
    "reshard_cases",
    "reshardable",
]

NAME = "reshard"
RESUME_FN = "paracheck.check.ranks.reshard:run_resumed"
DCP_FN = "paracheck.check.ranks.reshard_dcp:run_dcp_phase"
# The key of ``Evidence.measured`` under which a case the property could not judge says why.
NOT_JUDGED = "reshard-not-judged"
# Where every resumed case of a row says this, the target's state is per-rank: its row reads "not
# supported" (paracheck.check.table), never PASS.
PER_RANK_NOT_JUDGED = "reshard not judged: the ranks' state_dict() differ (per-rank shards)"


def reshard_cases(case: Case) -> tuple[Case, Case]:
    """The two halves' cases of a resumed ``case`` (Note [Resuming at another world size]): at its
    world size W and at ``reshard_world_size`` W', fed the same U = lcm(W, W') equal batches."""
    if case.reshard_at_step is None:
        raise ValueError("case.reshard_at_step=None: the case is not resumed")
    base = without(case, "unused-some-ranks")
    base = replace(
        base,
        rank_dependent_init=False,
        closure=False,
        reload_at_step=None,
        loss_scale=None,
        delay_at=None,
        delay_rank=0,
        delay_s=0.0,
        merged_ranks=1,
    )
    if not base.zero_grad_module:
        base = _joined_by_the_save(base)
    w, w2, b = base.world_size, base.reshard_world_size, base.batch_sizes[0]
    u = math.lcm(w, w2)
    at_w = replace(base, batch_sizes=(b,) * w, merged_ranks=u // w)
    at_w2 = replace(base, world_size=w2, batch_sizes=(b,) * w2, merged_ranks=u // w2)
    return at_w, at_w2


def _joined_by_the_save(case: Case) -> Case:
    """``case`` with every group it adds at or after the save given to the constructor instead:
    the gradients its parameters accumulate until it is added (``zero_grad()`` clears only the
    groups it has: ``Case``) are no part of a checkpoint, so a resumed run cannot go on with them
    (Note [Resuming at another world size])."""
    k = case.reshard_at_step
    if k is None:
        return case
    groups = tuple(
        replace(g, add_at_step=None) if g.add_at_step is not None and g.add_at_step >= k else g
        for g in case.optimizer.groups
    )
    return replace(case, optimizer=replace(case.optimizer, groups=groups))


def reshardable(dicts: list) -> bool:
    """Whether the ``state_dict()`` each rank returned can be loaded at another world size: every
    rank returned the same dict (consolidated, or no state at all). Per-rank shards, whose
    ranks return different dicts, cannot be (Note [State dict conventions])."""
    return all(_same(d, dicts[0]) for d in dicts[1:])


def _same(a, b) -> bool:
    """``a`` and ``b`` hold the same values: dicts by key, sequences in order, tensors bitwise."""
    if torch.is_tensor(a) or torch.is_tensor(b):
        return (
            torch.is_tensor(a) and torch.is_tensor(b) and a.shape == b.shape and torch.equal(a, b)
        )
    if isinstance(a, dict) or isinstance(b, dict):
        return (
            isinstance(a, dict)
            and isinstance(b, dict)
            and a.keys() == b.keys()
            and all(_same(a[k], b[k]) for k in a)
        )
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        return (
            isinstance(a, (list, tuple))
            and isinstance(b, (list, tuple))
            and len(a) == len(b)
            and all(_same(x, y) for x, y in zip(a, b))
        )
    return bool(a == b)


@contextlib.contextmanager
def _single_thread():
    # As the ranks and the check's own oracle run (paracheck.oracle.tolerance).
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def _stitched(saved: list[RankRecord], resumed: list[RankRecord]) -> list[RankRecord]:
    """One record per rank of the resumed world: the saving world's steps (rank r mod W's, all
    alike in a correct target), then its own."""
    w = len(saved)
    return [
        RankRecord(
            saved[r % w].initial_params,
            saved[r % w].initial_buffers,
            tuple(saved[r % w].steps) + tuple(rec.steps),
        )
        for r, rec in enumerate(resumed)
    ]


def _judged_from(case: Case) -> dict[int, int]:
    """Parameter index -> the step its group is added at (Note [Gradients outside the groups])."""
    _, added = group_of(case, case_params(case))
    return {i: at for i, at in added.items() if at is not None}


def check_reshard(
    world, target, case: Case, ranks, *, timeout=None, measured: dict | None = None
) -> Divergence | None:
    """The property on a checked case (``ranks``: its run, not read): None where the case is not
    resumed, the target skips it or returns per-rank shards; in the last two the reason is left
    in ``measured[NOT_JUDGED]``, so that the report says the case was not judged (never a bare
    pass)."""
    if case.reshard_at_step is None:
        return None
    k = case.reshard_at_step
    at_w, at_w2 = reshard_cases(case)
    runs = (_through_dcp if KINDS[target.kind].shards_parameters else _through_state_dict)(
        world, target, at_w, at_w2, timeout
    )
    if isinstance(runs, str):
        if measured is not None:
            measured[NOT_JUDGED] = runs
        return None
    saved, resumed = runs
    on_gpus = _on_gpus(world)
    # Each half against the oracle of its own world's batches (Note [Resuming at another world
    # size]): the saving run's k steps, then the resumed steps continuing them.
    context = (
        f"saved after step {k - 1} at world size {at_w.world_size}, resumed at world size "
        f"{at_w2.world_size}"
    )
    d = judge(target.kind, replace(at_w, steps=k, reshard_at_step=None), saved, 0, on_gpus=on_gpus)
    if d is not None:
        # Wrong before anything was saved: the plain trajectory's failure (Note [A resumed case
        # wrong before its save]), under the property it breaks, not a resharding one.
        return replace(d, detail=f"before the save ({context}). {d.detail}".rstrip())
    d = judge(target.kind, at_w2, _stitched(saved, resumed), k, on_gpus=on_gpus)
    if d is None:
        return None
    return Divergence(
        d.step,
        NAME,
        d.rank,
        d.index,
        d.name,
        d.max_abs_diff,
        d.tolerance,
        f"{d.what} {'before the save' if d.step < k else 'after the load'}: {context}. "
        f"{d.detail}".rstrip(),
        d.worst_ratio,
    )


def _through_state_dict(world, target, at_w: Case, at_w2: Case, timeout):
    """(the saving run, the resumed run) of a target checkpointed by its ``state_dict()``, or why
    the case is not judged: either run is skipped, or the dicts are per-rank shards."""
    k = at_w.reshard_at_step
    assert k is not None
    job = target.job(at_w)
    first = replace(job, case=replace(at_w, steps=k, reshard_at_step=None))
    saved = world.run(target.rank_fn, first, world_size=at_w.world_size, timeout=timeout)
    if saved[0].skipped is not None:
        return f"reshard not judged: the saving run was skipped ({saved[0].skipped})"
    dicts = [rec.final_state_dict for rec in saved]
    if not reshardable(dicts):
        # Per-rank shards cannot be loaded elsewhere: not judged (the Note above).
        return (
            f"{PER_RANK_NOT_JUDGED}, which cannot "
            "be loaded at another world size; declare unsupported_case_features = "
            '{"reshard_at_step": why} to say so, or return one consolidated dict on every rank'
        )
    checkpoint = {"params": saved[0].steps[-1].params, "state_dict": dicts[0]}
    second = replace(job, case=at_w2, start=k, checkpoint=checkpoint)
    resumed = world.run(RESUME_FN, second, world_size=at_w2.world_size, timeout=timeout)
    return _resumed_or_why(saved, resumed)


def _through_dcp(world, target, at_w: Case, at_w2: Case, timeout):
    """(the saving run, the resumed run) of a fully sharded wrapper checkpointed through
    ``torch.distributed.checkpoint`` into a real directory (``paracheck.check.ranks.reshard_dcp``),
    or why the case is not judged (either run is skipped)."""
    k = at_w.reshard_at_step
    assert k is not None
    directory = tempfile.mkdtemp(prefix="paracheck-reshard-")
    try:
        job = replace(target.job(at_w), checkpoint_dir=directory)
        first = replace(job, phase="save", start=0, stop=k)
        saved = world.run(DCP_FN, first, world_size=at_w.world_size, timeout=timeout)
        if saved[0].skipped is not None:
            return f"reshard not judged: the saving run was skipped ({saved[0].skipped})"
        second = replace(job, case=at_w2, phase="load", start=k, stop=at_w2.steps)
        resumed = world.run(DCP_FN, second, world_size=at_w2.world_size, timeout=timeout)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return _resumed_or_why(saved, resumed)


def _resumed_or_why(saved: list[RankRecord], resumed: list[RankRecord]):
    """Both runs, or why the case is not judged where the resumed run was skipped."""
    if resumed[0].skipped is not None:
        return f"reshard not judged: the resumed run was skipped ({resumed[0].skipped})"
    return saved, resumed


def _on_gpus(world) -> bool:
    return getattr(world, "backend", "gloo") == "nccl"


def judge(
    kind: str, case: Case, ranks: list[RankRecord], start: int, *, on_gpus: bool = False
) -> Divergence | None:
    """The first divergence of ``ranks`` (a ``kind`` target's run of ``case``) from the oracle of
    ``case`` anchored on their steps, judging the gradients of the steps from ``start`` on only:
    those before it were computed in another world, on other rows (Note [Resuming at another
    world size]); their update and the state built from them are still judged."""
    row = KINDS[kind]
    # Past the save, every step's update is judged on the gradients the target recorded, as a
    # sharding kind's always is (Note [Comparing an update]): the oracle's own gradients of the
    # steps before it come from other rows (a bfloat16 autocast FSDP's differed by its rounding).
    on_gradients = row.on_target_gradients or case.master_weights or start > 0
    by_step = anchored(case) or on_gradients
    local_on = "cuda" if on_gpus and anchored(case) else None
    anchors = [(s.params, s.grads, s.masters) for s in ranks[0].steps] if by_step else None
    with _single_thread():
        traj = train(case, anchors, target_gradients=on_gradients, device=local_on)
    judged = [
        replace(
            rec,
            steps=tuple(
                replace(s, grads=None) if n < start else s for n, s in enumerate(rec.steps)
            ),
        )
        for rec in ranks
    ]
    d, _ = compare(
        traj,
        judged,
        param_names(case),
        check_state=row.compares_state,
        device="cuda" if on_gpus else "cpu",
        anchored=by_step,
        derived=row.derived_bound,
        judged_from=_judged_from(case) if row.syncs_its_groups else None,
    )
    return d
