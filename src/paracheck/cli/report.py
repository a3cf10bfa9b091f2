"""``paracheck report``: its options, then the history pages and plots written (and served)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

__all__ = ["add_parser", "cmd_report"]


def _load_conf(path: str) -> dict:
    from asv.util import load_json

    return load_json(path, js_comments=True)


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``report`` to the subcommands ``sub``."""
    import paracheck.report

    p = sub.add_parser(
        "report",
        help="build the benchmark history pages and plots, to read offline or serve",
        description=paracheck.report.__doc__.split("\n\n")[0].replace("``", ""),
    )
    p.add_argument(
        "--config",
        default=None,
        help="asv configuration (default ./asv.conf.json where it exists, else the history that "
        "paracheck gate records in .paracheck/history)",
    )
    p.add_argument(
        "--history",
        default=None,
        metavar="DIR",
        help="show this history recorded by paracheck gate instead of an asv configuration's "
        "results (default: .paracheck/history of the repository, when there is no asv.conf.json "
        "or its results are empty)",
    )
    p.add_argument(
        "--html-dir",
        default=None,
        help="override the configuration's html_dir (default: its html_dir)",
    )
    p.add_argument("--out", default=None, help="where the plots go (default <html_dir>/paracheck)")
    p.add_argument(
        "--from-json",
        action="append",
        default=[],
        help="a paracheck bench --json file (repeatable; default: none)",
    )
    p.add_argument(
        "--no-publish",
        action="store_true",
        help="do not run asv publish (vendor and plot only; default off)",
    )
    p.add_argument(
        "--serve",
        action="store_true",
        help="then serve the pages on 127.0.0.1 and print their URL until Ctrl-C (default off); opened "
        "as files the history pages stay blank: browsers refuse their data requests on file://",
    )
    p.add_argument(
        "--port", type=int, default=8080, help="port of --serve; 0 picks a free one (default 8080)"
    )
    p.set_defaults(run=cmd_report)


_RUN_FIRST = (
    "run `paracheck gate --base HEAD~1 [TARGET ...]` first (it records both commits' readings "
    "in .paracheck/history, which this then shows), or, for paracheck's own asv suite, "
    "`asv machine --yes` then `asv run --bench '^cpu\\.' HEAD^!` (minutes; "
    "benchmarks/README.md)"
)


def _toplevel() -> str:
    proc = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True)
    return proc.stdout.strip() if proc.returncode == 0 else os.getcwd()


def _asv_results(config: str) -> bool:
    """Whether the configuration's results directory holds any measurement."""
    conf = _load_conf(config)
    results = os.path.join(
        os.path.dirname(os.path.abspath(config)), conf.get("results_dir", "results")
    )
    return any(
        f.endswith(".json") and f not in ("machine.json", "benchmarks.json")
        for _, _, files in os.walk(results)
        for f in files
    )


def _config(args) -> tuple[str, str | None] | int:
    """The asv configuration to publish and the history it was generated from (None for an asv
    configuration's own results): ``--config``; else ./asv.conf.json when it has results; else
    one generated from the gate's history (Note [History without asv configuration] in
    ``paracheck.report.store``). An exit code, the next step said, when there is nothing."""
    from paracheck.report.store import asv_tree, has_measurements, summary

    if args.config is not None and args.history is not None:
        print(
            f"paracheck report: --config={args.config!r} and --history={args.history!r}: give one",
            file=sys.stderr,
        )
        return 2
    if args.config is not None:
        if not os.path.exists(args.config):
            print(f"paracheck report: --config={args.config!r} does not exist", file=sys.stderr)
            return 2
        try:
            conf = _load_conf(args.config)
        except Exception as exc:  # asv's reader raises plain ValueErrors and its own errors
            conf = exc
        if not isinstance(conf, dict):
            print(
                f"paracheck report: --config={args.config!r} is not an asv configuration "
                f"(a JSON object): {conf}",
                file=sys.stderr,
            )
            return 2
        return args.config, None
    top = _toplevel()
    history = args.history or os.path.join(top, ".paracheck", "history")
    own = "asv.conf.json" if os.path.exists("asv.conf.json") else None
    if args.history is None and own and (args.no_publish or _asv_results(own)):
        return own, None
    if args.history is not None and not os.path.isdir(args.history):
        print(f"paracheck report: --history={args.history!r} is not a directory", file=sys.stderr)
        return 2
    if has_measurements(history):
        if own:
            print(f"asv.conf.json has no results yet: showing the gate's history in {history}")
        held = summary(history)
        print(
            f"history: {held['readings']} reading(s) of {len(held['benchmarks'])} quantities at "
            f"{held['commits']} commit(s) on {', '.join(held['machines'])}, in {history}"
        )
        config, lost = asv_tree(history, top)
        for sha in lost:
            print(
                f"paracheck report: warning: commit {sha[:10]} is recorded but on no local branch: "
                f"asv cannot place it, it is left out",
                file=sys.stderr,
            )
        return config, history
    where = f"{own} has no results and " if own else "no asv.conf.json here and "
    print(
        f"paracheck report: {where}no history in {history}: {_RUN_FIRST}",
        file=sys.stderr,
    )
    return 2


