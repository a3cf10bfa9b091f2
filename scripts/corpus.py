"""Runs ``paracheck check`` on every design of ``corpus/`` and says, per design, what it reported
against what the design's docstring expects.

    python scripts/corpus.py [--max-examples 50] [--world-sizes 1,2,3,4] [--seeds 0,1,2]
        [--jobs 1] [--limit 300] [--only NAME,...] [--json out.json] [--paracheck-src DIR]
        [-- extra check options]
    python scripts/corpus.py --manifest     # regenerate corpus/MANIFEST.json from the docstrings

    python scripts/corpus.py --analyse RUNS.json [--only ...] [--json out.json]
                                            # judge an earlier --json file's runs again

Each design's module docstring opens with a header (``parse_docstring``; ``corpus/README.md``):
``correct``, or one ``bug: <row>: <what>`` line per planted bug, each with the properties it
``shows:`` and a ``match:`` pattern below it, and a ``cuda:`` line where the design calls
CUDA-only code. ``<row>`` is ``core`` (no optional case feature needed), an optional feature
(``paracheck.check.features``), two joined by "+", or alternatives joined by "|". Each bug is "in"
the CS336 contract or "beyond" it (``contract_of``).

Reported per design and seed: a false failure (a correct design failed), or for each planted bug
(``judge``) whether it was printed with its own cause block (and in its row), found but folded
under another cause, reported only "as above", left in a row the budget never reached, or
missed; the printed causes no bug explains, a bug printed twice, whether every in-contract bug
came before every one beyond the contract, failures called paracheck's harness's, whether the
CUDA call was named; the seconds to the first ``FAIL`` line on the check's output and in total;
whether the check printed a traceback of its own (one that starts a line: a target's is
indented in its FAIL block). A check past ``--limit`` seconds is sent SIGTERM (SIGKILL 20 s
later) and counted as cut off. ``--json`` keeps every run with its report and verdicts, and the
totals per category. Exits 1 if a correct design failed, 0 otherwise.
"""

from __future__ import annotations

import argparse
import ast
import itertools
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

# Properties the CS336 interfaces do not promise, though no contract turns them off: the balance
# of the state a sharded optimizer's ranks step (``Contract.stepped_balance``, False for CS336),
# and the optimizer state read from state_dict() (the handout's ShardedOptimizer has none, and its
# contract never reloads one). A bug seen only through them is beyond that contract even in the
# core row. The ``reshard`` property judges only resumed cases, which the CS336 contract never
# draws (a state dict that cannot be resumed elsewhere shows there beside its reload).
_UNPROMISED_PROPERTIES = frozenset(
    {"balance", "memory", "optimizer-state", "state-consolidated", "reshard"}
)
# The contract a bug is judged "in" or "beyond": the one the corpus's interfaces are written for.
CONTRACT = "cs336"


def parse_docstring(text: str) -> dict:
    """A design docstring's header (its lines up to the first blank one) -> {"expected": "correct"}
    or {"expected": "bug", "bugs": [...], "cuda": what or None}. Each bug: ``rows`` (its row, or
    alternatives), ``what``, ``shows`` (the properties it can fail; empty: any) and ``match`` (a
    regular expression the failure's text must contain; None: any). ValueError naming the line
    that is none of these."""
    lines = []
    for line in (text or "").strip().splitlines():
        if not line.strip():
            break
        lines.append(line.rstrip())
    if lines == ["correct"]:
        return {"expected": "correct"}
    bugs: list[dict] = []
    cuda = None
    for line in lines:
        stripped = line.strip()
        if line.startswith("bug: ") and stripped.count(":") >= 2:
            rows, what = stripped[len("bug: ") :].split(":", 1)
            rows = [r.strip() for r in rows.split("|") if r.strip()]
            if not rows or not what.strip():
                raise ValueError(f"docstring line {line!r}: 'bug: <row>[|<row>]: <what>'")
            bugs.append({"rows": rows, "what": what.strip(), "shows": [], "match": None})
        elif line.startswith("cuda: ") and stripped[len("cuda: ") :].strip():
            cuda = stripped[len("cuda: ") :].strip()
        elif line.startswith("    shows: ") and bugs and not bugs[-1]["shows"]:
            bugs[-1]["shows"] = [p.strip() for p in stripped[len("shows: ") :].split(",")]
        elif line.startswith("    match: ") and bugs and bugs[-1]["match"] is None:
            bugs[-1]["match"] = stripped[len("match: ") :].strip()
            re.compile(bugs[-1]["match"])
        else:
            raise ValueError(
                f"docstring line {line!r} must be 'correct' (alone), 'bug: <row>: <what>' (with "
                "'    shows: <property>, ...' and '    match: <regex>' below it) or 'cuda: <what>'"
            )
    if not bugs:
        raise ValueError(f"docstring header {lines!r} has no 'bug: <row>: <what>' line")
    return {"expected": "bug", "bugs": bugs, "cuda": cuda}


