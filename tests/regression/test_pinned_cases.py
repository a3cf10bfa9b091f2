"""Pinned cases: one bug per test, literal input (the README's "pin a found case" workflow).

A failure report prints the shrunk case as JSON; paste it here with the target that failed and
assert what must hold. These run first and fast, and keep a fixed bug fixed.
"""

from paracheck.cases import Case
from paracheck.check.run import run_case
from paracheck.check.targets import resolve_target

# Found by `paracheck selftest` against ddp-no-divide (gradients summed, not averaged).
NO_DIVIDE_CASE = Case.from_json("""
{"model": {"kind": "toy", "tied": false}, "world_size": 2, "batch_sizes": [1, 1], "steps": 1,
 "accumulation": 1, "no_sync": false,
 "optimizer": {"name": "adam", "groups": [{"params": [0, 1, 2, 3, 4], "lr": 0.001, "weight_decay": 0.0,
   "momentum": 0.0, "betas": [0.9, 0.999], "add_at_step": null}], "lr_decay": 1.0, "as_generator": false},
 "bucket_size_mb": 9.5367431640625e-07, "seed": 0, "rank_dependent_init": false, "set_to_none": false,
 "dtype": "float64"}
""")


def test_no_divide_case_fails_the_mutant(world):
    """The pinned no-divide case still exposes the mutant, on the averaged gradient of fc1."""
    result = run_case(world, resolve_target("paracheck.mutants.ddp:NoDivideDDP"), NO_DIVIDE_CASE)
    assert result.divergence is not None and result.divergence.what == "grad"


def test_no_divide_case_passes_flat(world):
    """The same literal case passes the correct FlatDDP."""
    assert run_case(world, resolve_target("flat"), NO_DIVIDE_CASE).ok


def test_case_json_round_trips():
    """A case printed by a report parses back to the identical value."""
    assert Case.from_json(NO_DIVIDE_CASE.to_json(indent=2)) == NO_DIVIDE_CASE
