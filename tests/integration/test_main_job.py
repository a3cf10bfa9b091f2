"""What a check of several targets ends with, and what the main job (no TARGET) runs: a
summary row per target, one verdict line and its exit status (INCOMPLETE, exit 3, where rows
were not reached); the first line before any rank starts; a row whose method the class lacks."""

import argparse
import json
import types

import pytest

import paracheck.cli.check as cli_check
from paracheck.check.features import optional_features
from paracheck.check.interfaces import unsupported
from paracheck.check.settings import CHECK, CheckSettings, add_arguments
from paracheck.check.shared_search import _Search
from paracheck.check.table import plan_rows
from paracheck.check.targets import BUILTIN_TARGETS, Target, resolve_target
from paracheck.cli import main
from paracheck.cli._check_summary import (
    MAIN_JOB_EXAMPLES,
    MAIN_JOB_WORLD_SIZES,
    first_line,
    main_job_examples,
    main_job_features,
    main_job_targets,
    main_job_world_sizes,
    peers,
)
from tests.integration._borrowed import Borrowed

NO_SYNC_LESS = "tests.integration._no_sync_less:NoSyncLessDDP"
# No optional row: the core row alone, a few cases each.
CORE_ONLY = "--features=" + ",".join(f"-{f}" for f in optional_features())


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("targets", nargs="*")
    add_arguments(parser, CHECK, choices={"kind": ["ddp"]})
    return parser.parse_args(list(argv))


def test_the_main_job_checks_paracheck_own_built_ins_and_says_how_to_check_all():
    """No TARGET: torch's peers are left out and fewer examples run, and the first line says so
    and names --all; --all checks every built-in at the profile's examples."""
    args = _args()
    names = main_job_targets(args)
    assert names == [
        n for n in BUILTIN_TARGETS if not n.startswith("torch-") and not n.endswith("-master")
    ]
    assert set(peers()) == {"torch-ddp", "torch-zero", "torch-fsdp"}
    assert main_job_examples(args) == MAIN_JOB_EXAMPLES
    line = first_line(args, names)
    assert f"paracheck's {len(names)} built-ins, {MAIN_JOB_EXAMPLES} examples per search" in line
    assert f"world sizes {MAIN_JOB_WORLD_SIZES}, features compile left out (" in line
    # Compiled cases are left out of the main job only (Note [The main job]).
    assert main_job_features(args) == "-compile"
    assert main_job_features(_args("--features=-buffer")) == "-compile,-buffer"
    assert main_job_features(_args("--features=+compile")) == "+compile"
    assert main_job_features(_args("--all")) is None
    assert "--all checks all 15" in line and "starting the ranks (gloo)" in line
    assert main_job_world_sizes(args) == MAIN_JOB_WORLD_SIZES == "1,2,3"
    assert main_job_world_sizes(_args("--world-sizes", "2")) is None
    assert main_job_world_sizes(_args("--all")) is None
    every = _args("--all")
    assert main_job_targets(every) == list(BUILTIN_TARGETS)
    assert main_job_examples(every) is None
    assert main_job_examples(_args("--max-examples", "3")) is None
    assert main_job_targets(_args("naive")) is None


def test_all_with_a_target_is_a_usage_error(capsys, monkeypatch):
    monkeypatch.setattr(cli_check, "_make_world", None)  # never reached
    assert main(["check", "naive", "--all"]) == 2
    err = capsys.readouterr().err
    assert "--all checks every built-in and takes no TARGET" in err and "naive" in err


def test_a_bad_incomplete_choice_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["check", "naive", "--incomplete", "maybe"])
    assert exit_.value.code == 2
    assert "--incomplete: invalid choice: 'maybe'" in capsys.readouterr().err


