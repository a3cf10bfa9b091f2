"""A check of a target on the user's own model (``--model``, ``--batch``, ``--loss-fn``; Note [A
user's model] in ``paracheck.workloads.user``): the options read into a ``UserModel`` and checked
before any rank starts (``user_model_of``), the target that carries it (``with_user_model``), and
each drawn case fitted to it before it runs (``fitted_case``).

Note [Cases drawn around a user's model]
    The kinds' strategies draw a case as they always do (world size, batch sizes, micro-batches,
    steps, precision, protocol, bucket size, optimizer and parameter groups) and ``fitted_case``
    puts the user's model in it: ``user_model`` set, ``model`` back to its default (unused, so
    that the case's line does not name a generated model's features). The groups name parameters
    by index into ``model.parameters()``: an index past the user's model is dropped, a group left
    with none is dropped, every parameter no group names goes to a group of them (with the first
    group's hyper-parameters: as in every drawn case, no parameter is left out of the optimizer,
    where it would accumulate its gradient from step to step), and where no group is left for
    the constructor, the first becomes one. A case resumed at another world size
    (``reshard_at_step``) clears its gradients with ``zero_grad(set_to_none=True)``: gradients
    are no part of a checkpoint, and a parameter the data leaves without a gradient after the
    load (an idle expert) would hold the zeros of an earlier step in the uninterrupted run and
    None in the resumed one (the generated models' resumed cases draw no such parameter). The
    model's seed is the case's
    (``init_seed``), drawn and shrunk with it. Kinds whose cases need a generated model are
    refused with a usage error (``UNSUPPORTED_KINDS``).

Note [An update on a user's model]
    Every step on a user's model is judged on the target's own gradients, as a sharding kind's
    step is (Note [Comparing an update] in ``paracheck.oracle.tolerance``): the gradients against
    the oracle's, and the parameters after the step against the oracle's update applied to the
    gradients the target recorded. Judged on the oracle's own gradients instead, a correct
    bucketed DDP failed on ``torch.nn.TransformerEncoder`` under Adam: the attention's key bias
    has a gradient that is zero in exact arithmetic (the softmax ignores it), so its computed
    gradient is rounding noise, which the two summation orders make different, and Adam divides
    it by its own size plus eps: 2.1e-13 apart after one step where the tensor's 1e-10 relative
    tolerance allowed 2.0e-13. A generated model has no such parameter; a real one often does.
    The gradient comparison still catches every wrong gradient; for the kinds whose optimizer is
    the harness's own (``ddp``), nothing else can make the update wrong.
"""

from __future__ import annotations

from dataclasses import replace

from paracheck.cases import Case
from paracheck.workloads.mlp import MLPSpec
from paracheck.workloads.user import (
    MODEL_OPTIONS,
    UserModel,
    UserModelInfo,
    check_user_model,
    invalid,
)

__all__ = [
    "UNSUPPORTED_KINDS",
    "fitted_case",
    "info",
    "model_options",
    "user_model_of",
    "with_user_model",
]

# kind -> why a user's model is not checked with it.
UNSUPPORTED_KINDS = {
    "loop": "a training loop's cases minimise a language model's token-mean or batch-mean "
    "cross-entropy (Note [Loss semantics]), which a user's model and loss do not define",
    "tp": "a tensor-parallel plan names the layers of the model it is written for (the cases' "
    "plans are the generated MLP chains'), not a user's model",
}

_INFO: dict[UserModel, UserModelInfo] = {}


def user_model_of(model: str | None, batch: str | None, loss_fn: str | None) -> UserModel | None:
    """The ``UserModel`` the options name, checked (Note [A user's model]); None without
    ``--model``. Raises a usage error naming the option that is wrong."""
    if model is None:
        for option, value in ((MODEL_OPTIONS["batch"], batch), (MODEL_OPTIONS["loss"], loss_fn)):
            if value is not None:
                raise invalid(option, value, "needs {option:model} (the model it feeds)")
        return None
    if batch is None:
        raise invalid(
            MODEL_OPTIONS["build"],
            model,
            "needs {option:batch} pkg.mod:batch, a function batch(seed, n, dtype) -> "
            "(inputs, targets)",
        )
    user = UserModel(build=model, batch=batch, loss=loss_fn)
    info(user)
    return user


def info(user: UserModel) -> UserModelInfo:
    """What ``check_user_model`` found of ``user``, checked once per process."""
    if user not in _INFO:
        _INFO[user] = check_user_model(user)
    return _INFO[user]


def with_user_model(target, user: UserModel | None):
    """``target`` checked on ``user``'s model (the target itself without one); a usage error for a
    kind that cannot be (``UNSUPPORTED_KINDS``)."""
    if user is None:
        return target
    if target.kind in UNSUPPORTED_KINDS:
        raise invalid(
            MODEL_OPTIONS["build"],
            user.build,
            f"not supported for {target.name} (kind {target.kind}): {UNSUPPORTED_KINDS[target.kind]}",
        )
    return replace(target, user_model=user)


