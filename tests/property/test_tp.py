"""The tp kind: paracheck's reference tensor-parallel plan (paracheck.tp.mlp_plan: torch's
ColwiseParallel, RowwiseParallel and SequenceParallel over an MLP chain) equals the float64
oracle on the meshes 1x2, 2x2 and 1x4, with and without sequence parallelism and clipping, and
each mutant of paracheck.mutants.tp fails the default verdict table."""

import pytest

from paracheck.check.property import check_target
from paracheck.check.targets import resolve_target
from paracheck.cli import main
from paracheck.mutants.tp import TP_MUTANTS
from paracheck.strategies._tp import tp_cases

REFERENCE = "paracheck.tp:mlp_plan"
MESHES = [(1, 2), (2, 2), (1, 4)]
EXAMPLES = 12


@pytest.mark.parametrize("mesh", MESHES, ids=lambda m: f"{m[0]}x{m[1]}")
def test_reference_plan_matches_the_oracle_on_the_mesh(mesh, world):
    """Every drawn case on the mesh (dp, tp): gathered parameters and gradients equal the
    oracle's, ranks agree bitwise; both settings of sequence parallelism and clipping drawn."""
    w = mesh[0] * mesh[1]
    seen: set = set()

    def on(case) -> bool:
        if case.mesh_shape != mesh:
            return False
        seen.add((case.sequence_parallel, case.clip_norm is None))
        return True

    strategy = tp_cases(world_sizes=(w,)).filter(on)
    report = check_target(
        resolve_target(REFERENCE, kind="tp"),
        world,
        world_sizes=(w,),
        max_examples=EXAMPLES,
        strategy=strategy,
        labels=False,
    )
    assert report.passed, report.failure.describe()
    assert seen == {(a, b) for a in (True, False) for b in (True, False)}


def test_reference_plan_passes_the_default_verdict_table(capsys):
    """paracheck check paracheck.tp:mlp_plan --kind tp at world sizes 2 and 4: PASS, exit 0."""
    argv = ["check", REFERENCE, "--kind", "tp", "--world-sizes", "2,4", "--no-database"]
    assert main([*argv, "--max-examples", "10", "--budget", "0"]) == 0, capsys.readouterr().out


@pytest.mark.parametrize("name", sorted(TP_MUTANTS))
def test_tp_mutant_is_killed(name, capsys):
    """Each mutant FAILs the default verdict table at world sizes 2 and 4."""
    m = TP_MUTANTS[name]
    argv = ["check", m.path, "--kind", "tp", "--world-sizes", "2,4", "--no-database"]
    assert main([*argv, "--first-failure", "--budget", "0"]) == 1, m.bug
    assert "FAIL" in capsys.readouterr().out
