"""Cases for optimizer-state sharding: ``cases()`` pushed toward the corners sharding bugs live in.

Sharding bugs hide in parameter groups (hyper-parameters lost or mixed up when the wrapped
optimizer is built) and in ``add_param_group`` during training (a group no rank owns). ``cases``
draws one group most of the time and a late group after step 1 only, rarely (0 of 40 derandomised
examples with one seed): too rarely for a default check to kill those bugs. ``sharding_cases``
composes ``cases`` and, each by a boolean that shrinks to "off":

* splits a single group in two at a drawn parameter, the second with its own lr / weight decay /
  betas / momentum;
* makes every group after the first a late group, added just before a drawn step
  ``k in 1..steps-1`` (so state built before it keeps being stepped after it), with at least two
  and at most ``max_steps`` steps.

Everything else (SGD with/without momentum, Adam, AdamW, lr schedules, frozen, tied and unused
parameters, one-parameter models on up to six ranks) is ``cases``'s.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import strategies as st

from paracheck.cases import GroupSpec
from paracheck.strategies._core import cases
from paracheck.workloads import build_model

__all__ = ["sharding_cases"]


def _n_params(spec) -> int:
    return len(list(build_model(spec, seed=0).parameters()))


@st.composite
def sharding_cases(draw, *, world_sizes=None, min_world_size: int = 1, max_world_size: int = 6, max_steps: int = 4,
                   dtype: str = "float64"):
    """Cases with more parameter groups and late ``add_param_group`` calls than ``cases``."""
    if not isinstance(max_steps, int) or max_steps < 2:
        raise ValueError(f"max_steps={max_steps!r} must be an int >= 2 (a late group needs a step before it)")
    kw = {"world_sizes": world_sizes} if world_sizes is not None else {
        "min_world_size": min_world_size, "max_world_size": max_world_size}
    case = draw(cases(max_steps=max_steps, dtype=dtype, **kw))
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
    if len(groups) > 1 and draw(st.booleans()):
        steps = max(steps, 2)
        groups = [groups[0]] + [replace(g, add_at_step=draw(st.integers(1, steps - 1))) for g in groups[1:]]
    elif any(g.add_at_step is not None for g in groups):
        steps = max(steps, 2)
    return replace(case, steps=steps, optimizer=replace(opt, groups=tuple(groups), as_generator=(
        opt.as_generator and len(groups) == 1)))
