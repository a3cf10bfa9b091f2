"""Note [A parameter no rank reached]: under ``zero_grad(set_to_none=False)`` a parameter no rank's
backward reached may be stepped with its zero gradient (single-process training, the built-ins) or
skipped as if its gradient were None (a ZeRO-1 that frees every ``.grad`` and records which
parameters some rank gave one), and nothing else: skipping one that some rank used fails.

The case (``cases/unreached_late_group.json``): world size 2, SGD, ``branch.weight`` in a group
with weight decay added at step 3, ``set_to_none=False``, ``zero_grad_module``; the branch is used
by rank 0 at steps 0 and 2, by rank 1 at step 1, and by no rank at step 3. At seed 24 and six
steps, by no rank at steps 0, 3 and 5: a ZeRO-1 design skips it at step 3 and steps it at step 5.
"""

import json
import os
from dataclasses import replace

import pytest
import torch

from paracheck.cases import Case
from paracheck.check.properties import Divergence
from paracheck.check.properties.reading import on_its_reading
from paracheck.check.run import run_case
from paracheck.check.targets import Target, resolve_target
from paracheck.oracle import train

CASES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cases")
BRANCH = 2  # branch.weight, the parameter of the late group
UNREACHED_AT = 3  # the step no rank's backward reaches it


def _case(optimizer: str = "sgd", momentum: float = 0.0, added_at: int = UNREACHED_AT) -> Case:
    with open(os.path.join(CASES, "unreached_late_group.json")) as f:
        case = Case.from_dict(json.load(f))
    opt = case.optimizer
    groups = tuple(replace(g, momentum=momentum) for g in opt.groups)
    groups = groups[:-1] + (replace(groups[-1], add_at_step=added_at),)
    return replace(case, optimizer=replace(opt, name=optimizer, groups=groups))


