"""``paracheck gate`` in a user's repository: the install and gate steps of
``examples/paracheck-gate.yml``, read from its YAML and run as written (bash -eo pipefail) in a
throwaway two-commit repository holding ``examples/gate_user_package``, offline: pip installs
paracheck from a copy of this working tree (``PARACHECK_SOURCE``) into a fresh environment that
already sees the CPU torch; the gate fails a planted memory regression (and, marked slow, a
planted 100 ms sleep per step) and says so in its JSON. And in paracheck's own repository, each
commit is measured by its own worker, also a commit from before the gate had its own package."""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from paracheck.gate.run import _worker_module
from tests.integration._gate_repos import FAT_PATCH, has_commit, paracheck_clone

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


def _workflow():
    """The workflow's job: its env and its steps (a list of dicts), read with PyYAML (asv's
    dependency, in the benchmark extras)."""
    yaml = pytest.importorskip("yaml")
    with open(WORKFLOW) as f:
        # PyYAML reads the bare key `on` as True (YAML 1.1).
        doc = yaml.safe_load(f)
    assert "pull_request" in (doc.get("on") or doc.get(True)), (
        "the workflow must run on pull requests"
    )
    (job,) = doc["jobs"].values()
    assert job["env"]["PARACHECK_TARGETS"] == TARGET, job["env"]
    return job


def _step(job, *, says: str) -> str:
    """The one ``run:`` step of ``job`` whose command contains ``says``, as written."""
    runs = [step["run"] for step in job["steps"] if says in step.get("run", "")]
    assert len(runs) == 1, f"expected one step running {says!r} in {WORKFLOW}, found {runs}"
    return runs[0]


