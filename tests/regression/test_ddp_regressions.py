"""Pinned DDP cases, literal inputs, one bug or corner each.

* ``PINNED``: the shrunk counterexample the default check found for each DDP mutant
  (``tests/property/test_ddp_mutants.py``). Each must still kill its mutant, the way the mutant
  declares, so a change to the oracle, the comparison or the cases that blinds the check to that
  bug fails here by name; the hanging mutant is checked here rather than by its slow full run.
* ``CORNERS``: the hard DDP cases, built by hand (seeds chosen so that the
  data-dependent branch is used exactly where the name says; see ``_branch_use``).

Every correct variant (naive, flat, overlapped, bucketed, torch-ddp) must pass every case.
"""

from __future__ import annotations

import pytest
import torch

from paracheck.cases import Case, GroupSpec, OptimizerSpec, batch_for
from paracheck.check.run import run_case
from paracheck.check.targets import Target, resolve_target
from paracheck.mutants import MUTANTS
from paracheck.workloads import MLPSpec, ToySpec

_ADAM = OptimizerSpec(name="adam", groups=(GroupSpec(params=(), lr=1e-3),))
_MOMENTUM = OptimizerSpec(name="sgd", groups=(GroupSpec(params=(), lr=0.1, momentum=0.9),))
_BYTE = 1 / 2**20  # a 1-byte bucket cap: every parameter alone in its bucket


def _shrunk(**kw) -> Case:
    """The shape every shrunk DDP counterexample shares: a 1x1 MLP on 2 ranks, one step, Adam."""
    model = MLPSpec(**{"in_features": 1, "widths": (1,), "bias": False, **kw.pop("model", {})})
    base = dict(
        model=model,
        world_size=2,
        batch_sizes=(1, 1),
        steps=1,
        optimizer=_ADAM,
        bucket_size_mb=_BYTE,
        set_to_none=False,
    )
    base.update(kw)
    return Case(**base)


PINNED: dict[str, Case] = {
    "ddp-no-divide": _shrunk(),
    "ddp-vectors-not-averaged": _shrunk(model={"bias": True}),
    "ddp-last-bucket-never-reduced": _shrunk(
        bucket_size_mb=9 / 2**20
    ),  # one 8-byte parameter, 9-byte cap
    "ddp-oversized-param-dropped": _shrunk(),
    "ddp-no-initial-broadcast": _shrunk(rank_dependent_init=True),
    "ddp-buffers-not-broadcast": _shrunk(model={"buffer": True}, rank_dependent_init=True),
    "ddp-missing-wait": _shrunk(),
    "ddp-partial-copy-back": _shrunk(),
    "ddp-skip-none-grad": _shrunk(model={"unused": "data"}, world_size=3, batch_sizes=(1, 1, 1)),
    "ddp-accumulation-reduced-twice": _shrunk(accumulation=2),
    "ddp-hooks-registered-twice": _shrunk(model={"tied": True}),
    "ddp-flags-averaged": _shrunk(model={"unused": "data"}, world_size=3, batch_sizes=(1, 1, 1)),
    # The branch runs in micro-step 0 (inside no_sync()) only: its gradient exists by accumulation.
    "ddp-presence-from-hooks": _shrunk(
        model={"widths": (1, 1), "tied": True, "unused": "data"},
        world_size=1,
        batch_sizes=(1,),
        accumulation=2,
        no_sync=True,
        seed=1,
    ),
    "ddp-readiness-per-step": _shrunk(double_backward=True),
    "ddp-handles-per-step": _shrunk(accumulation=2, finish_once=True, unbounded_bucket=True),
    "ddp-round-starts-in-forward": _shrunk(double_backward=True),
    # Four 8-byte parameters under an 8-byte cap: at least three buckets; one, and its flags, sent.
    "ddp-bucket-cap-ignored": _shrunk(model={"widths": (1, 1, 1, 1)}, bucket_size_mb=8 / 2**20),
    # Six 8-byte parameters under a 48-byte cap: one bucket's worth, sent in six calls.
    "ddp-bucket-cap-in-bytes": _shrunk(
        model={"widths": (1, 1, 1), "bias": True}, bucket_size_mb=48 / 2**20
    ),
    "ddp-mixed-dtype-bucket": _shrunk(
        model={"tied": True, "float32_layer": 0},
        world_size=1,
        batch_sizes=(1,),
        unbounded_bucket=True,
    ),
    "ddp-flat-buffer-first-dtype": _shrunk(model={"widths": (1, 1), "float32_layer": 0}),
}

