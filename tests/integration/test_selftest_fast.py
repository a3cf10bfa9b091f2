"""The fast profile of `paracheck selftest` (CI): the table, the verdicts and the exit status."""

from paracheck.selftest import run_selftest, selftest_rows


def test_selftest_fast_profile_kills_and_passes(world, capsys):
    """A representative slice (a target, three mutants of both families) exits 0 with a table;
    every built-in's own check is a test of its kind."""
    only = [
        "flat",
        "ddp-no-divide",
        "ddp-last-bucket-never-reduced",
        "sharded-hyperparams-dropped",  # sharded-count-partition is killed in test_sharding_mutants
    ]
    code = run_selftest(only=only, world_sizes=(1, 2, 3, 4), world=world)  # the selftest defaults
    out = capsys.readouterr().out
    assert code == 0, out
    assert "kill rate: 3/3 = 100%" in out and "built-in targets passing: 1/1" in out
    for name in only:
        assert name in out
    # The margin columns: the mutants' errors over their tolerances, on the case found and the
    # shrunk one (all far past them here).
    header = out.splitlines()[0].split()
    assert "found" in header and "shrunk" in header


def test_selftest_reports_a_surviving_mutant_as_failure(world, monkeypatch):
    """A 'mutant' that is in fact correct survives, and the selftest row says so (exit would be 1)."""
    from paracheck.mutants import MUTANTS, Mutant

    name = "_correct-in-disguise"
    monkeypatch.setitem(
        MUTANTS, name, Mutant(name, "paracheck.ddp:FlatDDP", "ddp", "no bug at all")
    )
    rows = list(selftest_rows(only=[name], world_sizes=(1, 2), world=world, max_examples=5))
    assert rows[0]["verdict"] == "SURVIVED" and not rows[0]["ok"]


def test_margin_is_error_over_tolerance_or_exact():
    """A toleranced property's margin is the error over the allowed difference; an exact rule's,
    or a tensor that could not be compared, is "exact"; a raise has none."""
    from paracheck.cases import Case
    from paracheck.check.properties import Divergence
    from paracheck.check.report import PropertyFailure
    from paracheck.check.run import CaseResult
    from paracheck.selftest import margin, margin_text

    case = Case(seed=0)

    def failure(what, diff, tol):
        d = Divergence(0, what, 0, 0, "w", diff, tol)
        return PropertyFailure(d.property, CaseResult(case, d))

    assert margin(failure("grad", 3e-3, 1e-5)) == 3e-3 / 1e-5
    assert margin_text(margin(failure("grad", 3e-3, 1e-5))) == "3.0e+02"
    assert margin_text(margin(failure("param", float("nan"), 1e-5))) == "exact"
    assert margin_text(margin(failure("bucket-structure", 3.0, 2.0))) == "exact"
    assert margin_text(margin(failure("repeatability", 1e-16, 0.0))) == "exact"
    raised = PropertyFailure("raised", CaseResult(case, error=object()))
    assert margin(raised) is None and margin_text(None) == "-"
    # Note [Two margins]: the case found before shrinking has its own; without one, the shrunk's.
    shrunk = failure("param", 2e-6, 1e-6)
    shrunk.first = CaseResult(case, Divergence(0, "param", 0, 0, "w", 5e-3, 1e-6))
    assert margin(shrunk) == 2e-6 / 1e-6 and margin(shrunk, found=True) == 5e-3 / 1e-6
    assert margin(failure("grad", 3e-3, 1e-5), found=True) == 3e-3 / 1e-5
