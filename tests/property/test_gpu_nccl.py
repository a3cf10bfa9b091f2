"""On GPUs: every built-in target equals the oracle over NCCL, in float64 and in float32.

Skipped (and counted by the plugin's end-of-session line) where fewer than W CUDA devices exist.
float32 uses the documented tolerance table (paracheck.oracle.tolerance.TOLERANCES).
W is ``PARACHECK_NCCL_WORLD`` (default 2, checked at world sizes 1 and 2); with W > 2 the
checked sizes are 3..W (1 and 2 are the default run's), e.g. ``PARACHECK_NCCL_WORLD=4``: 3, 4.
"""

import os

import pytest

from paracheck.check.property import check_target
from paracheck.check.targets import BUILTIN_TARGETS, resolve_target
from paracheck.mutants import MUTANTS

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


@pytest.mark.parametrize("name", sorted(m.name for m in MUTANTS.values() if m.expect != "hang"))
def test_mutant_killed_on_nccl(nccl_world, name):
    """Every non-hanging mutant is also killed over NCCL in float32 (hang mutants take the timeout)."""
    m = MUTANTS[name]
    from paracheck.check.targets import Target

    target = Target(
        m.name, m.path, m.kind, resolve_target(m.path).takes_bucket if m.kind == "ddp" else False
    )
    report = check_target(
        target, nccl_world, world_sizes=SIZES, max_examples=40, seed=0, dtype="float32"
    )
    assert not report.passed, f"{name} survived on NCCL"
