"""The merge gate's rule (Note [The gate rule] in paracheck.gate) and one real gate run
that must catch a planted memory regression."""

import os
import subprocess
import sys

import pytest

from paracheck.gate import GateRow, PassTiming, exact_verdict, format_rows
from tests.integration._gate_repos import FAT_PATCH, commit_patch, paracheck_clone

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_pass_readings_must_pair_up():
    """A pass with a different number of base and head readings is refused."""
    with pytest.raises(ValueError, match="pair up"):
        PassTiming((0.01, 0.01), (0.01,))


def test_one_lucky_base_job_moves_the_ratio_of_minima_not_the_ratios():
    """Base's fastest job far below its others (one quiet moment) moves the ratio of minima,
    which is reported, not the per-round ratios, which alone decide."""
    base = [0.010, 0.010, 0.006, 0.010, 0.010, 0.010]
    p = PassTiming(tuple(base), (0.0101,) * 6)
    assert p.min_ratio > 1.6 and abs(p.median_ratio - 1.01) < 1e-9
    assert sorted(p.ratios)[-2] == pytest.approx(1.01)


def test_exact_increase_of_one_byte_fails():
    """Exact quantities fail on any increase, however small."""
    assert exact_verdict([1_000_000, 1_000_000], [1_000_001, 1_000_001]) == "REGRESSION"


def test_exact_equal_and_smaller_pass():
    """Equal is ok; smaller is reported as better."""
    assert exact_verdict([10, 10], [10, 10]) == "ok"
    assert exact_verdict([10, 10], [9, 9]) == "better"


def test_exact_side_disagreeing_with_itself_is_unstable_not_gated():
    """A quantity that differs between two readings of the same commit is not exact: a warning."""
    assert exact_verdict([10, 12], [13, 13]) == "UNSTABLE"


def test_table_shows_timings_and_changes_and_counts_the_rest():
    """The default table lists every timing and every changed exact quantity, and counts the unchanged."""
    from paracheck.gate import GateRow

    rows = [
        GateRow(
            "flat", "step wall time (ms)", 20.0, 25.0, "REGRESSION", "pass 1: median ratio x1.250"
        ),
        GateRow("flat", "collectives", 1, 1, "ok"),
        GateRow("flat", "peak_step_bytes", 10, 14, "REGRESSION"),
    ]
    text = format_rows(rows)
    assert "step wall time" in text and "peak_step_bytes" in text and "| collectives |" not in text
    assert "1 exact quantities unchanged" in text


@pytest.mark.parametrize(
    "verdict, word",
    [
        ("REGRESSION", "FAIL"),
        ("ok", "PASS"),
        ("faster", "PASS (faster)"),
        ("better", "PASS (lower)"),
        ("INCONCLUSIVE", "INCONCLUSIVE"),
        ("UNSTABLE", "not gated (unstable)"),
        ("new", "not gated (new)"),
        ("gone", "not gated (gone)"),
    ],
)
def test_verdict_column_uses_the_summarys_words(verdict, word):
    """The table's verdict column says FAIL, PASS or INCONCLUSIVE as the summary line does
    (never "ok" or "REGRESSION"), or "not gated" with the reason."""
    text = format_rows([GateRow("flat", "payload_bytes", 10, 12, verdict, "d")], verbose=True)
    assert f"| {word} | d |" in text.splitlines()[-1], text


def test_identical_commits_row_reads_pass_without_a_bare_ratio_of_minima():
    """Identical commits whose base had one lucky fast job (fastest jobs' ratio x1.411): the row
    says PASS, and the ratio of the fastest jobs, which is not judged, appears only with
    --verbose, saying so; the summary would say PASS too."""
    from paracheck.gate import DEFAULT_ROUNDS, decide_ratio, sequential_plan
    from paracheck.gate.rule import timing_row

    head = (0.0100, 0.0101, 0.0099, 0.0100) * 6
    base = (0.0100, 0.0100, 0.0100, 0.0100) * 6
    base = (0.0099 / 1.411,) + base[1:]  # one quiet moment on base; head's fastest: 9.9 ms
    timing = PassTiming(base, head)
    assert round(timing.min_ratio, 3) == 1.411
    plan = sequential_plan(DEFAULT_ROUNDS)
    decision = decide_ratio(timing.ratios, 0.10, plan)
    assert decision.verdict == "ok", decision
    quiet = timing_row("flat", "step wall time (ms)", timing, decision, 0.998)
    assert quiet.word == "PASS" and "1.411" not in quiet.detail, quiet
    assert "minima" not in format_rows([quiet])
    verbose = timing_row("flat", "step wall time (ms)", timing, decision, 0.998, verbose=True)
    assert "not judged: fastest head job / fastest base job x1.411" in verbose.detail
    assert "| PASS |" in format_rows([verbose], verbose=True)


@pytest.mark.skipif(
    not os.path.isdir(os.path.join(ROOT, ".git")), reason="needs the git repository"
)
def test_gate_catches_extra_gradient_buffer(tmp_path):
    """paracheck gate exits 1 and names the peaks when head adds a full-size gradient buffer to FlatDDP."""
    repo, base = paracheck_clone(str(tmp_path))
    fatter = commit_patch(repo, base, "paracheck.ddp.flat", FAT_PATCH.format(cls="FlatDDP"))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "paracheck.cli",
            "gate",
            "--repo",
            repo,
            "--base",
            base,
            "--head",
            fatter,
            "--variants",
            "flat",
            # This test is about the exact quantities: two rounds cannot decide a timing
            # (INCONCLUSIVE), the exact quantities decide on their own.
            "--rounds",
            "2",
            "--steps",
            "2",
            "--no-history",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1 and "\nFAIL: " in proc.stdout, proc.stdout + proc.stderr
    for q in ("peak_init_bytes", "peak_before_step_bytes", "peak_step_bytes"):
        assert any(q in line and "| FAIL |" in line for line in proc.stdout.splitlines()), (
            proc.stdout
        )


