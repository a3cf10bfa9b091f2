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
CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)
BENCH = "cpu.lm.LMPhases.track_forward"

needs_git = pytest.mark.skipif(not os.path.isdir(os.path.join(ROOT, ".git")), reason="needs the git repository")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium (Debian: apt-get install chromium)")


def _asv(args, cwd, home):
    env = dict(os.environ, HOME=str(home))  # asv's machine file goes to the test's directory
    return subprocess.run([sys.executable, "-m", "asv", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    """Raw ``asv publish`` output and the same after ``paracheck report``, from one real measurement."""
    pytest.importorskip("asv", reason="the benchmark extras (pip install -c constraints.txt asv asv-runner matplotlib)")
    pytest.importorskip("matplotlib")
    tmp = tmp_path_factory.mktemp("asv")
    conf = {"version": 1, "project": "paracheck", "repo": ROOT, "dvcs": "git", "branches": ["HEAD"],
            "environment_type": "existing", "benchmark_dir": os.path.join(ROOT, "benchmarks"),
            "results_dir": str(tmp / "results"), "html_dir": str(tmp / "html")}
    (tmp / "asv.conf.json").write_text(json.dumps(conf))
    head = subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    for args in (["machine", "--yes", "--machine", "paracheck-test"],
                 ["run", "-E", "existing", "--set-commit-hash", head, "--machine", "paracheck-test",
                  "--bench", r"^cpu\.lm\.LMPhases"],
                 ["publish"]):
        proc = _asv(args + ["--config", str(tmp / "asv.conf.json")], tmp, tmp)
        assert proc.returncode == 0, f"asv {args[0]} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    shutil.copytree(tmp / "html", tmp / "raw")
    from paracheck.bench.report import main

    assert main(["--config", str(tmp / "asv.conf.json"), "--no-publish"]) == 0
    return tmp


def _render(directory, tmp, name):
    """Serve ``directory`` on 127.0.0.1 and return (DOM after scripts ran, requested paths)."""
    requested = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def log_message(self, fmt, *args):
            requested.append(self.path)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(directory)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}/#{BENCH}"
    # Every host name but the local server's address resolves to nothing: no CDN can answer.
    flags = [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1", f"--user-data-dir={tmp / ('profile-' + name)}",
             "--window-size=1280,900", "--virtual-time-budget=10000"]
    try:
        dom = subprocess.run(flags + ["--dump-dom", url], capture_output=True, text=True, timeout=120).stdout
        subprocess.run(flags + [f"--screenshot={tmp / (name + '.png')}", url], capture_output=True, timeout=120)
    finally:
        server.shutdown()
        server.server_close()
    return dom, requested


def test_unknown_cdn_script_is_an_error(tmp_path):
    """A page loading a script paracheck does not vendor (a newer asv) fails loudly, naming the URL."""
    from paracheck.bench.report import VendorError, vendorize

    (tmp_path / "index.html").write_text('<html><script src="https://cdn.example/new.js"></script></html>')
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
    assert "Can not determine continental origin of swallow" not in dom, "asv's failed-JavaScript page was shown"
    assert 'class="flot-base"' in dom, "no graph was drawn"
    assert "model-cpu" in dom and "autocast-True" in dom, "the graph's legend lacks the benchmark's parameters"
    assert any(p.startswith("/vendor/jquery-3.3.1.min.js") for p in requested)
    assert any(BENCH in p and p.split("?")[0].endswith(".json") for p in requested), "the graph's data was never fetched"
    if os.environ.get("PARACHECK_SCREENSHOT_DIR"):
        shutil.copy(pages / "vendored.png", os.path.join(os.environ["PARACHECK_SCREENSHOT_DIR"], "history_page.png"))


@needs_git
@needs_chromium
def test_unvendored_asv_page_fails_offline(pages):
    """The control: asv's own output, which loads its libraries from CDNs, shows no graph without network."""
    dom, _ = _render(pages / "raw", pages, "raw")
    assert 'class="flot-base"' not in dom
