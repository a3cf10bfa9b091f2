"""On GPUs: every built-in target equals the oracle over NCCL, in float64 and in float32.

Skipped (and counted by the plugin's end-of-session line) where fewer than W CUDA devices exist.
float32 uses the documented tolerance table (paracheck.oracle.tolerance.TOLERANCES).
W is ``PARACHECK_NCCL_WORLD`` (default 2, checked at world sizes 1 and 2); with W > 2 the
checked sizes are 3..W (1 and 2 are the default run's), e.g. ``PARACHECK_NCCL_WORLD=4``: 3, 4.
"""

import os

import pytest

from paracheck.check.kinds import KINDS
from paracheck.check.property import check_target
from paracheck.check.targets import BUILTIN_TARGETS, resolve_target
from paracheck.mutants import MUTANTS
from paracheck.selftest import mutant_target, selftest_settings

NCCL_WORLD = int(os.environ.get("PARACHECK_NCCL_WORLD", "2"))
if NCCL_WORLD < 2:
    raise ValueError(f"PARACHECK_NCCL_WORLD={NCCL_WORLD} must be >= 2")
SIZES = (1, 2) if NCCL_WORLD == 2 else tuple(range(3, NCCL_WORLD + 1))

pytestmark = [pytest.mark.gpu, pytest.mark.world_size(NCCL_WORLD)]


@pytest.fixture(scope="module")
def nccl_world():
    from paracheck.world import World

    w = World(NCCL_WORLD, backend="nccl", timeout=60)
    yield w
    w.close()


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("name", sorted(BUILTIN_TARGETS))
def test_builtin_matches_oracle_on_nccl(nccl_world, name, dtype):
    """Built-in target equals the oracle on SIZES GPUs (NCCL)."""
    report = check_target(
        resolve_target(name), nccl_world, world_sizes=SIZES, max_examples=25, seed=0, dtype=dtype
    )
    assert report.passed, report.failure.describe() + "\n" + report.failure.case.to_json()


# What a mutant needs that NCCL at SIZES lacks: summation order changes a float sum only from
# three addends (a + b == b + a); a float64 gradient truncated to float32 in a model of two dtypes
# is caught only where the ranks run the oracle's kernels, on the CPU (Note [Parameters of two
# dtypes] in paracheck.oracle.tolerance: on a GPU the float32 layer's own kernels differ from the
# CPU's by ~1e-7, so every tensor of such a model is judged at float32's tolerance).
_NEEDS_THREE = {"ddp-arrival-order"}
_CPU_ONLY = {"ddp-flat-buffer-first-dtype"}


def _denied() -> set[str]:
    return _CPU_ONLY | (_NEEDS_THREE if max(SIZES) < 3 else set())


def _nccl_mutants():
    for m in MUTANTS.values():
        if m.expect == "hang" or m.kind not in KINDS or m.name in _denied():
            continue  # the denied ones: test_mutant_needs_what_it_is_denied
        yield m.name


@pytest.mark.parametrize("name", sorted(_nccl_mutants()))
def test_mutant_killed_on_nccl(nccl_world, name):
    """Every non-hanging mutant is also killed over NCCL in float32, as the selftest checks it
    (its own precision, target and properties)."""
    m = MUTANTS[name]
    settings = selftest_settings(SIZES, max_examples=40, timeout=20.0, dtype="float32")
    report = check_target(mutant_target(m), nccl_world, settings.replace(precision=m.precision))
    assert not report.passed, f"{name} survived on NCCL: {m.bug}"


def test_mutant_needs_what_it_is_denied(nccl_world):
    """The mutants left out above survive on NCCL at SIZES (float64 for the two-dtype one): the
    suite leaves out nothing the check could have caught there."""
    for name in sorted(_denied()):
        m = MUTANTS[name]
        dtype = "float64" if name in _CPU_ONLY else "float32"
        settings = selftest_settings(SIZES, max_examples=10, timeout=20.0, dtype=dtype)
        assert check_target(mutant_target(m), nccl_world, settings).passed, name
