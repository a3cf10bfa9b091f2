"""Runs ``paracheck check`` on every design of ``corpus/`` and says, per design, what it reported
against what the design's docstring expects.

    python scripts/corpus.py [--max-examples 50] [--world-sizes 1,2,3,4] [--seeds 0,1,2]
        [--jobs 1] [--limit 300] [--only NAME,...] [--json out.json] [--paracheck-src DIR]
        [-- extra check options]
    python scripts/corpus.py --manifest     # regenerate corpus/MANIFEST.json from the docstrings

Each design's module docstring opens with ``correct`` or ``bug: <row>: <what>``, where ``<row>``
is ``core`` (a bug no optional case feature is needed for) or the optional feature
(``paracheck.check.features``) whose row of the verdict table must report it.

Reported per design and seed: a false failure (a correct design failed), or for a planted bug
whether it was reported at all, whether in its expected row, and whether its row was the first to
fail; the seconds to the first ``FAIL`` line on the check's output and in total; whether the check
printed a traceback of its own (one that starts a line: a target's is indented in its FAIL block).
A check past ``--limit`` seconds is sent SIGTERM (SIGKILL 20 s later) and counted as cut off.
``--json`` keeps every run with its rows and its failures' needed features. Exits 1 if a correct
design failed, 0 otherwise.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "corpus"
MANIFEST = CORPUS / "MANIFEST.json"
ALL_ROW = "all features"
UNLABELLED = "unlabelled"  # a failure whose needed features were not worked out
# A failure on the check's output: "FAIL target: ...", or a verdict table's "cause 1: FAIL ...",
# printed the moment it is found.
_FAIL_LINE = re.compile(r"^(?:cause \d+: )?FAIL ")


# -- the designs -------------------------------------------------------------------------------


def parse_docstring(text: str) -> tuple[str, str]:
    """A design docstring's first line -> (expected, what): ("correct", "") or (row, the bug).
    ValueError naming the line where it is neither."""
    first = (text or "").strip().splitlines()[0].strip() if (text or "").strip() else ""
    if first == "correct":
        return "correct", ""
    if first.startswith("bug: ") and first.count(":") >= 2:
        row, what = first[len("bug: ") :].split(":", 1)
        if row.strip() and what.strip():
            return row.strip(), what.strip()
    raise ValueError(f"docstring first line {first!r} must be 'correct' or 'bug: <row>: <what>'")


def _design_class(tree: ast.Module, path: Path) -> str:
    names = [n.name for n in tree.body if isinstance(n, ast.ClassDef) and n.name[0] != "_"]
    if len(names) != 1:
        raise ValueError(f"{path.name} defines {names}: one public class per design")
    return names[0]


def _kind(cls) -> str:
    """The paracheck kind of a design class, read from its constructor's first two arguments."""
    import inspect

    names = list(inspect.signature(cls).parameters)
    if len(names) >= 2 and names[1] == "optimizer_cls":
        return "zero" if names[0] == "module" else "sharded"
    return "ddp"


def read_designs(root: Path = CORPUS) -> list[dict]:
    """Every design of ``root`` (one public class per file, ``__init__`` left out), imported:
    target (the file's path and the class, as ``paracheck check`` takes them), kind, expected row (or "correct") and the bug's line."""
    import importlib

    sys.path.insert(0, str(root.parent))
    out = []
    for path in sorted(root.glob("*.py")):
        if path.name == "__init__.py":
            continue
        tree = ast.parse(path.read_text())
        expected, what = parse_docstring(ast.get_docstring(tree) or "")
        name = _design_class(tree, path)
        module = importlib.import_module(f"{root.name}.{path.stem}")
        entry = {
            "target": f"{root.name}/{path.name}:{name}",
            "kind": _kind(getattr(module, name)),
            "expected": expected,
        }
        if what:
            entry["bug"] = what
        out.append(entry)
    return out


def known_rows() -> set[str]:
    return {"core", *_optional_features()}


def _optional_features() -> tuple[str, ...]:
    """The features some contract leaves undrawn (the verdict table's rows beyond the core), closed
    over what implies or requires them, in table order."""
    from paracheck.check import features as F

    if hasattr(F, "optional_features"):
        return tuple(F.optional_features())
    off = set().union(*(c.off for c in F.CONTRACTS.values() if c.name != "full"))
    changed = True
    while changed:
        more = {f.name for f in F.FEATURES if set(f.implies + f.requires) & off} - off
        off |= more
        changed = bool(more)
    return tuple(f.name for f in F.FEATURES if f.name in off)


