"""The fast profile of `paracheck selftest` (CI): the table, the verdicts and the exit status."""

from paracheck.selftest import run_selftest, selftest_rows


def test_selftest_fast_profile_kills_and_passes(world, capsys):
    """A representative slice (two targets, three mutants of both families) exits 0 with a table."""
    only = [
        "flat",
        "zero1",
        "ddp-no-divide",
        "ddp-last-bucket-never-reduced",
        "sharded-count-partition",
    ]
    code = run_selftest(only=only, world_sizes=(1, 2, 3, 4), world=world)  # the selftest defaults
    out = capsys.readouterr().out
    assert code == 0, out
    assert "kill rate: 3/3 = 100%" in out and "built-in targets passing: 2/2" in out
    for name in only:
        assert name in out


def test_selftest_reports_a_surviving_mutant_as_failure(world, monkeypatch):
    """A 'mutant' that is in fact correct survives, and the selftest row says so (exit would be 1)."""
    from paracheck.mutants import MUTANTS, Mutant

    name = "_correct-in-disguise"
    monkeypatch.setitem(
        MUTANTS, name, Mutant(name, "paracheck.ddp:FlatDDP", "ddp", "no bug at all")
    )
    rows = list(selftest_rows(only=[name], world_sizes=(1, 2), world=world, max_examples=5))
    assert rows[0]["verdict"] == "SURVIVED" and not rows[0]["ok"]