def _run_step(command: str, cwd: str, env: dict, timeout: float = 600):
    """A ``run:`` step as GitHub Actions runs it on Linux (bash -e -o pipefail)."""
    return subprocess.run(
        ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", command],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _offline_python(where) -> str:
    """A fresh virtual environment standing in for actions/setup-python: ``bin/python`` sees,
    through a .pth file, a directory of links to the installed torch, numpy, hypothesis, pip
    and setuptools and what they require, and nothing of paracheck, so that the workflow's pip
    finds torch already there and installs paracheck itself, offline. Returns its bin."""
    import importlib.metadata as md

    venv = os.path.join(where, "venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    shared = os.path.join(where, "shared-site")
    os.makedirs(shared)
    todo, seen = ["torch", "numpy", "hypothesis", "pip", "setuptools"], set()
    while todo:
        name = re.sub(r"[-_.]+", "-", todo.pop()).lower()
        if name in seen or name == "paracheck":
            continue
        seen.add(name)
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue  # an optional requirement, not installed
        for req in dist.requires or []:
            if "extra ==" not in req:
                todo.append(re.split(r"[ ;<>=!~\[(]", req, maxsplit=1)[0])
        site = str(dist.locate_file(""))
        for f in dist.files or []:
            top = f.parts[0]
            link = os.path.join(shared, top)
            if top != ".." and not os.path.lexists(link):
                os.symlink(os.path.join(site, top), link)
    (site_dir,) = [
        os.path.join(root, d)
        for root, dirs, _ in os.walk(os.path.join(venv, "lib"))
        for d in dirs
        if d == "site-packages"
    ]
    with open(os.path.join(site_dir, "offline-shared.pth"), "w") as f:
        f.write(shared + "\n")
    return os.path.join(venv, "bin")


def _source_copy(where) -> str:
    """This working tree's files (tracked and untracked, not ignored), copied where pip may
    build in them: PARACHECK_SOURCE as a directory."""
    source = os.path.join(where, "paracheck-source")
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\0")
    for rel in listed:
        if rel and os.path.isfile(os.path.join(ROOT, rel)):
            os.makedirs(os.path.dirname(os.path.join(source, rel)), exist_ok=True)
            shutil.copy2(os.path.join(ROOT, rel), os.path.join(source, rel))
    return source


def _step_env(bin_dir: str, **extra) -> dict:
    """The job's environment on the runner: its env, the pull request's base branch, the
    setup-python interpreter first on PATH; pip offline (no index; the constraints file pins
    the CPU torch on disk; the build backend from the environment, as no index can give one)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PYTHON"))}
    env.update({k: str(v) for k, v in _workflow()["env"].items()})
    env.update(
        GITHUB_BASE_REF="main",
        PATH=bin_dir + os.pathsep + os.environ.get("PATH", ""),
        PIP_NO_INDEX="1",
        PIP_CONSTRAINT=os.path.join(ROOT, "constraints.txt"),
        PIP_NO_BUILD_ISOLATION="0",  # pip's spelling of --no-build-isolation
        PIP_DISABLE_PIP_VERSION_CHECK="1",
    )
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def workflow_bin(tmp_path_factory):
    """The workflow's install step, as written, run in a fresh environment with
    PARACHECK_SOURCE a copy of this working tree; returns the environment's bin."""
    if not os.path.isdir(os.path.join(ROOT, ".git")):
        pytest.skip("needs the git repository")
    where = tmp_path_factory.mktemp("workflow")
    bin_dir = _offline_python(str(where))
    env = _step_env(bin_dir, PARACHECK_SOURCE=_source_copy(str(where)))
    install = _step(_workflow(), says="pip install")
    proc = _run_step(install, str(where), env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Successfully installed paracheck" in proc.stdout, proc.stdout[-3000:]
    return bin_dir


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


def _run_workflow_gate(repo: str, bin_dir: str, extra_args: str):
    """The workflow's gate step, as written, in ``repo`` with the installed environment."""
    env = _step_env(bin_dir, PARACHECK_GATE_ARGS=extra_args)
    return _run_step(_step(_workflow(), says="paracheck gate"), repo, env)


def test_install_step_refuses_the_placeholder_source(tmp_path):
    """Left as shipped, PARACHECK_SOURCE names no real repository: the install step stops at
    once (exit 2) saying which variable to set, before pip tries the network."""
    proc = _run_step(
        _step(_workflow(), says="pip install"), str(tmp_path), _step_env(str(tmp_path))
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "PARACHECK_SOURCE=" in proc.stderr and "set it to paracheck's repository" in proc.stderr


def test_workflow_installs_paracheck_and_fails_a_memory_regression(workflow_bin, tmp_path):
    """The workflow's install and gate steps as written, offline, in a two-commit repository
    whose head keeps a full-size gradient buffer in MyDDP: paracheck installed from its source
    (not from the repository under test), the gate exits 1 on the exact peaks whatever the
    timings, and the JSON the upload step names says FAIL for the head commit."""
    import paracheck

    repo = _user_repo(tmp_path, FAT_PATCH.format(cls="MyDDP"))
    # Two rounds decide no timing; the exact quantities decide alone.
    proc = _run_workflow_gate(repo, workflow_bin, "--rounds 2 --steps 2")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "\nFAIL: " in proc.stdout, out
    assert any(
        "peak_step_bytes" in line and "| FAIL |" in line for line in proc.stdout.splitlines()
    ), out
    upload = [s for s in _workflow()["steps"] if "upload-artifact" in s.get("uses", "")]
    (path,) = [s["with"]["path"] for s in upload]
    verdict = json.load(open(os.path.join(repo, path)))
    assert verdict["verdict"] == "FAIL" and verdict["paracheck"] == "installed", verdict
    where = subprocess.run(
        [os.path.join(workflow_bin, "python"), "-c", "import paracheck; print(paracheck.__file__)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert os.path.dirname(os.path.dirname(paracheck.__file__)) not in where, where
    assert where.startswith(os.path.dirname(workflow_bin)), where


# Two or more worker starts (torch, two ranks each) and 14 or more rounds: 1-6 min on the shared
# 2-core machine, beyond the default run's budget.
@pytest.mark.slow(reason="slow (worker starts and 14 or more rounds): run with -m slow")
def test_workflow_gate_fails_the_merge_on_a_planted_sleep(workflow_bin, tmp_path):
    """Head = base + a 100 ms sleep per step in the user's DDP: exit 1 (or 3 on a machine too
    loaded to tell, never 0) and a JSON verdict naming the step time of mypkg.ddp:MyDDP, measured
    on the two commits' trees; both commits recorded in the repository's git-ignored history."""
    repo = _user_repo(tmp_path, SLEEP_PATCH)
    # Fewer steps and seconds than the workflow's defaults (the workflow's PARACHECK_GATE_ARGS
    # knob): the planted slowdown is several times the step, so a quiet machine FAILs it in the
    # fewest rounds that can decide (14). On a machine loaded far beyond its cores a round of the
    # base can read slower than the head's (x0.54 seen at a load average of 20 on 2 cores), and
    # the budget may end first: INCONCLUSIVE, whose interval must then reach above the threshold.
    # PASS is the failure this test exists for.
    proc = _run_workflow_gate(repo, workflow_bin, "--rounds 40 --seconds 300 --steps 3")
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
