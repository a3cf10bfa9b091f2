"""Every DDP mutant in ``paracheck.mutants`` is killed by the default check, the way it declares.

The default check: ``check_target(..., world_sizes=(1, 2, 3, 4, 6), max_examples=40, seed=0)``
on the session World. Examples needed to kill, on CPU/gloo with the ci seed (2026-11-22):

    ddp-no-divide 2, ddp-vectors-not-averaged 10, ddp-last-bucket-never-reduced 3,
    ddp-oversized-param-dropped 2, ddp-no-initial-broadcast 6, ddp-buffers-not-broadcast 6,
    ddp-missing-wait 2, ddp-partial-copy-back 2, ddp-skip-none-grad 8 (hang, 285 s with shrinking),
    ddp-accumulation-reduced-twice 3, ddp-hooks-registered-twice 8, ddp-flags-averaged 8,
    ddp-presence-from-hooks 17; median 6. (The numbers move whenever the strategies or the
    driver change: Hypothesis's derandomised sequence depends on both.)

At world sizes 1..4 (2026-11-25, after the strategies drew finish-once, double backward, float32
layers, unbounded and realistic caps): ddp-no-divide 2, ddp-vectors-not-averaged 7,
ddp-last-bucket-never-reduced 3, ddp-oversized-param-dropped 5, ddp-no-initial-broadcast 3,
ddp-buffers-not-broadcast 8, ddp-missing-wait 2, ddp-partial-copy-back 2,
ddp-accumulation-reduced-twice 3, ddp-hooks-registered-twice 3, ddp-flags-averaged 17,
ddp-presence-from-hooks 16; the protocol mutants ddp-readiness-per-step 9, ddp-handles-per-step 7,
ddp-round-starts-in-forward 5; the bucket-structure mutants ddp-bucket-cap-ignored 6,
ddp-bucket-cap-in-bytes 9; the dtype mutants ddp-mixed-dtype-bucket 11 (raises),
ddp-flat-buffer-first-dtype 8.

``_SLOW_FULL``: mutants whose full check duplicates another's (the same protocol or dtype bug in
a sibling variant) run with ``-m slow`` only, to keep the default run short; their pinned shrunk
cases run by default (``tests/regression/test_ddp_regressions.py``).

A hanging mutant costs the hang timeout for its first failure and again for every shrink step
that still hangs (about five minutes at a 10 s timeout): its full check is marked ``slow``; the
default run replays its pinned shrunk case (``tests/regression/test_ddp_regressions.py``).
"""

from __future__ import annotations

import pytest

from paracheck.check.property import check_target
from paracheck.mutants import MUTANTS
from paracheck.selftest import mutant_target

_DDP = sorted(m.name for m in MUTANTS.values() if m.kind == "ddp")
_SLOW_FULL = {"ddp-handles-per-step", "ddp-flat-buffer-first-dtype"}
# Mutants of an opt-in or declared property, killed (and shown to pass the rest) in its own tests.
_OWN_TESTS = {
    "ddp-arrival-order": "test_repeatability.py",
    "ddp-cast-after-communicating": "test_reduce_dtype.py",
    # Compiled cases only, killed by compile-ledger alone: on a pinned compiled case there, and
    # by the default check's first case (below).
    "ddp-hooks-compiled-away": "test_compiled.py",
    "ddp-synced-when-compiled": "test_compiled.py",
}
_FAST = [
    n for n in _DDP if MUTANTS[n].expect != "hang" and n not in _SLOW_FULL and n not in _OWN_TESTS
]
_HANGING = [n for n in _DDP if MUTANTS[n].expect == "hang"]


def _kill(world, world_sizes, name, record_property):
    m = MUTANTS[name]
    target = mutant_target(m)
    # The kill and the kind of failure are what is asserted: the shrinking beyond a couple of
    # seconds is the selftest's to show (test time).
    report = check_target(
        target,
        world,
        world_sizes=world_sizes,
        max_examples=40,
        seed=0,
        precision=m.precision,
        shrink_seconds=2.0,
    )
    assert not report.passed, f"{name} survived 40 examples: {m.bug}"
    record_property("examples_to_kill", report.examples)
    failure = report.failure
    if m.expect == "diverge":
        assert failure.divergence is not None, failure.describe()
    else:
        kind = {"hang": "hung", "raise": "raised"}[m.expect]
        assert failure.error is not None and failure.error.kind == kind, failure.describe()
    return report


def test_catalogue_has_at_least_nine_ddp_mutants():
    """The DDP catalogue holds the original no-divide mutant and at least eight more."""
    assert "ddp-no-divide" in _DDP and len(_DDP) >= 9


@pytest.mark.parametrize("name", _FAST)
def test_ddp_mutant_is_killed(world, paracheck_world_sizes, name, record_property):
    """The default check kills the mutant with a shrunk counterexample of the declared kind."""
    _kill(world, paracheck_world_sizes, name, record_property)


@pytest.mark.slow(reason="slow (its sibling's full check runs by default): run with -m slow")
@pytest.mark.parametrize("name", sorted(_SLOW_FULL))
def test_duplicate_ddp_mutant_is_killed(world, paracheck_world_sizes, name, record_property):
    """The default check kills the mutant whose bug a sibling's full check already covers."""
    _kill(world, paracheck_world_sizes, name, record_property)


@pytest.mark.slow(
    reason="slow (every shrink step that hangs costs the hang timeout): run with -m slow"
)
@pytest.mark.parametrize("name", _HANGING)
def test_hanging_ddp_mutant_is_killed(world, paracheck_world_sizes, name, record_property):
    """The default check kills a hanging mutant as a hang, naming the ranks and the collective."""
    report = _kill(world, paracheck_world_sizes, name, record_property)
    assert any(f.kind == "hung" for f in report.failure.error.failures)


@pytest.mark.parametrize("name", ["ddp-synced-when-compiled", "ddp-hooks-compiled-away"])
def test_a_compiled_protocol_bug_is_killed_by_the_case_run_first(world, name):
    """A DDP that honours no_sync() only eagerly passed the 40 derandomised cases of a default
    check at world sizes 1-4 (three compiled, none under no_sync()); the compiled case the ddp
    kind runs first (in the verdict table, and in a search of the whole contract that asks for it,
    as the selftest does) (Note [A compiled case under no_sync()] in ``paracheck.strategies._first``)
    kills it, and a DDP whose hooks compiling folds away, by compile-ledger alone."""
    report = check_target(
        mutant_target(MUTANTS[name]),
        world,
        world_sizes=(1, 2, 3, 4),
        max_examples=40,
        seed=0,
        shrink_seconds=2.0,
        first_cases=True,
    )
    assert not report.passed, f"{name} survived"
    first = report.failures[0]
    assert first.property == "compile-ledger", first.result.describe()
    assert first.result.case.compiled is not None and first.result.case.no_sync, first.result.case