def test_several_targets_end_with_a_summary_and_one_verdict_line(
    world, capsys, monkeypatch, tmp_path
):
    """Two targets: the first line comes before the ranks, a summary row each, and PASS: 2 of 2."""
    started = []

    def borrowed(*a, **k):
        started.append(capsys.readouterr().out)  # what was printed before the ranks started
        return Borrowed(world)

    monkeypatch.setattr(cli_check, "_make_world", borrowed)
    monkeypatch.chdir(tmp_path)
    argv = ["check", "naive", "flat", "--world-sizes", "1,2", "--max-examples", "2"]
    code = main(argv + ["--no-database", CORE_ONLY, "--json", "v.json"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert started[0].startswith("paracheck check: naive, flat; loading them and starting")
    lines = out.splitlines()
    assert lines[-1] == "PASS: 2 of 2 targets", out
    assert any(line.startswith("summary of 2 targets in ") for line in lines), out
    rows = [line.split() for line in lines if line.startswith(("  naive ", "  flat "))]
    assert [r[:3] for r in rows] == [["naive", "PASS", "1/0/0"], ["flat", "PASS", "1/0/0"]]
    data = json.loads((tmp_path / "v.json").read_text())
    assert data["verdict"] == "PASS" and data["verdict_line"] == "PASS: 2 of 2 targets"


def test_rows_not_reached_are_incomplete_exit_3_unless_accepted(
    world, capsys, monkeypatch, tmp_path
):
    """A budget spent before any row: INCOMPLETE and exit 3, the rows counted; with
    --incomplete pass, PASS and exit 0."""
    monkeypatch.setattr(cli_check, "_make_world", lambda *a, **k: Borrowed(world))
    monkeypatch.chdir(tmp_path)
    argv = ["check", "naive", "flat", "--world-sizes", "1,2", "--budget", "1e-9", "--no-database"]
    assert main(argv + [CORE_ONLY]) == 3
    out = capsys.readouterr().out
    rows = f"verdict table of {1 + len(optional_features())} rows (1 not reached, "
    assert f"INCOMPLETE naive: {rows}" in out, out
    assert out.splitlines()[-1].startswith(
        "INCOMPLETE: 2 of 2 targets with rows not reached (naive: 1 not reached, flat: 1 not "
        "reached), 0 PASS"
    ), out
    assert main(argv + [CORE_ONLY, "--incomplete", "pass"]) == 0
    out = capsys.readouterr().out
    assert f"PASS naive: {rows}" in out, out
    assert (
        out.splitlines()[-1] == "PASS: 2 of 2 targets (2 with rows not reached: --incomplete pass)"
    )


def test_a_no_sync_row_of_a_class_without_no_sync_is_not_supported():
    """+no-sync on a wrapper class with no no_sync(): "not supported", naming the method (it read
    PASS, checking plain accumulation); the built-in DDPs have it."""
    target = resolve_target(NO_SYNC_LESS)
    assert unsupported(target, "no-sync") == "NoSyncLessDDP has no no_sync()"
    assert unsupported(resolve_target("naive"), "no-sync") is None
    assert unsupported(Target("loop", "paracheck.loop:train_step", "loop"), "no-sync") is None
    settings = CheckSettings(world_sizes=(1, 2), database=None)
    search = _Search(target, types.SimpleNamespace(timeout=10.0), settings, None, None, None, None)
    row = next(row for row, _ in plan_rows(search) if row.name == "+no-sync")
    assert row.status == "not supported"
    assert row.line(10).endswith(
        "not supported: by the target's interface: NoSyncLessDDP has no no_sync()"
    )


def test_a_row_the_kind_never_draws_is_drawn_once_per_kind(world, monkeypatch):
    """The second DDP of a check reuses the first's "not drawn" for a row its kind never draws
    without declaring it (a scheduler, its declaration taken away): the same seeded strategy
    draws the same cases (20% of the main job's time went to drawing such rows again for each
    target)."""
    from dataclasses import replace

    from paracheck.check import table
    from paracheck.check.kinds import KINDS
    from paracheck.check.property import check_target

    monkeypatch.setitem(KINDS, "ddp", replace(KINDS["ddp"], never_draws=frozenset()))
    monkeypatch.setattr(table, "_NOT_DRAWN", set())
    only = ",".join(f"-{f}" for f in optional_features() if f != "scheduler")
    settings = CheckSettings(
        world_sizes=(1, 2),
        max_examples=1,
        table=True,
        labels=True,
        first_failure=False,
        database=None,
        features=only,
    )
    first = check_target(resolve_target("naive"), world, settings)
    row = next(r for r in first.rows if r.name == "+scheduler")
    assert row.status == "not drawn" and "does not draw it" in row.why
    assert len(table._NOT_DRAWN) == 1

    def drawn_again(names):
        raise AssertionError(f"{names} drawn again")

    monkeypatch.setattr(table, "_drawn_with", drawn_again)
    second = check_target(resolve_target("flat"), world, settings)
    row = next(r for r in second.rows if r.name == "+scheduler")
    assert row.status == "not drawn" and "does not draw it" in row.why
    # A search at random draws anew.
    with pytest.raises(AssertionError, match="drawn again"):
        check_target(resolve_target("flat"), world, settings.replace(random=True))


def test_a_row_the_kind_declares_never_drawn_draws_nothing(world, monkeypatch):
    """A row whose feature the kind declares it never draws (the DDP kind's scheduler: Note
    [Features a kind never draws]) is "not drawn" without a case drawn for it."""
    from paracheck.check import table
    from paracheck.check.property import check_target

    def drawn(names):
        raise AssertionError(f"{names} drawn")

    monkeypatch.setattr(table, "_drawn_with", drawn)
    only = ",".join(f"-{f}" for f in optional_features() if f != "scheduler")
    settings = CheckSettings(
        world_sizes=(1, 2),
        max_examples=1,
        table=True,
        labels=True,
        first_failure=False,
        database=None,
        features=only,
    )
    report = check_target(resolve_target("naive"), world, settings)
    row = next(r for r in report.rows if r.name == "+scheduler")
    assert row.status == "not drawn" and row.cases == 0
    assert row.why == "the ddp kind does not draw it"


def test_counts_say_what_they_count_in_the_right_number():
    """ "1 case run", not "1 cases run"; the first failure is "found in case #N run", the count
    that the rows' (shrinking included) and the total share."""
    from paracheck.cases import Case
    from paracheck.check.failure import PropertyFailure
    from paracheck.check.report import CheckReport
    from paracheck.check.run import CaseResult
    from paracheck.check.verdict import RowVerdict

    target = resolve_target("naive")
    failure = PropertyFailure("gradients", CaseResult(Case(seed=0)))
    one = CheckReport(target, False, 1, 1.0, [failure], world_sizes=(2,), cases_run=1)
    assert "first found in case #1 run, 1 case run in 1.0 s" in one.summary(), one.summary()
    row = RowVerdict("core", None, status="FAIL", failure=failure, cases=1)
    table = CheckReport(target, False, 1, 1.0, [failure], world_sizes=(2,), cases_run=1, rows=[row])
    line = table.summary()
    assert "verdict table of 1 row (1 FAIL)" in line, line
    assert "the first found in case #1 run; 1 case run (shrinking included)" in line, line
    assert row.cost == "1 case, 0.0 s" and "[1 case, 0.0 s]" in row.line(10), row.line(10)
    assert RowVerdict("core", None, status="PASS", cases=2).cost.startswith("2 cases, ")


def test_the_first_line_is_printed_before_torch_is_imported():
    """A fresh ``paracheck check``: the first line is out before torch (seconds to import on a
    busy machine) is imported, let alone a rank started; judged by what is imported, not by a
    clock."""
    import subprocess
    import sys

    probe = (
        "import sys\n"
        "import paracheck.cli._check_summary as summary\n"
        "def announce(text, to_stdout):\n"
        "    print(text, 'torch' in sys.modules, flush=True)\n"
        "    raise SystemExit(0)\n"
        "summary.announce = announce\n"
        "from paracheck.cli import main\n"
        "main(['check', 'naive', '--world-sizes', '1,2'])\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    line = proc.stdout.splitlines()[0]
    assert line.startswith("paracheck check: naive; loading it and starting the ranks"), line
    assert line.endswith(" False"), line
