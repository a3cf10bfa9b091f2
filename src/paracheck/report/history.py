"""asv's history pages made to work offline (vendored scripts and styles) and served over HTTP;
see ``paracheck.report``."""

from __future__ import annotations

import functools
import glob
import http.server
import json
import os
import re
import shutil
import sys
from collections.abc import Callable

from paracheck.errors import VendorError

__all__ = ["VendorError", "first_screen", "serve", "vendorize"]

_WWW = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_www")
_EXTERNAL = re.compile(
    r'<(script|link)\b[^>]*?\b(src|href)="(https?://[^"]+)"[^>]*>', re.IGNORECASE
)


def _manifest() -> dict:
    if not os.path.exists(os.path.join(_WWW, "MANIFEST.json")):
        raise VendorError(
            f"{_WWW}/MANIFEST.json is missing: paracheck was installed without its package data "
            f'(pyproject: [tool.setuptools.package-data] "paracheck.report" = ["_www/*"])'
        )
    with open(os.path.join(_WWW, "MANIFEST.json")) as f:
        return {e["url"]: e for e in json.load(f)["files"]}


def vendorize(html_dir: str) -> list[str]:
    """Rewrite every ``.html`` file under ``html_dir`` to load its scripts and styles from
    ``vendor/`` (copied there); returns the URLs replaced. Raises VendorError for a URL of a
    ``<script src>`` or ``<link href>`` that the manifest does not know."""
    manifest = _manifest()
    vendor = os.path.join(html_dir, "vendor")
    os.makedirs(vendor, exist_ok=True)
    replaced: list[str] = []
    for page in glob.glob(os.path.join(html_dir, "**", "*.html"), recursive=True):
        with open(page, encoding="utf-8") as f:
            text = f.read()
        prefix = os.path.relpath(vendor, os.path.dirname(page)).replace(os.sep, "/")

        def local(match):
            tag, url = match.group(0), match.group(3)
            if match.group(1).lower() == "link" and "stylesheet" not in tag.lower():
                return tag  # a plain hyperlink-like <link>, nothing is loaded from it
            if url not in manifest:
                raise VendorError(
                    f"{os.path.relpath(page, html_dir)} loads {url}, which paracheck does not vendor "
                    f"(a newer asv?): add it to {_WWW}/MANIFEST.json and run scripts/vendor_asv_js.sh"
                )
            entry = manifest[url]
            shutil.copyfile(os.path.join(_WWW, entry["file"]), os.path.join(vendor, entry["file"]))
            replaced.append(url)
            # The page's integrity hash is the CDN file's; a local copy may be the npm package's
            # unminified build of the same version, so the attribute goes, with crossorigin.
            tag = tag.replace(url, f"{prefix}/{entry['file']}")
            tag = re.sub(r'\s(integrity|crossorigin|referrerpolicy)="[^"]*"', "", tag)
            return tag

        new = _EXTERNAL.sub(local, text)
        if new != text:
            with open(page, "w", encoding="utf-8") as f:
                f.write(new)
    shutil.copyfile(os.path.join(_WWW, "LICENSES.txt"), os.path.join(vendor, "LICENSES.txt"))
    _points_in_thumbnails(html_dir)
    _every_branch_by_default(html_dir)
    return replaced


def _patch(
    html_dir: str,
    name: str,
    pattern: re.Pattern,
    replacement: Callable[[re.Match], str],
    done: str,
    lost: str,
) -> bool:
    """Apply ``pattern`` -> ``replacement`` once to asv's ``name``; True when patched or already
    patched (``done`` is in it), False with a warning naming what is ``lost`` where the code
    is not the asv 0.6 code this knows."""
    path = os.path.join(html_dir, name)
    if not os.path.exists(path):
        return False
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if done in text:
        return True
    new, n = pattern.subn(replacement, text)
    if n != 1:
        print(
            f"paracheck report: warning: {path} is not the asv 0.6 code paracheck patches; {lost}",
            file=sys.stderr,
        )
        return False
    with open(path, "w", encoding="utf-8") as f:
        f.write(new)
    return True


# asv's grid of thumbnails draws each series as lines only: a benchmark measured at one commit
# is a line of one point, which flot draws as nothing, an empty box. Points are drawn as well
# where a series has fewer than two of them.
_THUMBNAIL_LINES = re.compile(
    r"(series:\s*\{\s*lines:\s*\{\s*show:\s*true,\s*lineWidth:\s*2\s*\},)"
)
_THUMBNAIL_POINTS = "points: {show: data.length < 2, radius: 3, fill: true},"


