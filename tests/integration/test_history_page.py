"""asv's history pages, as ``paracheck report`` writes them, render with data in a real headless
Chromium that can reach nothing but the local page server (skipped where Chromium is absent)."""

import functools
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHROMIUM = next(
    (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)),
    None,
)
BENCH = "cpu.lm.LMPhases.track_forward"

needs_git = pytest.mark.skipif(
    not os.path.isdir(os.path.join(ROOT, ".git")), reason="needs the git repository"
)
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="no Chromium (Debian: apt-get install chromium)"
)
# The module's fixtures run asv for real (about 25 s each on two cores): its tests stay on one
# xdist worker (--dist loadgroup), which builds each fixture once.
pytestmark = pytest.mark.xdist_group("history_page")


def _asv(args, cwd, home):
    env = dict(os.environ, HOME=str(home))  # asv's machine file goes to the test's directory
    return subprocess.run(
        [sys.executable, "-m", "asv", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    """Raw ``asv publish`` output and the same after ``paracheck report``, from one real measurement."""
    pytest.importorskip(
        "asv",
        reason="the benchmark extras (pip install -c constraints.txt asv asv-runner matplotlib)",
    )
    pytest.importorskip("matplotlib")
    tmp = tmp_path_factory.mktemp("asv")
    conf = {
        "version": 1,
        "project": "paracheck",
        "repo": ROOT,
        "dvcs": "git",
        "branches": ["HEAD"],
        "environment_type": "existing",
        "benchmark_dir": os.path.join(ROOT, "benchmarks"),
        "results_dir": str(tmp / "results"),
        "html_dir": str(tmp / "html"),
    }
    (tmp / "asv.conf.json").write_text(json.dumps(conf))
    head = subprocess.run(
        ["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    for args in (
        ["machine", "--yes", "--machine", "paracheck-test"],
        [
            "run",
            "-E",
            "existing",
            "--set-commit-hash",
            head,
            "--machine",
            "paracheck-test",
            "--bench",
            r"^cpu\.lm\.LMPhases",
        ],
        ["publish"],
    ):
        proc = _asv(args + ["--config", str(tmp / "asv.conf.json")], tmp, tmp)
        assert proc.returncode == 0, (
            f"asv {args[0]} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    shutil.copytree(tmp / "html", tmp / "raw")
    from paracheck.cli import main

    assert main(["report", "--config", str(tmp / "asv.conf.json"), "--no-publish"]) == 0
    return tmp


def _render(directory, tmp, name, bench=BENCH):
    """Serve ``directory`` on 127.0.0.1 and return (DOM after scripts ran, requested paths) of
    the graph of ``bench``."""
    requested = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def log_message(self, fmt, *args):
            requested.append(self.path)

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Handler, directory=str(directory))
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}/#{bench}"
    # Every host name but the local server's address resolves to nothing: no CDN can answer.
    flags = [
        CHROMIUM,
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
        f"--user-data-dir={tmp / ('profile-' + name)}",
        "--window-size=1280,900",
        "--virtual-time-budget=10000",
    ]
    try:
        dom = subprocess.run(
            flags + ["--dump-dom", url], capture_output=True, text=True, timeout=120
        ).stdout
        subprocess.run(
            flags + [f"--screenshot={tmp / (name + '.png')}", url], capture_output=True, timeout=120
        )
    finally:
        server.shutdown()
        server.server_close()
    return dom, requested


def test_unknown_cdn_script_is_an_error(tmp_path):
    """A page loading a script paracheck does not vendor (a newer asv) fails loudly, naming the URL."""
    from paracheck.report import VendorError, vendorize

    (tmp_path / "index.html").write_text(
        '<html><script src="https://cdn.example/new.js"></script></html>'
    )
    with pytest.raises(VendorError, match="https://cdn.example/new.js"):
        vendorize(str(tmp_path))


@needs_git
def test_published_pages_load_nothing_from_the_network(pages):
    """After paracheck report no page references a script or stylesheet by an http(s) URL."""
    import re

    for dirpath, _, files in os.walk(pages / "html"):
        for f in files:
            if f.endswith(".html"):
                text = open(os.path.join(dirpath, f), encoding="utf-8").read()
                assert not re.search(r'<(script|link)[^>]+(src|href)="https?://', text), f


@needs_git
@needs_chromium
def test_history_page_renders_the_measurement_offline(pages):
    """Headless Chromium without network draws the benchmark's graph (flot canvas, legend with the parameters)."""
    dom, requested = _render(pages / "html", pages, "vendored")
    assert "Can not determine continental origin of swallow" not in dom, (
        "asv's failed-JavaScript page was shown"
    )
    assert 'class="flot-base"' in dom, "no graph was drawn"
    assert "model-cpu" in dom and "autocast-True" in dom, (
        "the graph's legend lacks the benchmark's parameters"
    )
    assert any(p.startswith("/vendor/jquery-3.3.1.min.js") for p in requested)
    assert any(BENCH in p and p.split("?")[0].endswith(".json") for p in requested), (
        "the graph's data was never fetched"
    )
    if os.environ.get("PARACHECK_SCREENSHOT_DIR"):
        shutil.copy(
            pages / "vendored.png",
            os.path.join(os.environ["PARACHECK_SCREENSHOT_DIR"], "history_page.png"),
        )


@needs_git
@needs_chromium
def test_unvendored_asv_page_fails_offline(pages):
    """The control: asv's own output, which loads its libraries from CDNs, shows no graph without network."""
    dom, _ = _render(pages / "raw", pages, "raw")
    assert 'class="flot-base"' not in dom


# -- the Regressions tab ranks real regressions first ----------------------------------------------
PLANTED = "cpu.step.StepTime.track_wall"
IMPROVED = "cpu.allreduce.AllReduce.track_seconds_per_bus_gb"
# The control: the same improvement recorded as GB/s (higher is better), a benchmark that exists
# only in this test's copy of benchmarks.json. asv must list it as a regression, or the
# assertions below could not tell a right suite from a wrong one.
CONTROL = "cpu.allreduce.AllReduce.track_busbw_gb_per_s_control"


@pytest.fixture(scope="module")
def regressions(pages):
    """asv's regressions.json for six commits of this repository whose results are planted: the
    bucketed step 25% slower from the fourth commit on (a regression) and the all-reduce bus
    bandwidth 2.38x higher from the fourth on (an improvement, which asv 0.6 would list as the
    top regression if it were recorded as GB/s)."""
    commits = subprocess.run(
        ["git", "-C", ROOT, "rev-list", "--first-parent", "-n", "6", "HEAD"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()[::-1]
    if len(commits) < 6:
        pytest.skip("needs six commits of history")
    tmp = pages / "regressions"
    shutil.copytree(pages / "results", tmp / "results")
    machine = tmp / "results" / "paracheck-test"
    real = [f for f in machine.glob("*.json") if f.name != "machine.json"]
    template = json.loads(real[0].read_text())
    for f in real:
        f.unlink()
    benchmarks = json.loads((tmp / "results" / "benchmarks.json").read_text())
    for name in (PLANTED, IMPROVED):
        assert name in benchmarks, f"{name} is not in the suite any more"
    benchmarks[CONTROL] = dict(benchmarks[IMPROVED], name=CONTROL, unit="GB/s")
    (tmp / "results" / "benchmarks.json").write_text(json.dumps(benchmarks))

    def row(name, value_of):
        params = benchmarks[name]["params"]
        import itertools

        values = [
            value_of(dict(zip(benchmarks[name]["param_names"], p)))
            for p in itertools.product(*params)
        ]
        return [values, params, benchmarks[name]["version"], template["date"], 1.0]

    for i, sha in enumerate(commits):
        after = i >= 3
        data = dict(
            template, commit_hash=sha, date=template["date"] - (len(commits) - i) * 3_600_000
        )
        data["results"] = {
            PLANTED: row(
                PLANTED, lambda p: 0.125 if (after and p["variant"] == "'bucketed'") else 0.100
            ),
            IMPROVED: row(
                IMPROVED, lambda p: (1 / 2.38 if after else 1.0) * float(p["size_mb"]) / 100
            ),
            CONTROL: row(CONTROL, lambda p: (2.38 if after else 1.0) * 100 / float(p["size_mb"])),
        }
        (machine / f"{sha[:8]}-{template['env_name']}.json").write_text(json.dumps(data))
    conf = json.loads((pages / "asv.conf.json").read_text())
    conf.update(results_dir=str(tmp / "results"), html_dir=str(tmp / "html"))
    (tmp / "asv.conf.json").write_text(json.dumps(conf))
    proc = _asv(["publish", "--config", str(tmp / "asv.conf.json")], tmp, pages)
    assert proc.returncode == 0, (
        f"asv publish failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    return json.loads((tmp / "html" / "regressions.json").read_text())["regressions"]


@needs_git
def test_regressions_list_the_planted_slowdown_and_not_the_bandwidth_gain(regressions):
    """The Regressions tab (sorted by factor, largest first) lists the bucketed step's 25%
    slowdown first and no entry for the all-reduce, whose bandwidth only improved; the same
    improvement recorded as GB/s (the control) is listed, at 2.38x."""
    # Each entry: [name, graph path, graph params, param index, last value, best value, jumps]
    control = [r for r in regressions if r[0].startswith(CONTROL)]
    assert control and all(abs(r[4] / r[5] - 2.38) < 1e-9 for r in control), (
        "asv no longer ranks a rise as a regression"
    )
    ranked = sorted(
        (r for r in regressions if not r[0].startswith(CONTROL)),
        key=lambda r: r[4] / r[5],
        reverse=True,
    )
    assert ranked, "asv found no regression at all"
    assert ranked[0][0] == f"{PLANTED}('bucketed')", [r[0] for r in ranked]
    assert abs(ranked[0][4] / ranked[0][5] - 1.25) < 1e-9
    assert not [r[0] for r in regressions if r[0].startswith(IMPROVED)]


# -- paracheck report --serve ----------------------------------------------------------------------
def test_report_serve_prints_a_url_that_serves_the_pages(tmp_path):
    """``paracheck report --no-publish --serve --port 0`` prints a 127.0.0.1 URL from which the
    history page and the plots' page are fetched; SIGINT stops it with exit 0."""
    import signal
    import urllib.request

    from tests.integration.test_interrupts import default_sigint

    pytest.importorskip(
        "asv",
        reason="the benchmark extras (pip install -c constraints.txt asv asv-runner matplotlib)",
    )
    pytest.importorskip("matplotlib")
    html_dir = tmp_path / "html"
    html_dir.mkdir()
    (html_dir / "index.html").write_text(
        "<html><title>airspeed velocity of the test</title></html>"
    )
    (tmp_path / "asv.conf.json").write_text(
        json.dumps(
            {"version": 1, "html_dir": str(html_dir), "results_dir": str(tmp_path / "results")}
        )
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from paracheck.cli import main; sys.exit(main(sys.argv[1:]))",
            "report",
            "--config",
            str(tmp_path / "asv.conf.json"),
            "--no-publish",
            "--serve",
            "--port",
            "0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_sigint,  # stopped by SIGINT below, which its parent may ignore
    )
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("serving "):
                break
        served = [ln for ln in lines if ln.startswith("serving ")]
        assert served, "".join(lines) + proc.stderr.read()
        url = served[0].split(" at ")[1].split()[0]
        assert url.startswith("http://127.0.0.1:") and not url.endswith(":0/"), url
        assert (
            "airspeed velocity of the test"
            in urllib.request.urlopen(url, timeout=30).read().decode()
        )
        assert (
            "latest measurements"
            in urllib.request.urlopen(url + "paracheck/", timeout=30).read().decode()
        )
        assert any("file://" in ln for ln in lines), "the output must say why file:// does not work"
    finally:
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=30)
    assert code == 0, proc.stderr.read()


# -- a user's repository: the gate's history, no asv configuration ---------------------------------
USER_TARGET = "mypkg.ddp:MyDDP"


def _two_commits(repo) -> list[str]:
    """A git repository at ``repo`` with two commits; returns their shas, oldest first."""
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@localhost", "-c", "commit.gpgsign=false"]
    repo.mkdir()
    subprocess.run(git + ["init", "-q", "-b", "main"], cwd=repo, check=True)
    for i in range(2):
        (repo / "ddp.py").write_text(f"VERSION = {i}\n")
        subprocess.run(git + ["add", "-A"], cwd=repo, check=True)
        subprocess.run(git + ["commit", "-q", "-m", f"commit {i}"], cwd=repo, check=True)
    out = subprocess.run(
        ["git", "rev-list", "--reverse", "HEAD"], cwd=repo, capture_output=True, text=True
    )
    return out.stdout.split()


def _gate_run(cfg, head_ms: float = 12.0):
    """What run_gate returns for one TARGET, with literal readings (base 10 ms, head
    ``head_ms``, 8 more payload bytes): the gate's recording is under test here, not its
    measuring."""
    from paracheck.gate import GateRow

    shas = {
        side: subprocess.run(
            ["git", "rev-parse", ref], cwd=cfg.repo, capture_output=True, text=True
        ).stdout.strip()
        for side, ref in (("base", cfg.base), ("head", cfg.head))
    }
    rows = [
        GateRow(USER_TARGET, "step wall time (ms)", 10.0, head_ms, "REGRESSION", "12 rounds"),
        GateRow(USER_TARGET, "payload_bytes", 1000, 1008, "REGRESSION"),
    ]
    record = {
        "base": {"ref": cfg.base, "sha": shas["base"]},
        "head": {"ref": cfg.head, "sha": shas["head"]},
        "timing": "wall",
        "timings": {USER_TARGET: {"base_s": [0.010] * 12, "head_s": [head_ms / 1e3] * 12}},
        "rows": [r.__dict__ for r in rows],
    }
    return rows, record


def _paracheck(args, cwd, home):
    env = dict(os.environ, HOME=str(home), PYTHONPATH=os.path.join(ROOT, "src"))
    return subprocess.run(
        [sys.executable, "-m", "paracheck.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def user_pages(tmp_path_factory):
    """A user's repository of two commits, gated (``paracheck gate --base HEAD~1``, measuring
    replaced by literal readings), then ``paracheck report`` run there with no asv.conf.json."""
    pytest.importorskip(
        "asv",
        reason="the benchmark extras (pip install -c constraints.txt asv asv-runner matplotlib)",
    )
    pytest.importorskip("matplotlib")
    import paracheck.gate
    from paracheck.cli import main

    tmp = tmp_path_factory.mktemp("user")
    repo = tmp / "repo"
    shas = _two_commits(repo)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(paracheck.gate, "run_gate", _gate_run)
        assert main(["gate", "--repo", str(repo), "--base", "HEAD~1", USER_TARGET]) == 1
    proc = _paracheck(["report"], repo, tmp)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return repo / ".paracheck" / "history" / "html", shas, proc.stdout


def test_gate_history_lists_both_commits(user_pages):
    """The pages built from the gate's history know both commits, draw the step time at each,
    and the thumbnails draw a series of one point as a point; the history is git-ignored."""
    html, shas, _ = user_pages
    index = json.loads((html / "index.json").read_text())
    assert sorted(index["revision_to_hash"].values()) == sorted(shas)
    assert {"gate.step.wall_time", "gate.exact.payload_bytes"} <= set(index["benchmarks"])
    summary = json.loads((html / "graphs" / "summary" / "gate.step.wall_time.json").read_text())
    assert [v for _, v in summary] == [10.0, 12.0]
    assert "points: {show: data.length < 2" in (html / "summarygrid.js").read_text()
    status = subprocess.run(
        ["git", "status", "--porcelain"], cwd=html.parents[2], capture_output=True, text=True
    ).stdout
    assert status == "", status


def test_report_counts_and_plots_the_gates_readings(user_pages):
    """``paracheck report`` on the gate's history says how many readings it holds and plots the
    step time at every recorded commit (not "plots: none"), and lists the exact quantity that
    changed between the commits."""
    html, shas, out = user_pages
    assert "history: 4 reading(s) of 2 quantities at 2 commit(s)" in out, out
    assert "plots: none" not in out and "history_gate.step.wall_time.png" in out, out
    plots = html / "paracheck"
    assert (plots / "history_gate.step.wall_time.png").stat().st_size > 0
    changes = (plots / "history_changes.md").read_text()
    assert f"| gate.exact.payload_bytes | {USER_TARGET} |" in changes
    assert f"{shas[0][:8]}: 1,000, {shas[1][:8]}: 1,008" in changes, changes
    assert "history_gate.step.wall_time.png" in (plots / "index.html").read_text()


def test_report_history_that_is_not_a_directory_is_a_usage_error(tmp_path):
    """``--history`` naming no directory: exit 2 naming the option and its value, no traceback."""
    pytest.importorskip("asv")
    proc = _paracheck(["report", "--history", str(tmp_path / "nowhere")], tmp_path, tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"--history={str(tmp_path / 'nowhere')!r} is not a directory" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_report_without_measurements_names_the_command_to_run(tmp_path):
    """No asv.conf.json and no history, or an asv.conf.json whose results are empty: exit 2,
    naming what to run first, never asv's own hint."""
    pytest.importorskip("asv")
    proc = _paracheck(["report"], tmp_path, tmp_path)
    assert proc.returncode == 2
    assert "no asv.conf.json here" in proc.stderr and "paracheck gate --base HEAD~1" in proc.stderr
    (tmp_path / "asv.conf.json").write_text(json.dumps({"version": 1, "results_dir": "results"}))
    proc = _paracheck(["report"], tmp_path, tmp_path)
    assert proc.returncode == 2
    assert "asv.conf.json has no results" in proc.stderr and "asv machine --yes" in proc.stderr


@needs_chromium
def test_gate_history_page_shows_both_commits_in_a_browser(user_pages):
    """Headless Chromium without network draws the gate's step time from the user's history:
    the graph's canvas, its data fetched, both commits in it."""
    from urllib.parse import unquote

    html, shas, _ = user_pages
    dom, requested = _render(html, html.parent, "user", bench="gate.step.wall_time")
    assert "Can not determine continental origin of swallow" not in dom
    assert 'class="flot-base"' in dom, "no graph was drawn"
    fetched = [
        p for p in requested if "gate.step.wall_time" in p and p.split("?")[0].endswith(".json")
    ]
    assert fetched, "the graph's data was never fetched"
    data = json.loads((html / unquote(fetched[-1].split("?")[0]).lstrip("/")).read_text())
    assert len(data) == 2, data


def test_bench_history_records_a_clean_commit_only(tmp_path, monkeypatch, capsys):
    """``paracheck bench --history`` records the step table (median time and exact quantities
    per variant) under HEAD; with uncommitted changes it records nothing and says why."""
    import argparse

    from paracheck.cli.bench import _record_history

    repo = tmp_path / "repo"
    head = _two_commits(repo)[-1]
    monkeypatch.chdir(repo)
    from dataclasses import asdict

    from paracheck.bench.suites import model_for

    spec = {"variant": USER_TARGET, "model": asdict(model_for("gate"))}
    record = {"step": [{"spec": spec, "median": 0.025, "account": {"collectives": 3}}]}
    args = argparse.Namespace(history="", sizes=("gate",))
    (repo / "ddp.py").write_text("VERSION = 'edited'\n")
    _record_history(args, record)
    assert "uncommitted changes" in capsys.readouterr().out
    assert not (repo / ".paracheck" / "history").exists()
    subprocess.run(["git", "checkout", "-q", "ddp.py"], cwd=repo, check=True)
    _record_history(args, record)
    (machine,) = os.listdir(repo / ".paracheck" / "history" / "measurements")
    data = json.loads(
        (repo / ".paracheck" / "history" / "measurements" / machine / f"{head}.json").read_text()
    )
    assert data["benchmarks"]["bench.step.gate.time"]["values"] == {USER_TARGET: 25.0}
    assert data["benchmarks"]["bench.exact.gate.collectives"]["values"] == {USER_TARGET: 3.0}


# -- the first screen: every commit and branch, and the regression ---------------------------------
@pytest.fixture(scope="module")
def branched_pages(tmp_path_factory):
    """A user's repository whose ``main`` holds the base and two branches one commit each off
    it: ``slower`` (step time 10 -> 12 ms) and ``alt`` (10 -> 10 ms), each gated against
    ``main`` (measuring replaced by literal readings), then ``paracheck report``. Returns the
    pages and the recorded shas: base, slower, alt."""
    pytest.importorskip(
        "asv",
        reason="the benchmark extras (pip install -c constraints.txt asv asv-runner matplotlib)",
    )
    pytest.importorskip("matplotlib")
    import paracheck.gate
    from paracheck.cli import main

    tmp = tmp_path_factory.mktemp("branched")
    repo = tmp / "repo"
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@localhost", "-c", "commit.gpgsign=false"]
    base = _two_commits(repo)[0]
    subprocess.run(git + ["checkout", "-q", "--detach"], cwd=repo, check=True)
    subprocess.run(git + ["branch", "-f", "main", base], cwd=repo, check=True)
    shas = [base]
    for branch, head_ms in (("slower", 12.0), ("alt", 10.0)):
        subprocess.run(git + ["checkout", "-q", "-b", branch, base], cwd=repo, check=True)
        (repo / "ddp.py").write_text(f"VERSION = {branch!r}\n")
        subprocess.run(git + ["commit", "-q", "-am", branch], cwd=repo, check=True)
        shas.append(
            subprocess.run(
                ["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True
            ).stdout.strip()
        )
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(paracheck.gate, "run_gate", functools.partial(_gate_run, head_ms=head_ms))
            argv = ["gate", "--repo", str(repo), "--base", "main", USER_TARGET]
            assert main(argv) == 1
    proc = _paracheck(["report"], repo, tmp)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "open on the graph of gate.step.wall_time" in proc.stdout, proc.stdout
    return repo / ".paracheck" / "history" / "html", shas


def test_history_names_the_fewest_branches_holding_every_commit(branched_pages):
    """The generated configuration names ``alt`` and ``slower`` (together they hold the three
    recorded commits) and not ``main``, whose one commit both hold; asv placed every commit."""
    html, shas = branched_pages
    conf = json.loads((html.parent / "asv.conf.json").read_text())
    assert conf["branches"] == ["alt", "slower"], conf
    index = json.loads((html / "index.json").read_text())
    assert sorted(index["revision_to_hash"].values()) == sorted(shas)


@needs_chromium
def test_first_screen_shows_every_commit_and_branch_and_the_regression(branched_pages):
    """Opened at its bare address (no view named), the history page draws the step time with
    both branches in the legend, the data of every recorded commit fetched, and a y axis from
    the base's 10 ms to the slower branch's 12 ms: the regression is on the first screen."""
    import re
    from urllib.parse import unquote

    html, shas = branched_pages
    dom, requested = _render(html, html.parent, "first", bench="")
    assert "Can not determine continental origin of swallow" not in dom
    assert 'class="flot-base"' in dom, "no graph was drawn"
    assert "branch-slower" in dom and "branch-alt" in dom, "the legend lacks a branch"
    fetched = {
        unquote(p.split("?")[0])
        for p in requested
        if p.startswith("/graphs/") and "/summary/" not in p
    }
    assert {p.split("/branch-")[1].split("/")[0] for p in fetched} == {"alt", "slower"}, fetched
    assert all(p.endswith("/gate.step.wall_time.json") for p in fetched), fetched
    index = json.loads((html / "index.json").read_text())
    drawn = set()
    for p in fetched:
        drawn |= {
            index["revision_to_hash"][str(rev)]
            for rev, _ in json.loads((html / p.lstrip("/")).read_text())
        }
    assert drawn == set(shas), "a recorded commit is not drawn"
    y_axis = re.search(r'class="flot-y-axis[^"]*"[^>]*>(.*?</div>)\s*</div>', dom, re.S)
    assert y_axis, "the graph has no y axis"
    ticks = [float(t) for t in re.findall(r">\s*([0-9.]+)\s*<", y_axis.group(1))]
    assert ticks and min(ticks) <= 10.0 and max(ticks) >= 12.0, ticks