# The branch's group added at step 3 (the case that failed), or at step 1 for the optimizers with
# state, whose state the step with a zero gradient then moves.
VARIANTS = {
    "sgd": _case(),
    "sgd-momentum": _case(momentum=0.9, added_at=1),
    "adam": _case("adam", added_at=1),
}
# Seed 24, six steps: the branch used at steps 1, 2 and 4 only.
MIXED = replace(_case(), seed=24, steps=6)
CORPUS = {
    "OwnerZeRO1": Target("OwnerZeRO1", "corpus.zero1_owner_rs:OwnerZeRO1", "zero"),
    "SyncInStepZeRO1": Target(
        "SyncInStepZeRO1", "corpus.zero1_sync_in_step:SyncInStepZeRO1", "zero"
    ),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_the_readings_differ_only_where_no_rank_reached(variant):
    """The oracle stepping the branch at step 3 and the one skipping it agree up to that step,
    and differ there in the branch alone: the case tells the readings apart."""
    case = VARIANTS[variant]
    stepping, skipping = (
        train(case),
        train(case, skip_unreached=frozenset({(UNREACHED_AT, BRANCH)})),
    )
    assert [s.unreached for s in stepping.steps] == [(), (), (), (BRANCH,)]
    assert skipping.steps[UNREACHED_AT].grads[BRANCH] is None
    zeros = torch.zeros(2, 2, dtype=torch.float64)
    assert torch.equal(stepping.steps[UNREACHED_AT].grads[BRANCH], zeros)
    for k in range(UNREACHED_AT):
        for a, b in zip(stepping.steps[k].params, skipping.steps[k].params):
            assert torch.equal(a, b)
    after = [
        not torch.equal(a, b)
        for a, b in zip(stepping.steps[UNREACHED_AT].params, skipping.steps[UNREACHED_AT].params)
    ]
    assert after == [False, False, True]


def test_a_pair_that_was_reached_is_refused():
    """``train``'s ``skip_unreached`` names only pairs no rank reached: the branch at step 1 was."""
    with pytest.raises(ValueError, match=r"skip_unreached=\[\(1, 2\)\] names \[\(1, 2\)\]"):
        train(VARIANTS["sgd"], skip_unreached=frozenset({(1, BRANCH)}))


@pytest.mark.parametrize("design", sorted(CORPUS))
def test_a_design_may_skip_at_one_step_and_step_at_another(world, design):
    """The readings are chosen per parameter and step: the ZeRO-1 designs skip the branch at step
    3 (their owner never stepped it) and step its zero gradient at step 5 (their ``step()`` left
    a gradient that ``zero_grad()`` zeroed), and pass."""
    assert [s.unreached for s in train(MIXED).steps] == [(), (), (), (BRANCH,), (), (BRANCH,)]
    result = run_case(world, CORPUS[design], MIXED)
    assert result.ok, result.describe()


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("design", sorted(CORPUS))
def test_a_design_that_skips_a_parameter_no_rank_reached_passes(world, design, variant):
    """Reading "skip": the ZeRO-1 designs that free every ``.grad`` equal the oracle that skips
    the branch at step 3 (they failed ``parameters`` there against the stepping oracle)."""
    result = run_case(world, CORPUS[design], VARIANTS[variant])
    assert result.ok, result.describe()


@pytest.mark.parametrize("design", sorted(CORPUS))
def test_a_skipped_parameter_has_no_optimizer_state(world, design):
    """Adam's step of a zero gradient leaves the parameter where it was and creates its state;
    skipped, the parameter has none, and only the state tells the readings apart (the union of
    the ranks' states chooses the reading too): one rank, the branch's group added at step 1,
    when the rank does not use it (``cases/unreached_adam_state.json``, the shrunk case that
    failed ``optimizer-state`` in ``+unused-some-ranks``)."""
    with open(os.path.join(CASES, "unreached_adam_state.json")) as f:
        case = Case.from_dict(json.load(f))
    stepping, skipping = train(case), train(case, skip_unreached=frozenset({(1, 1)}))
    assert torch.equal(stepping.steps[1].params[1], skipping.steps[1].params[1])
    assert 1 in stepping.steps[1].state and 1 not in skipping.steps[1].state
    result = run_case(world, CORPUS[design], case)
    assert result.ok, result.describe()


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("builtin", ["zero1", "zero2", "bucketed", "torch-ddp", "sharded"])
def test_a_design_that_steps_a_parameter_no_rank_reached_passes(world, builtin, variant):
    """Reading "step": the built-ins, which keep the zero tensor ``zero_grad()`` left, equal the
    single-process oracle. (A DDP's optimizer clears only its groups' gradients; a ZeRO kind's
    ``zero_grad()`` clears the whole module whatever the case says.)"""
    case = replace(VARIANTS[variant], zero_grad_module=False)
    assert train(case).steps[UNREACHED_AT].unreached == (BRANCH,)
    result = run_case(world, resolve_target(builtin), case)
    assert result.ok, result.describe()


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_skipping_a_parameter_some_rank_used_fails(world, variant):
    """A ZeRO-1 whose owner skips a parameter that only another rank used fails ``parameters``
    where it skips it: rank 0 owns the branch, which rank 1 alone uses at step 1."""
    mutant = Target(
        "OwnerPresenceZeRO1", "tests.regression._unreached_targets:OwnerPresenceZeRO1", "zero"
    )
    case = VARIANTS[variant]
    if case.optimizer.groups[-1].add_at_step != 1:  # in the optimizer while rank 1 alone uses it
        case = replace(case, optimizer=_case(case.optimizer.name, added_at=1).optimizer)
    result = run_case(world, mutant, case)
    assert not result.ok
    d = result.divergence
    assert (d.what, d.name, d.step) == ("param", "branch.weight", 1), result.describe()


def _divergence(step: int) -> Divergence:
    return Divergence(step, "param", 0, BRANCH, "branch.weight", 1.0, 0.0)


def test_the_choices_are_searched_in_step_order():
    """``on_its_reading``: the stepping trajectory where it passes or holds no unreached
    parameter (no other oracle is trained), else the first choices that match, else the
    trajectory that diverged latest (the stepping one at a tie)."""
    case = MIXED
    stepping = train(case)
    trained = []

    def skipping(pairs):
        trained.append(pairs)
        return train(case, skip_unreached=pairs)

    def judged(verdicts):
        return lambda traj: (verdicts.get(traj.skipped_unreached), 0.0)

    def never(pairs):
        raise AssertionError(f"trained the oracle skipping {pairs}")

    assert on_its_reading(stepping, judged({}), never)[0] is stepping
    to_none = train(replace(case, set_to_none=True))
    assert not any(s.unreached for s in to_none.steps)
    assert on_its_reading(to_none, judged({frozenset(): _divergence(3)}), never)[1].step == 3
    # The design of the test above: skipped at step 3, stepped at step 5.
    at3, at5 = (UNREACHED_AT, BRANCH), (5, BRANCH)
    verdicts = {
        frozenset(): _divergence(3),
        frozenset({at3}): None,
        frozenset({at3, at5}): _divergence(5),
    }
    chosen = on_its_reading(stepping, judged(verdicts), skipping)
    assert chosen[0].skipped_unreached == {at3} and chosen[1] is None
    assert trained == [frozenset({at3})]
    # A bug at step 4 after the skip at step 3: reported there, against the skipping oracle.
    trained.clear()
    verdicts = {
        frozenset(): _divergence(3),
        frozenset({at3}): _divergence(4),
        frozenset({at3, at5}): _divergence(4),
    }
    chosen = on_its_reading(stepping, judged(verdicts), skipping)
    assert (chosen[0].skipped_unreached, chosen[1].step) == ({at3}, 4)
    assert trained == [frozenset({at3})]  # step 5's choice cannot change step 4
    tie = {frozenset(): _divergence(3), frozenset({at3}): _divergence(3)}
    assert on_its_reading(stepping, judged(tie), skipping)[0] is stepping
    # The state's union over ranks decides too: the equivalence family passes at both readings,
    # the union only where step 3 is skipped; the verdict returned is the equivalence family's.
    trained.clear()
    union = {frozenset(): _divergence(3)}
    chosen = on_its_reading(
        stepping,
        judged({}),
        skipping,
        union=lambda traj: union.get(traj.skipped_unreached),
    )
    assert chosen[0].skipped_unreached == {at3} and chosen[1] is None
    assert trained == [frozenset({at3})]