def contract_of(bug: dict) -> str:
    """ "in" where ``CONTRACT``'s cases can show ``bug``, "beyond" where it needs a feature that
    contract never draws (in every row it may be reported in) or shows only through properties its
    interfaces do not promise (``_UNPROMISED_PROPERTIES``)."""
    beyond = _beyond_features()
    if all(any(f in beyond for f in row.split("+")) for row in bug["rows"]):
        return "beyond"
    if bug["shows"] and set(bug["shows"]) <= _UNPROMISED_PROPERTIES:
        return "beyond"
    return "in"


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
    target (the file's path and the class, as ``paracheck check`` takes them), kind, "correct" or
    "bug", and its bugs (each with ``contract``: "in" or "beyond", ``contract_of``) and CUDA call."""
    import importlib

    sys.path.insert(0, str(root.parent))
    out = []
    for path in sorted(root.glob("*.py")):
        if path.name == "__init__.py":
            continue
        tree = ast.parse(path.read_text())
        try:
            parsed = parse_docstring(ast.get_docstring(tree) or "")
        except ValueError as exc:
            raise ValueError(f"{path.name}: {exc}") from None
        name = _design_class(tree, path)
        module = importlib.import_module(f"{root.name}.{path.stem}")
        entry = {
            "target": f"{root.name}/{path.name}:{name}",
            "kind": _kind(getattr(module, name)),
            "expected": parsed["expected"],
        }
        if parsed["expected"] == "bug":
            entry["bugs"] = [{**b, "contract": contract_of(b)} for b in parsed["bugs"]]
            if parsed["cuda"]:
                entry["cuda"] = parsed["cuda"]
        out.append(entry)
    return out


def known_rows() -> set[str]:
    return {"core", *_optional_features()}


def row_known(row: str) -> bool:
    """Whether ``row`` is the core, an optional feature, or two optional features joined by "+"."""
    optional = set(_optional_features())
    parts = row.split("+")
    return row == "core" or (len(parts) <= 2 and all(p in optional for p in parts))


def _beyond_features() -> set[str]:
    """The features ``CONTRACT`` never draws, with those that imply or require them."""
    from paracheck.check import features as F

    off = set(F.CONTRACTS[CONTRACT].off)
    changed = True
    while changed:
        more = {f.name for f in F.FEATURES if set(f.implies + f.requires) & off} - off
        off |= more
        changed = bool(more)
    return off


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


# -- judging a report against the planted bugs ---------------------------------------------------

_HARNESS = "paracheck's harness raised"
# What torch says of a CUDA-only call on a CPU build (case-sensitive: paracheck's own module that
# stubs those calls, ``_cuda_stub``, is named in its ranks' tracebacks).
_CUDA_TEXT = re.compile(r"torch\.cuda|CUDA|NVTX|nvtx|NVIDIA|dummy base class Event")


def _failure_text(f: dict) -> str:
    """What identifies a failure of a ``--json`` report: its property's meaning, what failed or
    diverged (tensor, step, exception, collectives), and what its ranks printed."""
    parts = [f.get("meaning") or "", f.get("detail") or ""]
    for key in ("divergence", "hang", "outputs"):
        if f.get(key):
            parts.append(json.dumps(f[key], sort_keys=True))
    return "\n".join(parts)


def _failure_rows(report: dict) -> list[str | None]:
    """The row each failure of ``report`` was filed under ("core", "buffer", "a+b", "all
    features"), None for one no row owns: the failure's own ``row`` where the report gives it,
    otherwise the rows' own causes (``property`` then ``more``) taken in the order found."""
    failures = report.get("failures", [])
    if failures and all("row" in f for f in failures):
        return [None if f["row"] is None else f["row"].lstrip("+") for f in failures]
    out: list[str | None] = [None] * len(failures)
    for row in report.get("rows", []):
        own = ([row["property"]] if row.get("property") else []) + list(row.get("more") or [])
        for prop in own:
            i = next(
                (i for i, f in enumerate(failures) if out[i] is None and f["property"] == prop),
                None,
            )
            if i is not None:
                out[i] = row["row"].lstrip("+")
    # A failure of a case run before a row's search (a saved case, a kind's first case) that the
    # row did not take as its own is listed among its "as above": the first such row is its.
    for row in report.get("rows", []):
        for prop in row.get("also") or []:
            i = next(
                (i for i, f in enumerate(failures) if out[i] is None and f["property"] == prop),
                None,
            )
            if i is not None:
                out[i] = row["row"].lstrip("+")
    return out


def _cause_key(f: dict) -> tuple:
    """The cause of a failure, as ``paracheck.check.verdict.cause_of`` draws it from what the JSON
    keeps: the first diverging tensor and rank, the hung or raising frames of the target's own
    files, or the exception's last line."""
    if f.get("cause") is not None:
        return ("cause", f["cause"])
    d = f.get("divergence") or {}
    if d.get("name") is not None or d.get("index") is not None:
        return (
            "tensor",
            d.get("name") if d.get("name") is not None else d.get("index"),
            d.get("rank"),
        )
    detail = f.get("detail") or ""
    own = frozenset(re.findall(r'File "[^"]*/corpus/[^"]+", line \d+ in \S+', detail))
    if f["property"] in ("hang", "died") and own:
        return (f["property"], own)
    if f["property"] == "raised":
        lines = [ln.strip() for ln in detail.splitlines() if ln.strip()]
        last = next(
            (ln for ln in reversed(lines) if re.match(r"^[\w.]+(Error|Exception)\b", ln)), ""
        )
        return ("raised", re.sub(r"\d+", "N", last), own)
    return (f["property"], re.sub(r"\d+", "N", (f.get("hang") or {}).get("disagreement", "")))


def cause_blocks(report: dict) -> list[list[int]]:
    """The failures of ``report`` (indices) grouped by cause, in the order found: the verdict
    table's cause blocks. The first failure of each is the one printed with its case as the check
    runs; a later failure of the same cause is printed as "P in row R: cause N again", without its
    case."""
    groups: dict[tuple, list[int]] = {}
    for i, f in enumerate(report.get("failures", [])):
        groups.setdefault(_cause_key(f), []).append(i)
    return list(groups.values())


def _candidates(bug: dict, failures: list[dict]) -> list[int]:
    pattern = re.compile(bug["match"], re.IGNORECASE) if bug.get("match") else None
    return [
        i
        for i, f in enumerate(failures)
        if not f.get("_cuda")
        and (not bug["shows"] or f["property"] in bug["shows"])
        and (pattern is None or pattern.search(_failure_text(f)))
    ]


def _assign(bugs: list[dict], failures: list[dict], heads: set, frows: list) -> dict[int, int]:
    """Which failure (index) is which bug's, each failure one bug's at most: of the assignments
    that respect each bug's ``shows`` and ``match``, the one with the most bugs printed, then in
    their row, then found. Bugs of one property told apart by no pattern are matched by count:
    two such bugs and one cause make one printed and one not."""
    cands = [_candidates(bug, failures) for bug in bugs]
    best: tuple = (-1,)
    choice: dict[int, int] = {}
    for order in itertools.permutations(range(len(bugs))):
        taken: dict[int, int] = {}
        for b in order:
            free = [i for i in cands[b] if i not in taken]
            if free:
                key = lambda i, b=b: (i not in heads, frows[i] not in bugs[b]["rows"], i)
                taken[min(free, key=key)] = b
        score = (
            sum(i in heads for i in taken),
            # A failure another bug's own pattern names is that bug's, not a patternless one's.
            -sum(
                any(o != b and bugs[o].get("match") and i in cands[o] for o in range(len(bugs)))
                for i, b in taken.items()
            ),
            sum(frows[i] in bugs[b]["rows"] for i, b in taken.items()),
            len(taken),
        )
        if score > best:
            best, choice = score, taken
    return choice


def judge(design: dict, report: dict | None) -> dict:
    """What ``report`` (one target of ``paracheck check --json``) did with each planted bug of
    ``design``: ``bugs`` (one verdict each, below), ``causes`` (each printed cause block: its
    number, row, property and the bug it is, or None), ``unexplained`` (printed causes no planted
    bug or CUDA call explains: false failures on a correct design, to judge by hand on a buggy
    one), ``split`` (printed causes that another cause's bug explains too: one bug printed twice), ``blame`` (failures called paracheck's harness's), ``cuda`` (whether a printed cause is
    the design's CUDA call), ``order`` (every in-contract bug printed before every one beyond the
    contract: None where the design lacks either) and ``first_beyond`` (cause 1 is beyond the
    contract although an in-contract bug is planted).

    A bug's verdict: "printed" (its own cause block; ``in_row`` where filed under one of its rows),
    "not printed" (found, but folded under another property's cause block without its case),
    "as above" (its row failed only "as above" properties it can show), "budget" (its row not
    reached or stopped by the budget), "not drawn" (its row was not searched), "missed"."""
    if not report:
        none = {"status": "no report", "cause": None, "row": None, "in_row": False}
        return {
            "bugs": [{**none, "contract": b["contract"]} for b in design.get("bugs", [])],
            "causes": [],
            "unexplained": [],
            "split": 0,
            "blame": 0,
            "cuda": None,
            "order": None,
            "first_beyond": False,
        }
    failures = report.get("failures", [])
    rows = {r["row"].lstrip("+"): r for r in report.get("rows", [])}
    blocks = cause_blocks(report) if failures else []
    number = {i: n + 1 for n, g in enumerate(blocks) for i in g}
    heads = {min(g) for g in blocks}
    frows = _failure_rows(report) if failures else []
    bugs = design.get("bugs", [])
    if design.get("cuda"):  # the design's CUDA call is no planted bug's failure
        failures = [
            {**f, "_cuda": True} if _CUDA_TEXT.search(_failure_text(f)) else f for f in failures
        ]
    taken = _assign(bugs, failures, heads, frows)  # failure -> bug
    cands = [_candidates(bug, failures) for bug in bugs]
    found = {b: i for i, b in taken.items()}
    verdicts = []
    for b, bug in enumerate(bugs):
        if b in found:
            i = found[b]
            verdicts.append(
                {
                    "status": "printed" if i in heads else "not printed",
                    "cause": number[i],
                    "row": frows[i],
                    "in_row": frows[i] in bug["rows"],
                }
            )
            continue
        mine = [rows.get(r) for r in bug["rows"] if rows.get(r)]
        also = {p for r in mine if r["status"] == "FAIL" for p in r.get("also") or []}
        status = "missed"
        if also and (not bug["shows"] or also & set(bug["shows"])):
            status = "as above"
        elif any(r["status"] == "not reached" or "budget" in (r.get("why") or "") for r in mine):
            status = "budget"
        elif mine and all(r["status"] in ("not drawn", "not supported") for r in mine):
            status = "not drawn"
        verdicts.append({"status": status, "cause": None, "row": None, "in_row": False})
    for v, bug in zip(verdicts, bugs):
        v["contract"] = bug["contract"]
    causes = []
    for n, g in enumerate(blocks):
        f = failures[g[0]]
        b = taken.get(g[0])
        cuda = f.get("_cuda", False)
        # A printed cause that a bug matched to another cause explains too: the bug split in two.
        again = None
        if b is None and not cuda:
            again = next((c for c, ids in enumerate(cands) if g[0] in ids), None)
        causes.append(
            {
                "cause": n + 1,
                "row": frows[g[0]],
                "property": f["property"],
                "bug": b,
                "again": again,
                "cuda": bool(cuda),
                "line": (f.get("meaning") or "").split("\n")[0][:160],
            }
        )
    # A bug printed again as another block (split) counts where it is first printed.
    first = {b: v["cause"] for b, v in enumerate(verdicts) if v["status"] == "printed"}
    for c in causes:
        if c["again"] is not None and c["again"] in first:
            first[c["again"]] = min(first[c["again"]], c["cause"])
    printed = [(first[b], verdicts[b]["contract"]) for b in sorted(first)]
    ins = [v for v in verdicts if v["contract"] == "in"]
    order = None
    if ins and any(v["contract"] == "beyond" for v in verdicts):
        last_in = max((c for c, k in printed if k == "in"), default=0)
        first_beyond = min((c for c, k in printed if k == "beyond"), default=len(blocks) + 1)
        order = all(v["status"] == "printed" for v in ins) and last_in < first_beyond
    first_beyond = False
    if ins and causes:
        c1 = causes[0]
        b1 = c1["bug"] if c1["bug"] is not None else c1["again"]
        first_beyond = (
            bugs[b1]["contract"] == "beyond"
            if b1 is not None
            else c1["row"] not in (None, "core", ALL_ROW)
        )
    return {
        "bugs": verdicts,
        "causes": causes,
        "unexplained": [
            c for c in causes if c["bug"] is None and c["again"] is None and not c["cuda"]
        ],
        "split": sum(c["again"] is not None for c in causes),
        "blame": sum((f.get("meaning") or "").startswith(_HARNESS) for f in failures),
        "cuda": any(c["cuda"] for c in causes) if design.get("cuda") else None,
        "order": order,
        "first_beyond": first_beyond,
    }


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
    result = {
        "target": design["target"],
        "kind": design["kind"],
        "expected": design["expected"],
        "seed": seed,
        "rc": proc.returncode,
        "cut_off": cut_off,
        "seconds": round(total, 1),
        "first_failure_s": round(first_fail[0], 1) if first_fail else None,
        # The check's own traceback starts a line; a target's, in a FAIL block, is indented.
        "traceback": any(line.startswith("Traceback (most recent call last)") for line in lines),
        "report": report,
    }
    if report is None:
        result["output_tail"] = "".join(lines[-30:])
    return result


def verdicts(design: dict, run: dict) -> dict:
    """``run`` (one ``run_design``) judged against ``design``: its rows and failing rows, and for a
    correct design whether it failed (a false failure), for a buggy one ``judge``'s verdicts."""
    report = run.get("report")
    rows = report_rows(report) if report is not None else {}
    out = {"rows": rows, "failing_rows": [r for r, v in rows.items() if v == "FAIL"]}
    if design["expected"] == "correct":
        # Exit 3 is INCOMPLETE (rows the budget did not reach), not a failure.
        out["false_failure"] = bool(out["failing_rows"]) or (
            run["rc"] not in (0, 3, None) and not run["cut_off"]
        )
    else:
        out.update(judge(design, report))
    return out


_SHORT = {
    "printed": "P",
    "not printed": "N",
    "as above": "A",
    "budget": "B",
    "not drawn": "D",
    "missed": "M",
    "no report": "?",
}


def _line(design: dict, r: dict, v: dict) -> str:
    if design["expected"] == "correct":
        verdict = "FALSE FAILURE " + ",".join(v["failing_rows"]) if v["false_failure"] else "pass"
    else:
        marks = []
        for bug, b in zip(design["bugs"], v["bugs"]):
            mark = _SHORT[b["status"]]
            if b["status"] == "printed":
                mark += f"{b['cause']}" + ("" if b["in_row"] else f"@{b['row']}")
            marks.append(f"{bug['rows'][0]}{'' if bug['contract'] == 'in' else '*'}={mark}")
        verdict = " ".join(marks)
        if v["unexplained"]:
            verdict += f"  +{len(v['unexplained'])} unexplained"
        if v["order"] is False:
            verdict += "  ORDER"
        if v["blame"]:
            verdict += f"  BLAME x{v['blame']}"
        if v["cuda"] is not None:
            verdict += "  cuda " + ("named" if v["cuda"] else "not named")
    ff = "-" if r["first_failure_s"] is None else f"{r['first_failure_s']:.0f}"
    cut = " CUT OFF" if r["cut_off"] else ""
    tb = " TRACEBACK" if r["traceback"] else ""
    name = r["target"].split("/", 1)[1].split(":")[0]
    return f"{name:40} s{r['seed']} {ff:>5} {r['seconds']:6.0f}  {verdict}{cut}{tb}"


def _pct(xs, q):
    xs = sorted(xs)
    return None if not xs else xs[min(len(xs) - 1, int(q * len(xs)))]


def summarise(pairs: list[tuple[dict, dict, dict]]) -> dict:
    """The figures over every (design, run, verdicts): per category of planted bug (over every bug
    of every run, and for bugs in and beyond the contract), the false and unexplained causes, the
    order, the blame, the CUDA diagnoses and the times."""
    correct = [(d, r, v) for d, r, v in pairs if d["expected"] == "correct"]
    buggy = [(d, r, v) for d, r, v in pairs if d["expected"] != "correct"]
    bugs = [b for _, _, v in buggy for b in v["bugs"]]

    def tally(bs):
        out = {s: sum(b["status"] == s for b in bs) for s in _SHORT}
        out["in_row"] = sum(b["status"] == "printed" and b["in_row"] for b in bs)
        out["total"] = len(bs)
        return out

    orders = [v["order"] for _, _, v in buggy if v["order"] is not None]
    with_in = [v for d, _, v in buggy if any(b["contract"] == "in" for b in d["bugs"])]
    cuda = [v["cuda"] for _, _, v in buggy if v["cuda"] is not None]
    firsts = [r["first_failure_s"] for _, r, _ in buggy if r["first_failure_s"] is not None]
    return {
        "runs": len(pairs),
        "correct_runs": len(correct),
        "false_failures": sum(v["false_failure"] for _, _, v in correct),
        "bug_runs": len(buggy),
        "bugs": tally(bugs),
        "bugs_in_contract": tally([b for b in bugs if b["contract"] == "in"]),
        "bugs_beyond_contract": tally([b for b in bugs if b["contract"] == "beyond"]),
        "order_kept": sum(orders),
        "order_runs": len(orders),
        "cause1_beyond": sum(v["first_beyond"] for v in with_in),
        "runs_with_in_contract_bugs": len(with_in),
        "unexplained_causes": sum(len(v["unexplained"]) for _, _, v in buggy),
        "split_causes": sum(v.get("split", 0) for _, _, v in buggy),
        "unexplained_in_contract_rows": sum(
            c["row"] in ("core", None) for _, _, v in buggy for c in v["unexplained"]
        ),
        "blame": sum(v.get("blame", 0) for _, _, v in buggy),
        "cuda_named": sum(cuda),
        "cuda_runs": len(cuda),
        "cut_off": sum(r["cut_off"] for _, r, _ in pairs),
        "tracebacks": sum(r["traceback"] for _, r, _ in pairs),
        "median_first_cause_s": _pct(firsts, 0.5),
        "median_total_s": _pct([r["seconds"] for _, r, _ in pairs], 0.5),
        "p90_total_s": _pct([r["seconds"] for _, r, _ in pairs], 0.9),
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
        "--analyse",
        default=None,
        metavar="RUNS.json",
        help="judge the runs of an earlier --json file again (against today's manifest), run none",
    )
    ap.add_argument(
        "--paracheck-src",
        default=str(ROOT / "src"),
        help="the paracheck source tree whose check runs (default: this repository's src)",
    )
    args = ap.parse_args(argv)
    sys.path.insert(0, args.paracheck_src)  # the judging reads its property table
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
    by_target = {d["target"]: d for d in designs}
    if args.analyse:
        with open(args.analyse) as f:
            results = [r for r in json.load(f)["runs"] if r["target"] in by_target]
        return _report(args, [(by_target[r["target"]], r) for r in results], print_lines=True)
    jobs = [(d, s) for s in seeds for d in designs]
    print(f"{'design':40} seed first  total  verdict per bug (row=..., * beyond {CONTRACT})")
    results = []
    lock = threading.Lock()

    def one(job):
        r = run_design(job[0], args, job[1], extra)
        with lock:
            results.append((job[0], r))
            print(_line(job[0], r, verdicts(job[0], r)), flush=True)
        return r

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        list(pool.map(one, jobs))
    return _report(args, results, print_lines=False)


def _report(args, results: list[tuple[dict, dict]], *, print_lines: bool) -> int:
    """Print the summary of ``results`` (and each run's line with ``print_lines``), write the
    ``--json`` file (every run with its report and verdicts), exit 1 on a false failure."""
    pairs = [(d, r, verdicts(d, r)) for d, r in results]
    if print_lines:
        for d, r, v in pairs:
            print(_line(d, r, v))
    summary = summarise(pairs)
    print(json.dumps(summary, indent=2))
    if args.json:
        runs = [{**r, "design": d, "verdicts": v} for d, r, v in pairs]
        with open(args.json, "w") as f:
            json.dump({"summary": summary, "runs": runs}, f, indent=1)
            f.write("\n")
    return 1 if summary["false_failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