# Races by nature: an un-waited all-reduce, a round settled too late, or a later backward adding
# into a buffer whose all-reduce is in flight can land in time, and then the result is right.
_RACY = {"ddp-missing-wait", "ddp-round-starts-in-forward", "ddp-handles-per-step"}

_BRANCHY = MLPSpec(in_features=2, widths=(3,), bias=True, unused="data")

CORNERS: dict[str, Case] = {
    # Step 0: only rank 1 uses the branch; step 1: ranks 0 and 2. No rank may hang, and the
    # gradient is the average with zeros from the ranks that did not use it.
    "branch-on-some-ranks": Case(
        model=_BRANCHY,
        world_size=3,
        batch_sizes=(1, 2, 1),
        steps=2,
        optimizer=_MOMENTUM,
        seed=135,
        bucket_size_mb=_BYTE,
    ),
    # no_sync(): rank 0 uses the branch in micro-step 0 only, rank 1 never; then nobody in step 1
    # (its gradient must go back to None, momentum must not move it).
    "branch-only-inside-no-sync": Case(
        model=_BRANCHY,
        world_size=2,
        batch_sizes=(2, 1),
        steps=2,
        accumulation=2,
        no_sync=True,
        optimizer=_MOMENTUM,
        seed=480,
        bucket_size_mb=1.0,
    ),
    # Accumulation without no_sync(): micro-step 0 rank 0 only, micro-step 1 rank 1 only.
    "branch-alternating-micro-steps": Case(
        model=_BRANCHY,
        world_size=2,
        batch_sizes=(1, 1),
        steps=1,
        accumulation=2,
        optimizer=_MOMENTUM,
        seed=36,
        bucket_size_mb=40 / 2**20,
    ),
    # A parameter larger than the cap next to ones that share a bucket, zero_grad to zeros.
    "param-larger-than-cap": Case(
        model=MLPSpec(in_features=5, widths=(4, 1), bias=True),
        world_size=4,
        batch_sizes=(1, 2, 3, 1),
        steps=3,
        optimizer=_ADAM,
        bucket_size_mb=40 / 2**20,
        set_to_none=False,
    ),
    # CS336's tied toy model, frozen bias and fixed parameter included, from different weights.
    "tied-toy-rank-dependent-init": Case(
        model=ToySpec(tied=True),
        world_size=2,
        batch_sizes=(2, 3),
        steps=2,
        optimizer=_ADAM,
        rank_dependent_init=True,
        bucket_size_mb=0.001,
    ),
    # Never-used branch and zero_grad(set_to_none=False): its gradient stays None throughout.
    "always-unused-set-to-zeros": Case(
        model=MLPSpec(in_features=2, widths=(2,), unused="always", buffer=True),
        world_size=6,
        batch_sizes=(1,) * 6,
        steps=2,
        accumulation=2,
        optimizer=OptimizerSpec(
            name="adamw", groups=(GroupSpec(params=(), lr=1e-2, weight_decay=0.1),)
        ),
        set_to_none=False,
        rank_dependent_init=True,
        bucket_size_mb=1.0,
    ),
    # A float32 layer in a float64 model on three ranks, one finish after two backward passes:
    # the float64 tensors must meet float64's tolerance at step 0 and inherit float32's after it.
    "mixed-dtypes-finish-once": Case(
        model=MLPSpec(in_features=3, widths=(4, 3, 2), bias=True, float32_layer=1),
        world_size=3,
        batch_sizes=(1, 2, 1),
        steps=3,
        accumulation=2,
        finish_once=True,
        optimizer=_ADAM,
        bucket_size_mb=64 / 2**20,
        set_to_none=False,
    ),
}

_CORRECT = ["naive", "flat", "overlapped", "bucketed", "torch-ddp"]


def _branch_use(case: Case) -> list[list[list[bool]]]:
    """[step][micro][rank]: whether the data-dependent branch runs (first input positive)."""
    return [
        [
            [bool(batch_for(case, s, m, r)[0][0, 0] > 0) for r in range(case.world_size)]
            for m in range(case.accumulation)
        ]
        for s in range(case.steps)
    ]


def test_corner_seeds_still_select_their_branch_pattern():
    """The hand-picked seeds still produce the branch use the corner names describe."""
    assert _branch_use(CORNERS["branch-on-some-ranks"]) == [
        [[False, True, False]],
        [[True, False, True]],
    ]
    assert _branch_use(CORNERS["branch-only-inside-no-sync"]) == [
        [[True, False], [False, False]],
        [[False, False], [False, False]],
    ]
    assert _branch_use(CORNERS["branch-alternating-micro-steps"]) == [
        [[True, False], [False, True]]
    ]
    assert _branch_use(PINNED["ddp-presence-from-hooks"]) == [[[True], [False]]]


