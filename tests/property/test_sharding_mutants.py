"""Every planted sharding bug in paracheck.mutants.sharding is killed by the default check, each
protocol-specific one by a case that exercises its protocol (and by none without it)."""

from dataclasses import replace

import pytest

from paracheck.check.property import check_target
from paracheck.check.targets import Target
from paracheck.mutants import MUTANTS
from paracheck.strategies._sharding import sharding_cases
from paracheck.workloads import build_model

SHARDING = [m for m in MUTANTS.values() if m.path.startswith("paracheck.mutants.sharding:")]
# Every sharding bug here shows at two to four ranks; the correct designs are checked up to the
# session's largest world (test_sharding.py). Five- and six-rank cases cost most on two cores.
SIZES = (1, 2, 3, 4)

# The bugs that train correctly: only the named property can see them.
ONLY_SEEN_BY = {
    "sharded-count-partition": "balance",
    "sharded-no-shard": "memory",
    "sharded-no-shard-undeclared": "memory",
    "zero2-full-buffer-kept": "grads-sharded",
    "zero2-grads-zeroed-not-freed": "grads-sharded",
}


def _first_group_trainable(case) -> int:
    """Trainable parameters in the first group given at construction."""
    params = list(build_model(case.model, seed=0).parameters())
    first = next(g for g in case.optimizer.groups if g.add_at_step is None)
    return sum(params[i].requires_grad for i in first.params)


def _reloads(case) -> bool:
    """Whether ``case`` loads a state dict: a reload, or a resume at another world size."""
    return case.reload_at_step is not None or case.reshard_at_step is not None


# What the shrunk failing case of each protocol mutant must contain, and the protocol turned off
# (None: the bug needs a corner that cannot be turned off alone).
NEEDS = {
    "sharded-zero-grad-local-shard": (lambda c: c.steps >= 2 and c.world_size >= 2, None),
    "sharded-lr-synced-backwards": (
        lambda c: c.optimizer.scheduler is not None or c.optimizer.lr_decay != 1.0,
        lambda c: replace(c, optimizer=replace(c.optimizer, scheduler=None, lr_decay=1.0)),
    ),
    "sharded-group-generators-consumed": (
        lambda c: c.optimizer.groups_as_generators,
        lambda c: replace(c, optimizer=replace(c.optimizer, groups_as_generators=False)),
    ),
    # Some rank owns none of the first group (fewer trainable parameters than ranks), or a
    # reload: the local optimizer built from a bare list has groups without the defaults, and
    # after load_state_dict() its step raises KeyError 'eps' (a shrink cut short by a loaded
    # machine's 2 s ended on such a case, W = 2, one parameter per rank in the first group).
    "sharded-empty-shard-raises": (
        lambda c: _first_group_trainable(c) < c.world_size or _reloads(c),
        None,
    ),
    "sharded-closure-ignored": (lambda c: c.closure, lambda c: replace(c, closure=False)),
    "sharded-load-state-dict-skips-wrapped": (
        _reloads,
        lambda c: replace(c, reload_at_step=None, reshard_at_step=None),
    ),
    "sharded-masters-not-saved": (_reloads, None),
}


def test_sharding_catalogue_has_at_least_six_bugs():
    """The catalogue holds at least six realistic sharding bugs."""
    assert len(SHARDING) >= 6


@pytest.mark.parametrize("mutant", SHARDING, ids=lambda m: m.name)
def test_sharding_mutant_is_killed(world, mutant):
    """The default check (generated cases, default properties) fails on the mutant; a protocol
    mutant's failing case exercises its protocol."""
    target = Target(mutant.name, mutant.path, mutant.kind)
    if mutant.properties is not None:
        # A reading of the interface the default properties accept: only the opt-in ones refuse it.
        passed = check_target(target, world, world_sizes=SIZES, max_examples=40, seed=0)
        assert passed.passed, passed.failure.describe()
        target = replace(target, properties=frozenset(mutant.properties))
    # The kill, its kind and the features of the failing case are asserted: shrinking beyond a
    # couple of seconds is the selftest's to show (test time).
    report = check_target(
        target,
        world,
        world_sizes=SIZES,
        max_examples=40,
        seed=0,
        shrink_seconds=2.0,
        precision=mutant.precision,  # a bug that shows below float32 only is drawn there
    )
    assert not report.passed, f"{mutant.name} survived {report.examples} cases: {mutant.bug}"
    failure = report.failure
    if mutant.name in ONLY_SEEN_BY:
        assert failure.divergence is not None, failure.describe()
        assert failure.divergence.what == ONLY_SEEN_BY[mutant.name], failure.describe()
    if mutant.properties is not None:
        assert failure.divergence is not None and failure.divergence.what in mutant.properties, (
            failure.describe()
        )
    if mutant.name in NEEDS:
        assert NEEDS[mutant.name][0](failure.case), failure.case.to_json()
    if mutant.expect == "raise":
        assert failure.error is not None, failure.describe()
    if mutant.name == "sharded-empty-shard-raises":
        # After a load, the local optimizer built from a bare list lacks its group's
        # hyper-parameters and raises KeyError on the first it reads ('eps' for Adam, 'dampening'
        # for SGD; which case the shrinking ends on depends on how far it got): NEEDS above.
        text = failure.describe()
        assert "optimizer got an empty parameter list" in text or (
            _reloads(failure.case)
            and ("KeyError: 'eps'" in text or "KeyError: 'dampening'" in text)
        ), text
    if mutant.name == "sharded-zero-grad-local-shard":
        assert failure.divergence is not None and failure.divergence.what == "grad", (
            failure.describe()
        )


@pytest.mark.parametrize("name", [n for n, (_, off) in NEEDS.items() if off is not None])
def test_protocol_mutant_survives_without_its_protocol(world, name):
    """The same generated cases with the mutant's protocol turned off pass: the protocol is what kills it."""
    mutant = MUTANTS[name]
    strategy = sharding_cases(world_sizes=SIZES).map(NEEDS[name][1])
    report = check_target(
        Target(mutant.name, mutant.path, mutant.kind),
        world,
        world_sizes=SIZES,
        max_examples=40,
        seed=0,
        strategy=strategy,
    )
    assert report.passed, report.failure.describe()
