"""A World leaves no process or directory behind, keeps what its ranks print off the terminal
(shown with a failure only), and stops a rank over its memory cap, naming the rank and the step."""

import gc
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from paracheck.cases import Case
from paracheck.check.report import case_report
from paracheck.check.run import run_case
from paracheck.check.targets import Target
from paracheck.world import RankOverMemory, World

ROOT = Path(__file__).resolve().parents[2]
JOBS = "tests.integration._hygiene_jobs"
GB = 2**30

linux_only = pytest.mark.skipif(
    not os.path.exists("/proc/self/statm"), reason="reads resident memory from /proc"
)


def _rss(pid: int) -> int:
    """Resident anonymous memory, what the cap counts (Note [Rank memory cap])."""
    with open(f"/proc/{pid}/statm") as f:
        fields = f.read().split()
    return (int(fields[1]) - int(fields[2])) * os.sysconf("SC_PAGE_SIZE")


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return "\nState:\tZ" in f.read()  # exited, not yet reaped by its new parent
    except FileNotFoundError:
        return True


def _leftovers(tmp: Path) -> list[str]:
    return sorted(p.name for p in tmp.iterdir() if p.name.startswith("paracheck-world-"))


@pytest.fixture
def capped(world):
    """The session World with its memory cap restored after the test."""
    saved = world.rank_memory
    yield world
    world.rank_memory = saved


@linux_only
def test_rank_over_its_memory_cap_is_stopped_and_named_with_its_step(capped):
    """A job that keeps 200 MB more per step on rank 1 is stopped within a step of the cap, as
    "rank 1 exceeded N GB at step s", the same again when re-run; the next job runs normally."""
    capped.rank_memory = (_rss(capped.pids[1]) + 0.5 * GB) / GB
    summaries = []
    for _ in range(2):
        t0 = time.monotonic()
        with pytest.raises(RankOverMemory) as info:
            capped.run(f"{JOBS}:leak", (200, 20, [1]), world_size=2)
        assert time.monotonic() - t0 < 20
        over = info.value.failures[0]
        assert over.rank == 1 and over.kind == "memory"
        assert over.status["rss"] < capped.rank_memory * GB + 0.3 * GB  # stopped promptly
        summaries.append(info.value.summary)
    assert re.fullmatch(r"rank 1 exceeded [\d.]+ GB at step 2", summaries[0]), summaries
    assert summaries[1] == summaries[0]
    assert capped.run(f"{JOBS}:ok", None, world_size=2) == [(2, 3.0)] * 2


@linux_only
def test_memory_kept_from_earlier_jobs_does_not_fail_a_later_job(capped):
    """Jobs that each keep 150 MB alive for good pass, though together they pass the cap: the
    job that finds the cap reached is run again on fresh rank processes."""
    capped.rank_memory = (_rss(capped.pids[1]) + 0.4 * GB) / GB
    restarts = capped.restarts
    for _ in range(4):
        capped.run(f"{JOBS}:leak", (150, 1, [1]), world_size=2)
    assert capped.restarts > restarts


@linux_only
def test_leaking_target_fails_the_memory_cap_property_with_rank_and_step(capped):
    """A DDP target that keeps 200 MB per synchronisation fails 'memory-cap', a resource failure
    naming the rank and the step, not a death or a wrong result."""
    capped.rank_memory = (_rss(capped.pids[0]) + 0.5 * GB) / GB
    target = Target("leaky", f"{JOBS}:LeakyDDP", "ddp")
    case = Case.from_json(CASE)
    result = run_case(capped, target, case)
    assert result.failed_properties == ["memory-cap"]
    text = case_report(target, result).text()
    assert re.search(
        r"FAIL leaky: memory-cap: rank 0 exceeded [\d.]+ GB at step [1-4]: a resource failure", text
    ), text
    assert run_case(capped, Target("naive", "paracheck.ddp:NaiveDDP", "ddp"), case).ok


CASE = """{"model": {"kind": "mlp", "in_features": 5, "widths": [7], "bias": false, "frozen": [],
"tied": false, "unused": "none", "buffer": false, "float32_layer": null}, "world_size": 1,
"batch_sizes": [3], "steps": 6, "accumulation": 1, "no_sync": false, "optimizer": {"name": "adam",
"groups": [{"params": [0], "lr": 0.01, "weight_decay": 0.1, "momentum": 0.0, "betas": [0.8, 0.99],
"add_at_step": null}], "lr_decay": 1.0, "as_generator": false, "scheduler": null,
"groups_as_generators": false}, "bucket_size_mb": 0.001, "seed": 100, "rank_dependent_init": false,
"set_to_none": false, "dtype": "float64", "merged_ranks": 1, "closure": false,
"reload_at_step": null, "zero_grad_module": false, "finish_once": false, "double_backward": false,
"unbounded_bucket": false}"""


