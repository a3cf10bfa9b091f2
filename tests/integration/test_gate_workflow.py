"""``paracheck gate`` in a user's repository: the gate command of ``examples/paracheck-gate.yml``,
run as the workflow runs it on a two-commit repository holding ``examples/gate_user_package``,
fails the merge on a planted 100 ms sleep per step and says so in its JSON; and in paracheck's own
repository, each commit is measured by its own worker, also a commit from before the gate had
its own package."""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from paracheck.gate.run import _worker_module
from tests.integration._gate_repos import has_commit, paracheck_clone

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKFLOW = os.path.join(ROOT, "examples", "paracheck-gate.yml")
PACKAGE = os.path.join(ROOT, "examples", "gate_user_package")
TARGET = "mypkg.ddp:MyDDP"

# The planted regression: every synchronisation sleeps 100 ms (a blocking slowdown: a lock, a
# wait, I/O). The gate model's step takes tens of milliseconds, so the step is several times
# slower: large enough to be caught on a loaded machine with the few rounds used here.
SLEEP_PATCH = """

import time as _time

_fast_finish = MyDDP.finish_gradient_synchronization


def _slow_finish(self):
    _time.sleep(0.1)
    _fast_finish(self)


MyDDP.finish_gradient_synchronization = _slow_finish
"""

GIT = [
    "git",
    "-c",
    "user.name=gate test",
    "-c",
    "user.email=gate-test@localhost",
    "-c",
    "commit.gpgsign=false",
]


def _workflow_gate():
    """The workflow's gate command line and its environment variables (the file is plain enough
    that a regular expression reads it; no YAML library needed)."""
    text = open(WORKFLOW).read()
    assert re.search(r"^on:\s*\n\s+pull_request:", text, re.M), (
        "the workflow must run on pull requests"
    )
    runs = [m.group(1).strip() for m in re.finditer(r"^\s*run:\s*(paracheck gate .*)$", text, re.M)]
    assert len(runs) == 1, (
        f"expected one 'run: paracheck gate ...' step in {WORKFLOW}, found {runs}"
    )
    env = dict(re.findall(r"^\s+(PARACHECK_[A-Z_]+):\s*\"([^\"]*)\"", text, re.M))
    assert env.get("PARACHECK_TARGETS") == TARGET, env
    return runs[0], env


def _user_repo(tmp_path, patch: str | None) -> str:
    """A git repository with the user package on ``main`` (also as ``origin/main``, as a
    checkout with fetch-depth 0 has it) and, when ``patch`` is given, a second commit
    appending it to mypkg/ddp.py, checked out."""
    repo = tmp_path / "user-repo"
    shutil.copytree(PACKAGE, repo)
    run = lambda *a: subprocess.run(
        GIT + list(a), cwd=repo, check=True, capture_output=True, text=True
    )  # noqa: E731
    run("init", "-q", "-b", "main")
    run("add", "-A")
    run("commit", "-q", "-m", "MyDDP")
    run("update-ref", "refs/remotes/origin/main", "HEAD")
    if patch:
        with open(repo / "mypkg" / "ddp.py", "a") as f:
            f.write(patch)
        run("checkout", "-q", "-b", "feature")
        run("commit", "-q", "-am", "MyDDP waits 100 ms per synchronisation")
    return str(repo)


def _run_workflow_gate(repo: str, tmp_path, extra_args: str):
    command, env = _workflow_gate()
    env = {
        **os.environ,
        **env,
        "GITHUB_BASE_REF": "main",
        "PARACHECK_GATE_ARGS": extra_args,
        "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""),
    }
    # The user's package is not installed: the gate must find it in each commit's tree.
    env.pop("PYTHONPATH", None)
    return subprocess.run(
        ["bash", "-c", command], cwd=repo, env=env, capture_output=True, text=True, timeout=600
    )


