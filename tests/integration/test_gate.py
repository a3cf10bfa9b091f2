"""The merge gate's rule (Note [The gate rule] in paracheck.gate) and one real gate run
that must catch a planted memory regression."""

import os
import subprocess
import sys

import pytest

from paracheck.gate import PassTiming, exact_verdict, format_rows, timing_verdict
from tests.integration._gate_repos import FAT_PATCH, commit_patch, paracheck_clone

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _pass(ratios, base=None):
    """A pass whose paired head/base ratios are ``ratios`` (base 10 ms per job unless given)."""
    base = base or [0.010] * len(ratios)
    return PassTiming(tuple(base), tuple(b * r for b, r in zip(base, ratios)))


def test_timing_within_threshold_passes_without_second_pass():
    """A first-pass median ratio within 1 +- threshold is ok and needs no confirmation."""
    assert timing_verdict(_pass([1.09, 0.95, 1.30, 1.02, 0.99, 1.0]), None, 0.10) == "ok"


def test_timing_suspect_not_confirmed_passes():
    """A slow first pass that the second, fresh pass does not repeat is noise, not a regression."""
    assert timing_verdict(_pass([1.3, 1.4, 1.2, 1.3]), _pass([1.05, 0.98, 1.01, 1.0]), 0.10) == "ok"


def test_timing_confirmed_slowdown_fails():
    """Both passes' median ratios above 1 + threshold: a regression."""
    first = _pass([1.26, 1.24, 1.31, 1.19, 1.25, 1.22])
    assert first.says(0.10) == "slower"
    assert timing_verdict(first, _pass([1.22, 1.27, 1.25, 1.3, 1.24, 1.2]), 0.10) == "REGRESSION"


def test_timing_median_ignores_one_outlier_round():
    """One disturbed round out of six does not make a pass suspect."""
    assert timing_verdict(_pass([1.0, 1.01, 2.5, 0.99, 1.02, 1.0]), None, 0.10) == "ok"


def test_timing_one_lucky_base_job_is_not_a_suspect():
    """Base's fastest job far below its others (one quiet moment) moves the ratio of minima, not
    the median of the paired ratios, which alone decides: the pass says nothing."""
    base = [0.010, 0.010, 0.006, 0.010, 0.010, 0.010]
    p = PassTiming(tuple(base), (0.0101,) * 6)
    assert p.min_ratio > 1.6 and abs(p.median_ratio - 1.01) < 1e-9
    assert p.says(0.10) == "same" and timing_verdict(p, None, 0.10) == "ok"


def test_timing_slowdown_with_a_lucky_head_job_is_caught():
    """Measured on 2-core slices of a shared machine: planted 25% slowdowns whose median ratios
    read x1.2-x1.4 had head's fastest job within a few percent of base's, or faster (ratios of
    minima x0.84-x1.08). The ratio of minima is not judged: such passes say "slower"."""
    for ratios in ([1.25, 1.4, 1.32, 1.03, 1.35, 1.3], [1.3, 1.22, 0.9, 1.35, 1.28, 1.31]):
        p = _pass(ratios)
        assert p.median_ratio > 1.25 and p.min_ratio < 1.1
        assert p.says(0.10) == "slower"
        assert timing_verdict(p, _pass(ratios[::-1]), 0.10) == "REGRESSION"


def test_timing_side_unlucky_in_one_pass_is_not_a_regression():
    """Head disturbed in most rounds of the first pass: a suspect, which the second pass, run by
    fresh processes, clears."""
    p = _pass([1.4, 1.5, 1.0, 1.45, 1.35, 1.5])
    assert p.says(0.10) == "slower"
    assert timing_verdict(p, _pass([1.02, 0.97, 1.05, 0.99, 1.01, 1.0]), 0.10) == "ok"


def test_timing_confirmed_speedup_is_reported_not_failed():
    """Faster in both passes is reported as faster, never as a failure."""
    assert (
        timing_verdict(_pass([0.7, 0.75, 0.72, 0.7]), _pass([0.74, 0.71, 0.73, 0.7]), 0.10)
        == "faster"
    )