def _points_in_thumbnails(html_dir: str) -> bool:
    """Make asv's ``summarygrid.js`` draw a lone point; False (and a warning) where its code is
    not the one this knows (a newer asv), True when patched or already patched."""
    return _patch(
        html_dir,
        "summarygrid.js",
        _THUMBNAIL_LINES,
        lambda m: m.group(1) + " " + _THUMBNAIL_POINTS,
        _THUMBNAIL_POINTS,
        "thumbnails of a benchmark measured at one commit stay empty",
    )


# Note [The history's first screen]
#     asv's benchmark page draws one branch, the configuration's first, until another is
#     clicked: a gate of a feature branch against ``main`` opened on ``main`` with the base's
#     lone point (every y tick the same number), the slowdown out of sight. So that the first
#     screen shows every recorded commit, with a regression where there is one:
#     * the history's configuration names the fewest branches holding every recorded commit,
#       the one holding the most first (``_branches`` in ``paracheck.report.store``);
#     * ``graphdisplay.js`` selects every branch by default (``_every_branch_by_default``);
#     * the pages built from the gate's history open, when their address names no view, on the
#       graph of the largest regression asv lists, else on the step time's (``first_screen``),
#       instead of asv's grid of unlabelled thumbnails.
_FIRST_BRANCH = re.compile(r"(if \(param == 'branch'\) \{\s*state\[param\] = )\[values\[0\]\];")
_EVERY_BRANCH = "values.slice(); /* paracheck: every branch */"


def _every_branch_by_default(html_dir: str) -> bool:
    """Make asv's ``graphdisplay.js`` draw every branch until the reader deselects some (Note
    [The history's first screen]); False (and a warning) where its code is unknown."""
    return _patch(
        html_dir,
        "graphdisplay.js",
        _FIRST_BRANCH,
        lambda m: m.group(1) + _EVERY_BRANCH,
        _EVERY_BRANCH,
        "its graphs show the first branch only until another is selected",
    )


_LANDING = re.compile(r"<!-- paracheck: first screen -->.*?<!-- /paracheck -->\n?", re.S)


def first_screen(html_dir: str) -> str | None:
    """Make ``index.html`` open, when its address names no view, on the graph of the largest
    regression in asv's ``regressions.json``, else on the first benchmark measuring a step
    time (Note [The history's first screen]). Returns the benchmark chosen, None when there is
    none."""
    index = os.path.join(html_dir, "index.html")
    try:
        with open(os.path.join(html_dir, "index.json")) as f:
            names = sorted(json.load(f)["benchmarks"])
        with open(index, encoding="utf-8") as f:
            page = f.read()
    except (OSError, ValueError, KeyError):
        return None
    worst = None
    try:
        with open(os.path.join(html_dir, "regressions.json")) as f:
            # Each entry: [name with parameters, graph path, graph params, index, last, best, jumps].
            listed = [
                r
                for r in json.load(f)["regressions"]
                if r[5] and any(r[0] == n or r[0].startswith(n + "(") for n in names)
            ]
        if listed:
            worst = max(listed, key=lambda r: r[4] / r[5])[0].split("(")[0]
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        pass  # no regressions page: the step time's graph
    chosen = worst or next((n for n in names if ".step." in n), names[0] if names else None)
    if chosen is None:
        return None
    script = (
        "<!-- paracheck: first screen -->\n<script>\n"
        "  /* Note [The history's first screen] in paracheck.report.history */\n"
        "  if (!window.location.hash) {\n"
        f"    window.history.replaceState(null, '', '#' + {json.dumps(chosen)});\n"
        "  }\n</script>\n<!-- /paracheck -->\n"
    )
    page = _LANDING.sub("", page)
    page, n = re.subn(r"(<head[^>]*>\n?)", lambda m: m.group(1) + script, page, count=1)
    if n != 1:
        return None
    with open(index, "w", encoding="utf-8") as f:
        f.write(page)
    return chosen


# -- data ---------------------------------------------------------------------------------------
def serve(directory: str, port: int = 0, *, plots: str | None = None, ready=None) -> int:
    """Serve ``directory`` on 127.0.0.1:``port`` (0: a free port) until interrupted, after
    printing the URL; ``ready(server)`` is called once listening (tests stop it with
    ``server.shutdown()``). 0 when stopped, 2 when the port cannot be bound."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, fmt, *args):  # one line per request would drown the URL
            pass

    try:
        server = http.server.ThreadingHTTPServer(
            ("127.0.0.1", port), functools.partial(Quiet, directory=directory)
        )
    except OSError as exc:
        print(f"paracheck report: --port={port} cannot be used: {exc}", file=sys.stderr)
        return 2
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    print(
        f"serving {directory} at {url} (history pages)"
        + (f", plots at {url}{plots}/" if plots and not plots.startswith("..") else "")
        + "; Ctrl-C stops",
        flush=True,
    )
    if ready is not None:
        ready(server)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0
