"""Cases for optimizer-state sharding: ``cases()`` pushed toward the corners sharding bugs live in.

Sharding bugs hide in parameter groups (hyper-parameters lost or mixed up when the wrapped
optimizer is built) and in ``add_param_group`` during training (a group no rank owns). ``cases``
draws one group most of the time and a late group after step 1 only, rarely (0 of 40 derandomised
examples with one seed): too rarely for a default check to kill those bugs. ``sharding_cases``
composes ``cases`` and, each by a boolean that shrinks to "off":

* splits a single group in two at a drawn parameter, the second with its own lr / weight decay /
  betas / momentum;
* makes every group after the first a late group, added just before a drawn step
  ``k in 1..steps-1`` (so state built before it keeps being stepped after it, and a parameter
  outside every group keeps accumulating its gradient until then), with at least two and at most
  ``max_steps`` steps;

and then draws the protocols real training code meets (``Case`` / ``OptimizerSpec``), each shrinking
to "off":

* a model of one layer (one or two parameters) in one case in four, so that at world sizes 2..4
  some rank owns no parameter at all;
* a torch LR scheduler on the optimizer (``StepLR``, or ``LambdaLR`` with a warm-up that changes
  every lr at construction, the latter only without late groups, which it cannot step);
* parameter groups as dicts whose ``params`` is a generator;
* ``step(closure)``;
* ``state_dict()`` -> a fresh instance -> ``load_state_dict()`` before a drawn step.

Everything else (SGD with/without momentum, Adam, AdamW, lr schedules, frozen, tied and unused
parameters) is ``cases``'s.

``count_partition_cases`` is not drawn: it is the one case a ``sharded`` check runs first (Note
[A partition by count]).

Note [A partition by count]
    Dealing parameters to ranks by count, whatever their sizes (round-robin,
    ``params[rank::world_size]``, or contiguous runs of ``len(params) / W``), breaks the bound of
    an undeclared partition (total/W + largest: Note [Balance of the state stepped]) only where
    several parameters well above the others land on one rank: one large parameter is its own
    allowance. The sharding cases draw that in about 4 cases of 100, and the default check of a
    round-robin design reported it in its core row at one seed of four. So a ``sharded`` check
    runs one case built for it before the search of its core row (``Kind.first_cases``; Note [The
    verdict table] in ``paracheck.check.table``): an MLP 8 -> 8 -> 8 -> 8 -> 1 -> 1 with biases,
    its ten parameters (64, 8, 64, 8, 64, 8, 8, 1, 1, 1 elements) given in model order in one
    group to Adam (state in every step), three steps (the state stepped is seen from the second
    step that steps, and a float16 case with an overflowing loss scale skips its first), at world
    size 2, else 4, where the check draws one. Its loads in elements, against the bound
    227/2 + 64 = 177.5 at two ranks (227/4 + 64 = 120.75 at four): round-robin 201 (129),
    contiguous runs 208 (136). A partition by size is within the bound on every case (Note
    [Balance bound] in ``paracheck.zero.partition``), so a correct design passes it; it has no
    optional feature (a core case under every contract) and runs in a fraction of a second. The
    search of the whole contract (``CheckSettings(table=False)``: the selftest, the pytest
    plugin) does not run it: the selftest measures what the search finds.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import strategies as st

from paracheck.cases import Case, GroupSpec, OptimizerSpec
from paracheck.strategies._core import (
    cases,
    nominal_dtype,
    optimizer_specs,
    sharding_clip_norm_for_seed,
    with_precision,
)
from paracheck.strategies._reshard import reshard_draws, resumed_by_seed
from paracheck.workloads import MLPSpec, build_model

__all__ = ["count_partition_cases", "sharding_cases"]

# The model of Note [A partition by count], and the world sizes (in order of preference) at which
# a partition of it by count breaks the balance bound.
_COUNT_PARTITION_MODEL = MLPSpec(in_features=8, widths=(8, 8, 8, 1, 1), bias=True)
_COUNT_PARTITION_SIZES = (2, 4)


def count_partition_cases(*, world_sizes, precision: str = "fp64") -> tuple[tuple[str, Case], ...]:
    """The case a ``sharded`` check runs first (Note [A partition by count]), with why it is run:
    at world size 2, else 4, of ``world_sizes``; in the setting of ``precision`` its seed picks
    (Note [Precision from the seed]). None where neither size is drawn."""
    sizes = set(world_sizes)
    w = next((w for w in _COUNT_PARTITION_SIZES if w in sizes), None)
    if w is None:
        return ()
    case = Case(
        model=_COUNT_PARTITION_MODEL,
        world_size=w,
        batch_sizes=(1,) * w,
        steps=3,
        optimizer=OptimizerSpec(name="adam", groups=(GroupSpec(params=(), lr=1e-3),)),
        seed=0,
        dtype=nominal_dtype(precision),
    )
    why = (
        "a case built to break a partition of the parameters by count, whatever their sizes "
        "(round-robin, or contiguous runs)"
    )
    return ((why, with_precision(case, precision, adam=True)),)


def _n_params(spec) -> int:
    return len(list(build_model(spec, seed=0).parameters()))


@st.composite
def sharding_cases(
    draw,
    *,
    world_sizes=None,
    min_world_size: int = 1,
    max_world_size: int = 6,
    max_steps: int = 4,
    dtype: str = "float64",
    precision: str | None = None,
):
    """Cases with more parameter groups and late ``add_param_group`` calls than ``cases``;
    ``precision`` as for ``cases`` (it replaces ``dtype``)."""
    if not isinstance(max_steps, int) or max_steps < 2:
        raise ValueError(
            f"max_steps={max_steps!r} must be an int >= 2 (a late group needs a step before it)"
        )
    kw = (
        {"world_sizes": world_sizes}
        if world_sizes is not None
        else {"min_world_size": min_world_size, "max_world_size": max_world_size}
    )
    if precision is not None:
        dtype = nominal_dtype(precision)
    # Not drawn here: finish once after several backward passes, double backward, float32 layers in
    # float64 models and unbounded buckets (the DDP protocol's corners; Zero1 takes one dtype).
    case = draw(
        cases(
            max_steps=max_steps,
            dtype=dtype,
            finish_once=False,
            double_backward=False,
            mixed_dtypes=False,
            unbounded_buckets=False,
            **kw,
        )
    )
    opt = case.optimizer
    groups = list(opt.groups)
    n = _n_params(case.model)
    if len(groups) == 1 and n >= 2 and draw(st.booleans()):
        idx = groups[0].params or tuple(range(n))
        if len(idx) >= 2:
            cut = draw(st.integers(1, len(idx) - 1))
            sgd = opt.name == "sgd"
            second = GroupSpec(
                params=idx[cut:],
                lr=draw(st.sampled_from([0.02, 0.2] if sgd else [3e-3, 3e-2])),
                weight_decay=draw(st.sampled_from([0.0, 0.05])),
                momentum=draw(st.sampled_from([0.0, 0.5])) if sgd else 0.0,
                betas=draw(st.sampled_from([(0.9, 0.999), (0.5, 0.9)])),
            )
            groups = [replace(groups[0], params=idx[:cut]), second]
    steps = case.steps
    if (
        len(groups) > 1 and draw(st.integers(0, 2)) > 0
    ):  # two in three: late groups are where sharding breaks
        steps = max(steps, 2)
        groups = [groups[0]] + [
            replace(g, add_at_step=draw(st.integers(1, steps - 1))) for g in groups[1:]
        ]
    elif any(g.add_at_step is not None for g in groups):
        steps = max(steps, 2)
    opt = replace(opt, groups=tuple(groups), as_generator=opt.as_generator and len(groups) == 1)
    # Drawn after the groups, so that the draws before are those of the plain sharding cases.
    if draw(st.integers(0, 3)) == 3:
        # One layer, one or two parameters: more ranks than parameters once W >= 2 or 3.
        tiny = MLPSpec(
            in_features=draw(st.integers(1, 3)),
            widths=(draw(st.integers(1, 3)),),
            bias=draw(st.booleans()),
        )
        case, opt = (
            replace(case, model=tiny),
            draw(optimizer_specs(n_params=_n_params(tiny), late_groups=False)),
        )
        groups = list(opt.groups)
    late = any(g.add_at_step is not None for g in groups)
    scheduler = draw(st.sampled_from([None, "step"] if late else [None, "step", "lambda"]))
    opt = replace(opt, scheduler=scheduler, groups_as_generators=draw(st.booleans()))
    closure = draw(st.booleans())
    reload_at = draw(st.integers(1, steps - 1)) if steps >= 2 and draw(st.booleans()) else None
    case = replace(
        case,
        steps=steps,
        optimizer=opt,
        closure=closure,
        reload_at_step=reload_at,
        # Three seed values in four clip here (Note [Clip from the seed]): a sharded design's clipping
        # is its own code, and half missed a ZeRO-1 clipping by its own chunk's norm in 37 cases.
        clip_norm=None if closure else sharding_clip_norm_for_seed(case.seed),
    )
    if case.model.kind == "mlp" and case.model.unused == "none" and draw(st.integers(0, 2)) == 0:
        case = _with_idle_parameters(case)
    # Drawn last, so that the draws before are those of the plain sharding cases (Note [Resuming
    # at another world size] in paracheck.check.properties.reshard), and saved by two ranks or
    # more: one rank's state_dict() cannot say whether it is consolidated or its own shard.
    if case.steps >= 2 and case.world_size >= 2 and draw(st.booleans()):
        case = replace(case, **draw(reshard_draws(case, **kw)))
    if precision is not None:
        case = with_precision(case, precision, adam=True)  # Note [Precision from the seed]
    if case.dtype == "bfloat16":
        # Saving and loading float32 masters needs a resumed bfloat16 case, which the resume drawn
        # last met late: in a selftest search of 40 cases at world sizes 1..4, a ZeRO-1 that
        # rebuilt its masters from the parameters when the world size changed met its first at
        # the 37th case, or none. One bfloat16 case in two is resumed by its seed, without a draw.
        case = resumed_by_seed(case, **kw)
    return case


def _with_idle_parameters(case):
    """``case`` with a branch no rank ever uses, its parameters in the first group, which gets
    weight decay: a parameter without a gradient anywhere must not be stepped, and weight decay is
    what moves a parameter stepped with a zero gradient and fresh optimizer state. In one in three
    cases: at one in six (the plain draw of an always-unused branch with weight decay), a ZeRO-1
    that steps every piece with zeros survived 40 derandomised examples at world sizes 1..4."""
    n = _n_params(case.model)
    model = replace(case.model, unused="always")
    added = tuple(range(n, _n_params(model)))
    opt = case.optimizer
    first, *rest = opt.groups
    first = replace(
        first,
        params=first.params + added if first.params else (),
        weight_decay=first.weight_decay or 0.1,
    )
    return replace(case, model=model, optimizer=replace(opt, groups=(first, *rest)))