# Two or more worker starts (torch, two ranks each) and 14 or more rounds: 1-6 min on the shared
# 2-core machine, beyond the default run's budget.
@pytest.mark.slow(reason="slow (worker starts and 14 or more rounds): run with -m slow")
def test_workflow_gate_fails_the_merge_on_a_planted_sleep(tmp_path):
    """Head = base + a 100 ms sleep per step in the user's DDP: exit 1 (or 3 on a machine too
    loaded to tell, never 0) and a JSON verdict naming the step time of mypkg.ddp:MyDDP, measured
    on the two commits' trees; both commits recorded in the repository's git-ignored history."""
    if shutil.which("paracheck", path=os.path.dirname(sys.executable)) is None:
        pytest.skip(f"no paracheck script beside {sys.executable} (paracheck is not installed)")
    repo = _user_repo(tmp_path, SLEEP_PATCH)
    # Fewer steps and seconds than the workflow's defaults (the workflow's PARACHECK_GATE_ARGS
    # knob): the planted slowdown is several times the step, so a quiet machine FAILs it in the
    # fewest rounds that can decide (14). On a machine loaded far beyond its cores a round of the
    # base can read slower than the head's (x0.54 seen at a load average of 20 on 2 cores), and
    # the budget may end first: INCONCLUSIVE, whose interval must then reach above the threshold.
    # PASS is the failure this test exists for.
    proc = _run_workflow_gate(repo, tmp_path, "--rounds 40 --seconds 300 --steps 3")
    out = proc.stdout + proc.stderr
    assert proc.returncode in (1, 3), out
    verdict = json.load(open(os.path.join(repo, "paracheck-gate.json")))
    assert verdict["exit_code"] == proc.returncode, verdict
    assert verdict["targets"] == [TARGET] and verdict["paracheck"] == "installed"
    heads = subprocess.run(
        ["git", "rev-parse", "origin/main", "HEAD"],
        cwd=repo,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert [verdict["base"]["sha"], verdict["head"]["sha"]] == heads
    timing = verdict["timings"][TARGET]
    assert timing["median_ratio"] > 1.1, timing
    said = verdict["regressions"] if proc.returncode == 1 else verdict["inconclusive"]
    assert [(r["variant"], r["quantity"]) for r in said] == [(TARGET, "step wall time (ms)")]
    if proc.returncode == 1:
        assert verdict["verdict"] == "FAIL" and timing["interval"][0] > 1.1, verdict
        assert "\nFAIL: " in proc.stdout
    else:
        assert verdict["verdict"] == "INCONCLUSIVE", verdict
        assert timing["interval"][1] is None or timing["interval"][1] > 1.1, timing
    # Both commits' readings went to the repository's history, which git ignores.
    recorded = os.listdir(os.path.join(repo, ".paracheck", "history", "measurements"))
    assert len(recorded) == 1
    files = os.listdir(os.path.join(repo, ".paracheck", "history", "measurements", recorded[0]))
    assert sorted(files) == sorted(f"{sha}.json" for sha in heads)
    status = subprocess.run(
        ["git", "status", "--porcelain"], cwd=repo, capture_output=True, text=True
    ).stdout
    assert ".paracheck" not in status, status


def test_gate_without_targets_outside_paracheck_names_what_to_pass(tmp_path):
    """In a repository that is not paracheck's, no TARGET is a usage error (exit 2) whose message
    says to name the classes; the JSON says ERROR."""
    repo = _user_repo(tmp_path, None)
    out = tmp_path / "gate.json"
    proc = subprocess.run(
        [sys.executable, "-m", "paracheck.cli", "gate", "--base", "HEAD", "--json", str(out)],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "no TARGET given" in proc.stderr and "mypackage.ddp:MyDDP" in proc.stderr
    assert json.load(open(out))["verdict"] == "ERROR"


def test_gate_target_must_be_an_import_path(tmp_path):
    """A TARGET without ':Class' is refused with exit 2, naming the argument and its value."""
    proc = subprocess.run(
        [sys.executable, "-m", "paracheck.cli", "gate", "--base", "HEAD", "mypkg.ddp"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "TARGET='mypkg.ddp'" in proc.stderr


@pytest.mark.slow(reason="slow (two worker starts): run with -m slow")
def test_gate_target_broken_at_head_cannot_decide(tmp_path):
    """A TARGET whose module raises on import at head: exit 2, the message names the TARGET and
    the error, and the JSON says ERROR (a merge must not pass because its code does not import)."""
    repo = _user_repo(tmp_path, "\nraise RuntimeError('broken at head')\n")
    out = tmp_path / "gate.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "paracheck.cli",
            "gate",
            "--base",
            "main",
            "--json",
            str(out),
            TARGET,
        ],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"TARGET={TARGET!r}" in proc.stderr and "broken at head" in proc.stderr
    assert json.load(open(out))["verdict"] == "ERROR"


# The last commit whose gate worker is paracheck.bench._worker (the gate's own package came after).
OLD_LAYOUT = "c5421af"


def test_each_tree_runs_its_own_worker_module(tmp_path):
    """In paracheck's own repository a tree runs the worker it has, the new path first; a tree
    with neither is not paracheck's; measuring TARGETs, the installed paracheck's worker runs."""
    layouts = {"new": "gate", "old": "bench", "both": None}
    for name, package in layouts.items():
        for pkg in [package] if package else ["gate", "bench"]:
            path = tmp_path / name / "src" / "paracheck" / pkg
            path.mkdir(parents=True)
            (path / "_worker.py").write_text("")
    (tmp_path / "user" / "src" / "mypkg").mkdir(parents=True)
    assert _worker_module(str(tmp_path / "new"), True) == "paracheck.gate._worker"
    assert _worker_module(str(tmp_path / "old"), True) == "paracheck.bench._worker"
    assert _worker_module(str(tmp_path / "both"), True) == "paracheck.gate._worker"
    assert _worker_module(str(tmp_path / "user"), True) is None
    assert _worker_module(str(tmp_path / "user"), False) == "paracheck.gate._worker"


@pytest.mark.skipif(
    not os.path.isdir(os.path.join(ROOT, ".git")) or not has_commit(OLD_LAYOUT),
    reason=f"needs the git repository with commit {OLD_LAYOUT}",
)
# A clone and two worker starts, about 17 s on the 2-core machine, for a layout that no
# longer changes: beyond the default run's budget.
@pytest.mark.slow(reason="slow (a clone and two worker starts of an old layout): run with -m slow")
def test_gate_measures_a_base_from_before_the_gate_package(tmp_path):
    """Base: a paracheck commit whose worker is paracheck.bench._worker; head: this working
    tree, whose worker is paracheck.gate._worker. Both sides start and measure flat (the verdict
    itself depends on what changed in between: not asserted)."""
    repo, head = paracheck_clone(str(tmp_path))
    out = tmp_path / "gate.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "paracheck.cli",
            "gate",
            "--repo",
            repo,
            "--base",
            OLD_LAYOUT,
            "--head",
            head,
            "--variants",
            "flat",
            "--rounds",
            "2",
            "--steps",
            "2",
            "--no-history",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    # Two rounds decide no timing: INCONCLUSIVE (3) unless an exact quantity changed (1).
    assert proc.returncode in (1, 3), proc.stdout + proc.stderr
    record = json.load(open(out))
    assert record["paracheck"] == "each commit's own", record
    assert record["base"]["sha"].startswith(OLD_LAYOUT) and record["head"]["sha"] == head
    assert set(record["timings"]) == {"flat"}, record["timings"]