def test_timing_slower_then_faster_is_not_confirmed():
    """A second pass that says the opposite of the first confirms nothing."""
    assert timing_verdict(_pass([1.3, 1.3]), _pass([0.8, 0.8]), 0.10) == "ok"


def test_timing_suspect_without_second_pass_is_refused():
    """The rule needs the second pass for a suspect: deciding on one pass is an error."""
    with pytest.raises(ValueError, match="second pass"):
        timing_verdict(_pass([1.5, 1.5, 1.5]), None, 0.10)


@pytest.mark.parametrize("threshold", [0.0, -0.1])
def test_timing_threshold_must_be_positive(threshold):
    """threshold <= 0 is refused with the argument named."""
    with pytest.raises(ValueError, match="threshold"):
        timing_verdict(_pass([1.0]), None, threshold)


def test_pass_readings_must_pair_up():
    """A pass with a different number of base and head readings is refused."""
    with pytest.raises(ValueError, match="pair up"):
        PassTiming((0.01, 0.01), (0.01,))


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
            "--rounds",
            "1",
            "--steps",
            "2",
            # This test is about the exact quantities: a threshold no timing reaches
            # keeps wall-time noise from starting a second pass.
            "--threshold",
            "100",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    for q in ("peak_init_bytes", "peak_before_step_bytes", "peak_step_bytes"):
        assert any(q in line and "REGRESSION" in line for line in proc.stdout.splitlines()), (
            proc.stdout
        )


# -- thresholds from measured noise (Note [Thresholds from measured noise]) ---------------------


def test_noise_threshold_is_the_smallest_meeting_the_alarm_rate():
    """With N A/A runs, the threshold is the smallest t whose bound (k1+1)(k2+1)/(N+1)^2, times the
    variants, is within the rate (Note [Thresholds from measured noise]); checked against a
    brute-force scan, and the bound is exactly met or missed around it."""
    from paracheck.gate import false_alarm_bound, noise_threshold

    first = [1.00, 0.97, 1.05, 1.12, 0.99, 1.03, 1.08, 0.95, 1.01, 1.02] * 3
    second = [1.01, 0.99, 1.02, 1.04, 0.98, 1.00, 1.03, 0.97, 1.01, 1.00] * 3
    t, reached = noise_threshold(first, second, alarm_rate=1 / 30)
    assert reached
    assert false_alarm_bound(first, second, t) <= 1 / 30
    scan = [x / 10000 for x in range(200, 2000)]
    assert t == pytest.approx(
        min(x for x in scan if false_alarm_bound(first, second, x) <= 1 / 30), abs=1e-4
    )
    # Eight variants share the rate: a higher threshold for each.
    t8, _ = noise_threshold(first, second, variants=8, alarm_rate=1 / 30)
    assert t8 > t and 8 * false_alarm_bound(first, second, t8) <= 1 / 30
    # A ratio below 1 never raises the threshold: only slowdowns fail.
    assert noise_threshold([0.5] * 30, [0.6] * 30)[0] == 0.02
    # Too few runs for the rate: the largest deviation, and said so.
    t1, reached1 = noise_threshold([1.05], [1.03], alarm_rate=1 / 30)
    assert not reached1 and t1 == pytest.approx(0.05)
    with pytest.raises(ValueError, match="one ratio per A/A run"):
        noise_threshold([1.0], [])
    with pytest.raises(ValueError, match="floor"):
        noise_threshold([1.0], [1.0], floor=0)


def _calibration(cfg, thresholds: dict) -> dict:
    return {
        "paracheck_gate_thresholds": 2,
        "settings": {**cfg.settings(), "confirm_rounds": 12},
        "variants": {v: {"threshold": t} for v, t in thresholds.items()},
    }