# -- verdicts and exit codes (no measurement: run_gate replaced) --------------------------------
def _rows(timing_verdict: str, exact_verdict: str = "ok") -> list:
    return [
        GateRow("flat", "step wall time (ms)", 20.0, 21.0, timing_verdict, "40 rounds"),
        GateRow("flat", "payload_bytes", 10, 10 if exact_verdict == "ok" else 12, exact_verdict),
    ]


@pytest.mark.parametrize(
    "timing, exact, extra, code, says",
    [
        ("ok", "ok", [], 0, "PASS"),
        ("INCONCLUSIVE", "ok", [], 3, "INCONCLUSIVE"),
        ("INCONCLUSIVE", "ok", ["--inconclusive", "fail"], 1, "INCONCLUSIVE"),
        ("INCONCLUSIVE", "ok", ["--inconclusive", "pass"], 0, "INCONCLUSIVE"),
        # Exact quantities decide on their own, whatever the timing says.
        ("INCONCLUSIVE", "REGRESSION", [], 1, "FAIL"),
        ("ok", "REGRESSION", ["--inconclusive", "pass"], 1, "FAIL"),
        ("REGRESSION", "ok", [], 1, "FAIL"),
    ],
)
def test_exit_code_says_the_verdict(
    monkeypatch, tmp_path, capsys, timing, exact, extra, code, says
):
    """Exit 0 PASS, 1 FAIL, 3 INCONCLUSIVE unless --inconclusive maps it; an exact regression
    FAILs whatever the timings; the JSON names the verdict and the code."""
    import json

    import paracheck.gate
    from paracheck.cli import main

    record = {"base": {"sha": "b" * 40}, "head": {"sha": "h" * 40}, "timings": {}, "rows": []}
    monkeypatch.setattr(paracheck.gate, "run_gate", lambda cfg: (_rows(timing, exact), record))
    out = tmp_path / "v.json"
    repo = tmp_path / "repo"  # a repository of one commit: refs are checked before measuring
    repo.mkdir()
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@localhost", "-c", "commit.gpgsign=false"]
    subprocess.run(git + ["init", "-q"], cwd=repo, check=True)
    subprocess.run(git + ["commit", "-q", "--allow-empty", "-m", "one"], cwd=repo, check=True)
    argv = ["gate", "--repo", str(repo), "--base", "HEAD", "--no-history", "--json", str(out)]
    argv += extra
    assert main(argv) == code
    text = capsys.readouterr().out
    assert f"\n{says}: " in text
    assert json.loads(out.read_text())["verdict"] == says
    assert json.loads(out.read_text())["exit_code"] == code
    if says == "INCONCLUSIVE":
        assert "interval and spread" in text


@pytest.mark.parametrize(
    "extra, says",
    [
        (["--rounds", "0"], "--rounds=0 must be >= 1"),
        (["--seconds", "0"], "--seconds=0.0 must be > 0"),
        (["--error-rate", "0.5"], "--error-rate=0.5 must be in (0, 0.5)"),
        (["--fresh-every", "0"], "--fresh-every=0 must be >= 1"),
    ],
)
def test_budget_arguments_are_checked(extra, says, capsys):
    """A budget or error rate out of range: exit 2 naming the argument and its value."""
    from paracheck.cli import main

    assert main(["gate", "--base", "HEAD", *extra]) == 2
    assert says in capsys.readouterr().err


# -- the load generator for tests of the gate ---------------------------------------------------
def test_load_generator_stops_by_itself_and_checks_its_arguments():
    """scripts/load.py starts its busy processes and ends on its own after --seconds (here 0.5 s,
    one per CPU), leaving no process behind; a bad --per-core or --seconds is exit 2 naming it."""
    import time

    script = os.path.join(ROOT, "scripts", "load.py")
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, script, "--per-core", "1", "--seconds", "0.5"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0 and "busy processes" in proc.stdout, proc.stderr
    assert time.monotonic() - t0 < 30
    for args, says in (
        (["--per-core", "0"], "--per-core=0"),
        (["--seconds", "-1"], "--seconds=-1"),
    ):
        proc = subprocess.run([sys.executable, script, *args], capture_output=True, text=True)
        assert proc.returncode == 2 and says in proc.stderr, proc.stderr


def test_progress_line_names_its_ratios_and_says_a_verdict_in_the_summarys_words():
    """A pair of rounds' progress: the two ratios named as head/base of those rounds (a bare
    "x1.411" read as a slowdown), and a decision as the table says it (PASS, never "ok")."""
    from paracheck.gate import DEFAULT_ROUNDS, decide_ratio, sequential_plan
    from paracheck.gate.rule import round_words

    plan = sequential_plan(DEFAULT_ROUNDS)
    base, head = [0.0100] * 24, [0.0100, 0.0101, 0.0099, 0.0100] * 6
    head[-1] = 0.01411
    open_ = decide_ratio([1.0, 1.0], 0.10, plan)
    assert not open_.decided
    line = round_words("flat", base[:2], head[:2], open_, 0.998)
    assert line == "flat head/base of these rounds x1.000, x1.010", line
    decided = decide_ratio([h / b for b, h in zip(base, head)], 0.10, plan)
    assert decided.verdict == "ok", decided
    line = round_words("flat", base, head, decided, 0.998)
    assert "x0.990, x1.411 -> PASS (" in line and " ok " not in line, line