# -- reading a report --------------------------------------------------------------------------


def report_rows(report: dict) -> dict[str, str]:
    """One target of a ``paracheck check --json`` report -> {row: verdict}, rows in the order the
    report gives them (the first "FAIL" is the first failure reported).

    A report with ``rows`` (the verdict table) is read as it is: ``row`` (a leading "+" dropped)
    and ``status``. An older report lists ``failures``, each with the case features it ``needs``:
    each failure goes to the row of the one optional feature it needs beyond the others' implied
    ones ("core" for none, "all features" for several, "unlabelled" where needs were not worked
    out); a passing report is {"all features": "PASS"}."""
    if "rows" in report:
        return {r["row"].lstrip("+"): r["status"] for r in report["rows"]}
    if report.get("passed"):
        return {ALL_ROW: "PASS"}
    rows: dict[str, str] = {}
    for failure in report.get("failures", []):
        rows.setdefault(_row_of_needs(failure.get("needs")), "FAIL")
    return rows


def _row_of_needs(needs) -> str:
    if needs is None:
        return UNLABELLED
    from paracheck.check.features import feature

    optional = set(_optional_features())
    mine = {n for n in needs if n in optional}
    implied = {i for n in mine for i in feature(n).implies + feature(n).requires}
    mine -= implied
    if not mine:
        return "core"
    return mine.pop() if len(mine) == 1 else ALL_ROW


# -- running ------------------------------------------------------------------------------------


def run_design(design: dict, args, seed: int, extra: list[str]) -> dict:
    """One ``paracheck check`` of ``design``: its rows, what it means against the expectation, the
    seconds to the first FAIL line and in total."""
    with tempfile.TemporaryDirectory() as tmp:
        out_json = os.path.join(tmp, "report.json")
        cmd = [
            sys.executable,
            "-m",
            "paracheck.cli",
            "check",
            design["target"],
            "--kind",
            design["kind"],
            "--json",
            out_json,
            "--max-examples",
            str(args.max_examples),
            "--world-sizes",
            args.world_sizes,
            "--seed",
            str(seed),
            "--no-database",
            *extra,
        ]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [args.paracheck_src, str(ROOT), *filter(None, [env.get("PYTHONPATH")])]
        )
        t0 = time.monotonic()
        proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # its ranks are stopped with it
        )
        first_fail: list[float] = []
        lines: list[str] = []

        def read():
            for line in proc.stdout:
                if _FAIL_LINE.match(line) and not first_fail:
                    first_fail.append(time.monotonic() - t0)
                lines.append(line)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        cut_off = False
        try:
            proc.wait(timeout=args.limit)
        except subprocess.TimeoutExpired:
            cut_off = True
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        reader.join(timeout=5)
        total = time.monotonic() - t0
        report = None
        if os.path.exists(out_json):
            with open(out_json) as f:
                report = json.load(f)["targets"][0]
    rows = report_rows(report) if report is not None else {}
    failing = [r for r, v in rows.items() if v == "FAIL"]
    result = {
        "target": design["target"],
        "kind": design["kind"],
        "expected": design["expected"],
        "seed": seed,
        "rc": proc.returncode,
        "cut_off": cut_off,
        "seconds": round(total, 1),
        "first_failure_s": round(first_fail[0], 1) if first_fail else None,
        "rows": rows,
        "failing_rows": failing,
        "failures": [
            {
                "property": f["property"],
                "needs": f.get("needs"),
                "row": _row_of_needs(f.get("needs")),
            }
            for f in (report or {}).get("failures", [])
        ],
        # The check's own traceback starts a line; a target's, in a FAIL block, is indented.
        "traceback": any(line.startswith("Traceback (most recent call last)") for line in lines),
    }
    if report is None:
        result["output_tail"] = "".join(lines[-30:])
    if design["expected"] == "correct":
        result["false_failure"] = bool(failing) or proc.returncode not in (0, None) and not cut_off
    else:
        row = design["expected"]
        result["reported"] = bool(failing) or (report is None and first_fail != [])
        result["in_row"] = rows.get(row) == "FAIL"
        result["first"] = bool(failing) and failing[0] == row
    return result