def test_thresholds_file_is_read_per_variant_and_refused_with_other_settings(tmp_path):
    """A calibration names each variant's threshold; a variant it does not name keeps
    --threshold; a file measured with other settings (here rounds and timing) is refused, naming
    what differs."""
    import json

    from paracheck.gate import GateConfig, GateError, read_thresholds

    cfg = GateConfig(repo=".", base="HEAD", head="HEAD", threshold=0.10)
    path = tmp_path / "thresholds.json"
    path.write_text(json.dumps(_calibration(cfg, {"bucketed": 0.04, "zero1": 0.17})))
    cfg.thresholds = read_thresholds(str(path), cfg)
    assert [cfg.threshold_for(v) for v in ("bucketed", "zero1", "naive")] == [0.04, 0.17, 0.10]
    other = GateConfig(repo=".", base="HEAD", head="HEAD", rounds=8, timing="cpu")
    with pytest.raises(GateError, match=r"timing 'wall' there, 'cpu' here; rounds 6 there, 8 here"):
        read_thresholds(str(path), other)
    path.write_text(json.dumps({"variants": {}}))
    with pytest.raises(GateError, match="not a file written by paracheck gate --calibrate"):
        read_thresholds(str(path), cfg)
    with pytest.raises(GateError, match="cannot be read"):
        read_thresholds(str(tmp_path / "missing.json"), cfg)


def test_per_variant_threshold_decides_that_variant_only():
    """The same pair of passes is a regression for a variant calibrated as steady (4%) and noise
    for one calibrated as noisy (17%)."""
    first, second = _pass([1.08, 1.09, 1.07, 1.08]), _pass([1.07, 1.08, 1.09, 1.08])
    assert timing_verdict(first, second, 0.04) == "REGRESSION"
    assert timing_verdict(first, None, 0.17) == "ok"


def test_calibrate_needs_a_file_to_write(tmp_path):
    """--calibrate without --thresholds, or a non-positive count or floor: exit 2 naming it."""
    for extra, says in (
        (["--calibrate", "3"], "--calibrate=3 writes its thresholds to --thresholds PATH"),
        (["--calibrate", "0", "--thresholds", "t.json"], "--calibrate=0 must be >= 1"),
        (["--calibrate", "3", "--thresholds", "t.json", "--floor", "0"], "--floor=0.0 must be > 0"),
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "paracheck.cli", "gate", "--base", "HEAD", *extra],
            cwd=tmp_path,
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 2 and says in proc.stderr, proc.stderr


@pytest.mark.slow(reason="slow (four worker starts): run with -m slow")
def test_calibrate_writes_thresholds_the_gate_then_uses(tmp_path):
    """A real calibration of the user package's DDP (one A/A pass, few rounds): the file names
    the variant's measured ratio and threshold, and a gate run with it reports the variant's
    measured threshold."""
    import json
    import shutil

    repo = tmp_path / "repo"
    shutil.copytree(os.path.join(ROOT, "examples", "gate_user_package"), repo)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@localhost", "-c", "commit.gpgsign=false"]
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "base"]):
        subprocess.run(git + args, cwd=repo, check=True, capture_output=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    common = ["--base", "HEAD", "--rounds", "2", "--confirm-rounds", "2", "--steps", "2"]
    common += ["--thresholds", "t.json"]
    cmd = [sys.executable, "-m", "paracheck.cli", "gate", *common, "mypkg.ddp:MyDDP"]
    proc = subprocess.run(
        cmd + ["--calibrate", "1"], cwd=repo, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    record = json.load(open(repo / "t.json"))
    d = record["variants"]["mypkg.ddp:MyDDP"]
    (a,), (b,) = d["first_pass"], d["second_pass"]
    threshold = d["threshold"]
    # One run cannot show a 1-in-30 rate: the largest slowdown seen, or the floor.
    assert not d["reached"] and threshold == pytest.approx(max(0.02, a - 1, b - 1), rel=1e-12)
    assert record["settings"]["rounds"] == 2 and record["settings"]["confirm_rounds"] == 2
    proc = subprocess.run(
        cmd + ["--json", "v.json"], cwd=repo, env=env, capture_output=True, text=True
    )
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    assert f"threshold {threshold:.1%} (measured noise)" in proc.stdout
    assert json.load(open(repo / "v.json"))["thresholds"] == {"mypkg.ddp:MyDDP": threshold}