def test_a_memory_cap_that_is_not_positive_is_refused(capsys):
    """`--rank-memory 0` exits 2 naming the option and value; World(rank_memory=-1) raises."""
    from paracheck.cli import main

    assert main(["check", "naive", "--rank-memory", "0"]) == 2
    assert "--rank-memory=0.0 must be > 0" in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"rank_memory=-1 must be a number of GB > 0"):
        World(1, rank_memory=-1)


def test_output_outside_a_job_goes_with_the_next_case(world):
    """What a rank prints between jobs is not lost or shown on the terminal: it comes with the
    rank's next case, marked as printed outside any case."""
    world.run(f"{JOBS}:print_later", None, world_size=1)
    time.sleep(0.6)
    world.run(f"{JOBS}:ok", None, world_size=1)
    assert world.last_outputs[0].startswith(
        "[printed outside any case, before this one]\nlate noise from rank 0\n"
        "[printed by this case]"
    ), world.last_outputs


def test_each_case_shows_the_python_warnings_it_triggers(world):
    """A Python warning raised by every case is in every case's output, not the first only."""
    for _ in range(2):
        world.run(f"{JOBS}:warn", None, world_size=2)
        assert all("a warning from the job" in world.last_outputs[r] for r in (0, 1))


def test_collected_world_leaves_no_directory_or_process(tmp_path, monkeypatch):
    """A World dropped without close() removes its temporary directory and stops its processes."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    w = World(1, timeout=5)
    pids = w.pids + [w.pool.zygote.pid]
    assert len(_leftovers(tmp_path)) == 1
    del w
    gc.collect()
    assert _leftovers(tmp_path) == []
    assert all(_gone(p) for p in pids)


DRIVER = """
import sys, time
from paracheck.world import RankDied, World

w = World(2, timeout=10)
while not w.pool.zygote.ready():
    time.sleep(0.05)
try:  # rank 1 dies and is replaced by a rank the zygote forks
    w.run("tests.integration._hygiene_jobs:exit_on", 1, world_size=2)
except RankDied:
    pass
w.submit("tests.integration._hygiene_jobs:leak", (0, 10**9, []), world_size=1)  # rank 0 busy
print(*w.pids, w.pool.zygote.pid, flush=True)
time.sleep(120)
"""


def test_ranks_exit_and_directory_goes_when_the_driver_is_killed(tmp_path):
    """SIGKILL to the driver: its ranks (busy, idle, forked by the zygote) and the zygote exit,
    and the last of them removes the World's directory."""
    env = dict(os.environ, TMPDIR=str(tmp_path), PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'src'}")
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(DRIVER)], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 3 and len(_leftovers(tmp_path)) == 1
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (_leftovers(tmp_path) or not all(map(_gone, pids))):
        time.sleep(0.05)
    assert _leftovers(tmp_path) == [] and all(_gone(p) for p in pids)


NOISY = f"{JOBS}:NoisyDDP"
NOISY_WRONG = f"{JOBS}:NoisyWrongDDP"


def test_cli_prints_only_its_own_lines_and_leaves_no_directory(tmp_path):
    """`paracheck check` on a passing and a failing target whose ranks warn and print at exit:
    stderr holds no rank output, stdout shows a rank's warning only in the failure's report, and
    no temporary directory is left."""
    env = dict(os.environ, TMPDIR=str(tmp_path), PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'src'}")
    cmd = [sys.executable, "-m", "paracheck.cli", "check", NOISY, NOISY_WRONG, "--kind", "ddp"]
    cmd += ["--world-sizes", "1", "--max-examples", "2", "--no-database"]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert out.returncode == 1, out.stdout + out.stderr
    assert all(line.startswith("paracheck:") for line in out.stderr.splitlines()), out.stderr
    first, rest = out.stdout.split("\n", 1)
    assert first.startswith("paracheck check: ") and "NOISE" not in first, out.stdout
    passed, failed = rest.split(f"paracheck {NOISY_WRONG}: verdict table", 1)
    assert passed.startswith(f"paracheck {NOISY}: verdict table"), out.stdout
    assert f"\nPASS {NOISY}: " in passed and "NOISE" not in passed, out.stdout
    printed = failed.split("  rank 0 printed:", 1)[1].split("  replay:", 1)
    assert "NOISE: a warning from forward" in printed[0], out.stdout
    assert "NOISE" not in printed[1], out.stdout
    assert _leftovers(tmp_path) == []