def _line(r: dict) -> str:
    if r["expected"] == "correct":
        verdict = "FALSE FAILURE " + ",".join(r["failing_rows"]) if r["false_failure"] else "pass"
    else:
        verdict = (
            ("in row" if r["in_row"] else "reported" if r["reported"] else "MISSED")
            + (", first" if r["first"] else "")
            + (f" (rows {','.join(r['failing_rows'])})" if r["failing_rows"] else "")
        )
    ff = "-" if r["first_failure_s"] is None else f"{r['first_failure_s']:.0f}"
    cut = " CUT OFF" if r["cut_off"] else ""
    tb = " TRACEBACK" if r["traceback"] else ""
    name = r["target"].split("/", 1)[1]
    return (
        f"{name:58} {r['expected']:18} s{r['seed']} {ff:>5} {r['seconds']:6.0f}  {verdict}{cut}{tb}"
    )


def summarise(results: list[dict]) -> dict:
    correct = [r for r in results if r["expected"] == "correct"]
    bugs = [r for r in results if r["expected"] != "correct"]
    firsts = sorted(r["first_failure_s"] for r in bugs if r["first_failure_s"] is not None)
    totals = sorted(r["seconds"] for r in results)

    def pct(xs, q):
        return None if not xs else xs[min(len(xs) - 1, int(q * len(xs)))]

    return {
        "runs": len(results),
        "false_failures": sum(r["false_failure"] for r in correct),
        "correct_runs": len(correct),
        "bug_runs": len(bugs),
        "bugs_reported": sum(r["reported"] for r in bugs),
        "bugs_in_row": sum(r["in_row"] for r in bugs),
        "bugs_first": sum(r["first"] for r in bugs),
        "cut_off": sum(r["cut_off"] for r in results),
        "tracebacks": sum(r["traceback"] for r in results),
        "median_first_failure_s": pct(firsts, 0.5),
        "median_total_s": pct(totals, 0.5),
        "p90_total_s": pct(totals, 0.9),
    }


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--manifest", action="store_true", help="regenerate corpus/MANIFEST.json")
    ap.add_argument("--max-examples", type=int, default=50)
    ap.add_argument("--world-sizes", default="1,2,3,4")
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--jobs", type=int, default=1, help="checks run at once")
    ap.add_argument("--limit", type=float, default=300.0, help="seconds per check")
    ap.add_argument("--only", default=None, help="design file stems or targets, comma-separated")
    ap.add_argument("--json", default=None, help="write the summary and every run here")
    ap.add_argument(
        "--paracheck-src",
        default=str(ROOT / "src"),
        help="the paracheck source tree whose check runs (default: this repository's src)",
    )
    args = ap.parse_args(argv)
    if args.manifest:
        designs = read_designs()
        MANIFEST.write_text(json.dumps({"designs": designs}, indent=2) + "\n")
        print(f"wrote {MANIFEST.relative_to(ROOT)}: {len(designs)} designs")
        return 0
    for name, value, low in (("--jobs", args.jobs, 1), ("--max-examples", args.max_examples, 1)):
        if value < low:
            ap.error(f"{name}={value} must be >= {low}")
    if not (Path(args.paracheck_src) / "paracheck" / "__init__.py").is_file():
        ap.error(f"--paracheck-src={args.paracheck_src!r} has no paracheck/__init__.py")
    if args.limit <= 0:
        ap.error(f"--limit={args.limit:g} must be > 0")
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        ap.error(f"--seeds={args.seeds!r} must be integers separated by commas")
    designs = json.loads(MANIFEST.read_text())["designs"]
    if args.only:
        wanted = {w.strip() for w in args.only.split(",") if w.strip()}
        chosen = [
            d
            for d in designs
            if d["target"] in wanted or Path(d["target"].split(":")[0]).stem in wanted
        ]
        unknown = (
            wanted
            - {d["target"] for d in chosen}
            - {Path(d["target"].split(":")[0]).stem for d in chosen}
        )
        if unknown:
            ap.error(f"--only={args.only!r}: no design {sorted(unknown)[0]!r} in {MANIFEST.name}")
        designs = chosen
    jobs = [(d, s) for s in seeds for d in designs]
    print(f"{'design':58} {'expected':18} seed first  total  verdict", flush=True)
    results = []
    lock = threading.Lock()

    def one(job):
        r = run_design(job[0], args, job[1], extra)
        with lock:
            results.append(r)
            print(_line(r), flush=True)
        return r

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        list(pool.map(one, jobs))
    summary = summarise(results)
    print(json.dumps(summary, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": summary, "runs": results}, f, indent=2)
            f.write("\n")
    return 1 if summary["false_failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