def model_options(user: UserModel | None) -> str:
    """The command-line options that name ``user``'s model (a replay's)."""
    if user is None:
        return ""
    out = f" --model {user.build} --batch {user.batch}"
    return out + (f" --loss-fn {user.loss}" if user.loss else "")


def fitted_case(case: Case, user: UserModel | None) -> Case:
    """``case`` with ``user``'s model (Note [Cases drawn around a user's model]); ``case`` itself
    without one; a case that carries its user model already (a replayed one) as it is, but for
    the gradients of a resumed case."""
    if case.user_model is not None:
        return _resumed_without_stale_zeros(case)
    if user is None:
        return case
    n = info(user).parameters
    groups = []
    for g in case.optimizer.groups:
        kept = tuple(i for i in g.params if i < n)
        if g.params and not kept:
            continue
        groups.append(replace(g, params=kept))
    named = {i for g in groups for i in g.params}
    if len(named) == n:  # nothing left for a group of "every parameter no other group names"
        groups = [g for g in groups if g.params]
    elif not any(not g.params for g in groups):
        # Every parameter stays in a group, as in every drawn case: one the groups no longer name
        # would be trained by nothing and accumulate its gradient from step to step.
        groups.append(replace(case.optimizer.groups[0], params=(), add_at_step=None))
    if not any(g.add_at_step is None for g in groups):
        groups[0] = replace(groups[0], add_at_step=None)  # the constructor needs a group
    optimizer = replace(case.optimizer, groups=tuple(groups))
    fitted = replace(case, model=MLPSpec(), optimizer=optimizer, user_model=user)
    return _resumed_without_stale_zeros(fitted)


def _resumed_without_stale_zeros(case: Case) -> Case:
    """A resumed case with ``set_to_none=True`` (Note [Cases drawn around a user's model])."""
    if case.reshard_at_step is not None and not case.set_to_none:
        return replace(case, set_to_none=True)  # gradients are no part of a checkpoint
    return case


# Note [A user's model torch cannot run in mixed precision]
#   A fully sharded wrapper given the float32 model and ``compute_dtype`` (a case with
#   ``masters_from_float32``) computes with its parameters cast and its buffers as they are: a
#   model whose layer refuses that mix on its own (torch 2.13's CPU ``BatchNorm1d`` in eval mode
#   with bfloat16 weights beside float32 running statistics: "needs_dynamic_casting ... INTERNAL
#   ASSERT FAILED") raises in every such case, under paracheck's FSDP and torch's FSDP2 alike,
#   and no wrapper is to blame. Where a case's ranks raised, the model is run alone, in one
#   process, so cast (forward and backward on the case's row counts); if that raises too the
#   case is skipped with torch's words, as a user's model torch cannot compile is (Note [A
#   user's model torch cannot compile] in ``paracheck.check.properties.compiled``). The ranks'
#   exception stands where the model alone runs.
_MIXED: dict[tuple, str | None] = {}


def model_cannot_run_mixed(case: Case, exc) -> str | None:
    """Why a ``masters_from_float32`` case on a user's model whose ranks raised is skipped (Note
    [A user's model torch cannot run in mixed precision]), or None."""
    if case.user_model is None or not case.masters_from_float32:
        return None
    if getattr(exc, "kind", None) != "raised":
        return None
    rows = tuple(sorted(set(case.batch_sizes)))
    key = (case.user_model, case.dtype, case.seed, rows)
    if key not in _MIXED:
        _MIXED[key] = _mixed_alone(case, rows)
    why = _MIXED[key]
    return None if why is None else f"the model cannot run {why}"


def _mixed_alone(case: Case, rows: tuple[int, ...]) -> str | None:
    import torch

    from paracheck.cases import DTYPES
    from paracheck.workloads.user import build_user_model, user_batch, user_loss

    user, dtype = case.user_model, DTYPES[case.dtype]
    n = rows[0] if rows else 1
    try:
        for n in rows:
            model = build_user_model(user, case.seed, torch.float32)
            with torch.no_grad():
                for p in model.parameters():
                    p.data = p.data.to(dtype)
            x, y = user_batch(user, case.seed, n, dtype)
            user_loss(user, model(x), y).backward()
    except Exception as exc:  # torch's, on the model alone: its words are the reason
        first = (str(exc).strip().splitlines() or [""])[0]
        return (
            f"with its parameters in {case.dtype} and its buffers in float32, as a wrapper given "
            f"compute_dtype computes it: {type(exc).__name__}: {first[:300]} (in one process, "
            f"no wrapper, {n} row{'' if n == 1 else 's'})"
        )
    return None