@pytest.mark.parametrize("name", sorted(PINNED))
def test_pinned_counterexample_kills_mutant(world, name):
    """The mutant's shrunk counterexample still exposes it, as a divergence or a hang."""
    m = MUTANTS[name]
    target = Target(m.name, m.path, m.kind, resolve_target(m.path).takes_bucket)
    # A race (_RACY) sometimes gives the right result (a missing wait: two runs in three passed on
    # this case on a machine with 4 busy processes per core, where the presence flags' all-reduce
    # is launched between the bucket's and the division; a round settled at the next forward: one
    # in three). Thirty runs make a miss a ~5e-6 event; a kill usually comes within three.
    for _ in range(30 if name in _RACY else 1):
        result = run_case(world, target, PINNED[name])
        if not result.ok:
            break
    assert not result.ok, f"{name} passes its own counterexample: {m.bug}"
    if m.expect == "hang":
        assert result.error is not None and result.error.kind == "hung", result.describe()
        assert any(
            f.kind == "hung" and f.collective == "all_reduce" for f in result.error.failures
        ), result.describe()
    elif m.expect == "raise":
        assert result.error is not None and result.error.kind == "raised", result.describe()
    else:
        assert result.divergence is not None, result.describe()


@pytest.mark.parametrize("name", sorted(CORNERS) + sorted(PINNED))
@pytest.mark.parametrize("target", _CORRECT)
def test_correct_variant_passes_pinned_case(world, target, name):
    """Every correct DDP variant equals the oracle on every pinned case."""
    case = CORNERS.get(name) or PINNED[name]
    result = run_case(world, resolve_target(target), case)
    assert result.ok, result.describe()


def test_branch_gradient_is_none_where_no_rank_used_it():
    """On the no_sync corner the oracle itself has the branch gradient at step 0 and None at step 1
    (so the variants' agreement with it is about presence, not only values)."""
    from paracheck.check.run import oracle_for, param_names

    case = CORNERS["branch-only-inside-no-sync"]
    traj = oracle_for(case)
    names = param_names(case)
    i = names.index("branch.weight")
    assert traj.steps[0].grads[i] is not None and torch.count_nonzero(traj.steps[0].grads[i]) > 0
    assert traj.steps[1].grads[i] is None


def test_bucket_structure_kills_what_equivalence_misses(world):
    """The cap-ignored and cap-in-bytes mutants' gradients equal the oracle's: only bucket-structure fails."""
    for name in ("ddp-bucket-cap-ignored", "ddp-bucket-cap-in-bytes"):
        m = MUTANTS[name]
        result = run_case(world, Target(m.name, m.path, m.kind, True), PINNED[name])
        assert [d.what for d in result.divergences] == ["bucket-structure"], result.describe()


def test_case_json_without_protocol_fields_loads():
    """A case saved before finish_once, double_backward, unbounded_bucket and float32_layer loads with their defaults."""
    d = PINNED["ddp-no-divide"].to_dict()
    for key in ("finish_once", "double_backward", "unbounded_bucket"):
        d.pop(key)
    d["model"].pop("float32_layer")
    case = Case.from_dict(d)
    assert case == PINNED["ddp-no-divide"]
    assert not (
        case.finish_once
        or case.double_backward
        or case.unbounded_bucket
        or case.model.float32_layer
    )


def test_target_refusing_unbounded_bucket_is_skipped_not_failed(world):
    """A DDP whose constructor refuses bucket_size_mb=None has that case skipped, with the reason."""
    target = Target("refuses-none", "tests.regression._ddp_targets:RefusesNoneDDP", "ddp", True)
    result = run_case(world, target, _shrunk(unbounded_bucket=True))
    assert result.ok and "bucket_size_mb=None" in result.extra["skipped"], result.describe()
    assert run_case(world, target, _shrunk()).ok


def test_an_agreement_by_max_is_not_a_gradient_reduction(world):
    """A correct bucketed DDP that all-reduces one float32 flag by max after each synchronisation
    passes bucket-structure (Note [Bucket-structure rules]: a max cannot average a gradient); the
    same four bytes reduced by sum are counted, and go beyond the gradients and their flags."""
    case = _shrunk()
    for name, ok in (("MaxFlagDDP", True), ("SumFlagDDP", False)):
        target = Target(name, f"tests.regression._ddp_targets:{name}", "ddp", True)
        result = run_case(world, target, case)
        if ok:
            assert result.ok, result.describe()
        else:
            assert [d.what for d in result.divergences] == ["bucket-structure"], result.describe()
            assert "more bytes all-reduced than the trainable gradients" in result.describe()