def _json_error(path: str) -> str | None:
    """Why ``path`` is not a ``paracheck bench --json`` record, or None."""
    import json

    if not os.path.isfile(path):
        return "does not exist" if not os.path.exists(path) else "is not a file"
    try:
        with open(path) as f:
            record = json.load(f)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        return f"is not a JSON file: {exc}"
    if not isinstance(record, dict):
        return f"holds a JSON {type(record).__name__}, not the object paracheck bench --json writes"
    from paracheck.report import collect

    try:
        collect(None, [path])
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        return f"is not in the form paracheck bench --json writes ({type(exc).__name__}: {exc})"
    return None


def cmd_report(args) -> int:
    """``paracheck report``: 0 when the pages and plots are written, 1 when asv publish or the
    vendoring fails, 2 on a usage error."""
    import importlib.util

    from paracheck.report import VendorError, collect, first_screen, plot_all, serve, vendorize

    missing = [m for m in ("asv", "matplotlib") if importlib.util.find_spec(m) is None]
    if missing:
        print(
            f"paracheck report: needs {' and '.join(missing)}, not installed: paracheck's "
            f"benchmark extras (in its clone: pip install -c constraints.txt -e '.[bench]'; "
            f"else pip install 'asv>=0.6,<0.7' asv-runner matplotlib)",
            file=sys.stderr,
        )
        return 2
    if not 0 <= args.port <= 65535:
        print(f"paracheck report: --port={args.port} must be in 0..65535", file=sys.stderr)
        return 2
    for path in args.from_json:
        error = _json_error(path)
        if error:
            print(f"paracheck report: --from-json={path!r} {error}", file=sys.stderr)
            return 2
    if args.out is not None and os.path.exists(args.out) and not os.path.isdir(args.out):
        print(f"paracheck report: --out={args.out!r} is not a directory", file=sys.stderr)
        return 2
    chosen = _config(args)
    if isinstance(chosen, int):
        return chosen
    args.config, history = chosen
    conf = _load_conf(args.config)
    base = os.path.dirname(os.path.abspath(args.config))
    html_dir = os.path.join(base, args.html_dir or conf.get("html_dir", "html"))
    results_dir = os.path.join(base, conf.get("results_dir", "results"))
    if not args.no_publish:
        cmd = [sys.executable, "-m", "asv", "publish", "--config", os.path.abspath(args.config)]
        if args.html_dir:
            cmd += ["--html-dir", html_dir]
        proc = subprocess.run(cmd, cwd=base, capture_output=True, text=True)
        if proc.returncode != 0:
            print(
                f"paracheck report: asv publish failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}",
                file=sys.stderr,
            )
            return 1
    if os.path.exists(os.path.join(html_dir, "index.html")):
        try:
            replaced = vendorize(html_dir)
        except VendorError as exc:
            print(f"paracheck report: {exc}", file=sys.stderr)
            return 1
        # Note [The history's first screen] in paracheck.report.history.
        opened = first_screen(html_dir) if history else None
        if opened:
            print(f"history pages open on the graph of {opened}, every branch drawn")
        print(
            f"history pages: {html_dir}/index.html ({len(set(replaced))} CDN references served from vendor/); "
            f"view them with `paracheck report --no-publish --serve` (or any static HTTP server): opened as a "
            f"file the page stays blank, as browsers refuse its data requests on file:// URLs"
        )
    else:
        print(f"history pages: none in {html_dir} (run asv publish, or drop --no-publish)")
    out = args.out or os.path.join(html_dir, "paracheck")
    written = plot_all(collect(results_dir, args.from_json, history, _toplevel()), out)
    print(f"plots: {', '.join(written) or 'none (no measurements)'} in {out}")
    if args.serve:
        return serve(html_dir, args.port, plots=os.path.relpath(out, html_dir))
    return 0
