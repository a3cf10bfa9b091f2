"""A history of measurements in a user's repository, without a hand-written asv configuration.

Note [History without asv configuration]
    ``paracheck gate`` (and ``paracheck bench --history``) record what they measured per commit
    under ``<repository>/.paracheck/history/measurements/<machine>/<sha>.json``, in paracheck's
    own small format: {"commit", "date", "machine", "benchmarks": {name: {"unit", "values":
    {variant: value}}}}. Recording needs neither asv nor a configuration; a commit measured
    twice keeps each variant's latest value. ``.paracheck/`` holds a ``.gitignore`` of ``*`` so
    the history never shows as untracked files.

    ``paracheck report`` turns the history into what asv publishes (``asv_tree``): a generated
    ``asv.conf.json`` beside it (the repository as ``repo``, as ``branches`` the fewest local
    branches that hold every recorded commit, ``_branches``), a ``benchmarks.json`` in
    ``results`` naming every benchmark with its variants as one parameter, and one asv result
    file per machine and commit. The pages are then asv's, built and vendored as for
    paracheck's own suite, made to open on the step time's graph with every branch drawn
    (Note [The history's first screen] in ``paracheck.report.history``). Every recorded
    quantity is lower is better, and its unit says so (asv lists every rise as a regression).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import time

__all__ = [
    "asv_tree",
    "default_history",
    "has_measurements",
    "measurements",
    "record",
    "record_bench",
    "record_gate",
    "summary",
]

_UNITS = {"step": "ms per step (lower is better)"}
_EXACT_UNIT = "count or bytes, exact (lower is better)"


def default_history(repo: str) -> str:
    """``<repo>/.paracheck/history``, with ``<repo>/.paracheck/.gitignore`` ignoring it all."""
    top = os.path.join(os.path.abspath(repo), ".paracheck")
    os.makedirs(top, exist_ok=True)
    ignore = os.path.join(top, ".gitignore")
    if not os.path.exists(ignore):
        with open(ignore, "w") as f:
            f.write("# paracheck's measurement history: local, never committed\n*\n")
    return os.path.join(top, "history")


def _machine() -> dict:
    return {
        "machine": platform.node() or "unknown",
        "arch": platform.machine(),
        "os": f"{platform.system()} {platform.release()}",
        "num_cpu": str(
            len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        ),
        "cpu": platform.processor() or platform.machine(),
        "ram": "",
    }


def _commit_date_ms(repo: str, sha: str) -> int:
    out = subprocess.run(
        ["git", "-C", repo, "show", "-s", "--format=%ct", sha], capture_output=True, text=True
    ).stdout.strip()
    return int(out) * 1000 if out.isdigit() else int(time.time() * 1000)


def record(history: str, repo: str, sha: str, benchmarks: dict, machine: dict | None = None) -> str:
    """Merge ``benchmarks`` ({name: {"unit": str, "values": {variant: value}}}) into ``sha``'s
    file of this machine (Note [History without asv configuration]); returns its path."""
    machine = machine or _machine()
    where = os.path.join(history, "measurements", machine["machine"])
    os.makedirs(where, exist_ok=True)
    path = os.path.join(where, f"{sha}.json")
    data: dict = {
        "commit": sha,
        "date": _commit_date_ms(repo, sha),
        "machine": machine,
        "benchmarks": {},
    }
    if os.path.exists(path):
        with open(path) as f:
            data["benchmarks"] = json.load(f).get("benchmarks", {})
    for name, b in benchmarks.items():
        entry = data["benchmarks"].setdefault(name, {"unit": b["unit"], "values": {}})
        entry["unit"] = b["unit"]
        entry["values"].update({k: float(v) for k, v in b["values"].items() if v is not None})
    data["recorded"] = int(time.time() * 1000)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1)
    os.replace(tmp, path)  # a gate stopped mid-write leaves the old file whole
    return path


def record_gate(history: str, repo: str, gate: dict) -> str:
    """Record a ``paracheck gate`` JSON record: per commit and variant the median step time of
    its jobs and every exact quantity. Returns ``history``."""
    timing = gate.get("timing", "wall")
    per_side: dict[str, dict] = {"base": {}, "head": {}}
    step = f"gate.step.{timing}_time"
    for variant, t in gate.get("timings", {}).items():
        for side in per_side:
            readings = t.get(f"{side}_s") or []
            if readings:
                per_side[side].setdefault(step, {"unit": _UNITS["step"], "values": {}})
                per_side[side][step]["values"][variant] = 1e3 * statistics.median(readings)
    for row in gate.get("rows", []):
        if row["quantity"].startswith("step ") or row["quantity"] == "variant":
            continue
        name = f"gate.exact.{row['quantity']}"
        for side in per_side:
            if row.get(side) is not None:
                per_side[side].setdefault(name, {"unit": _EXACT_UNIT, "values": {}})
                per_side[side][name]["values"][row["variant"]] = row[side]
    for side, benchmarks in per_side.items():
        if benchmarks:
            record(history, repo, gate[side]["sha"], benchmarks)
    return history


def record_bench(history: str, repo: str, sha: str, bench: dict, model_names: dict) -> str:
    """Record the step table of a ``paracheck bench --json`` record as measured at ``sha``: per
    model and variant the median step time and every exact quantity. ``model_names`` maps a
    model's spec (``json.dumps(..., sort_keys=True)``) to its name. Returns ``history``."""
    from paracheck.gate.rule import EXACT_QUANTITIES

    benchmarks: dict[str, dict] = {}
    for entry in bench.get("step", []):
        if "error" in entry:
            continue
        spec = entry["spec"]
        model = model_names.get(json.dumps(spec["model"], sort_keys=True), "model")
        name = f"bench.step.{model}.time"
        benchmarks.setdefault(name, {"unit": _UNITS["step"], "values": {}})
        benchmarks[name]["values"][spec["variant"]] = 1e3 * entry["median"]
        for q in EXACT_QUANTITIES:
            value = (entry.get("account") or {}).get(q)
            if value is not None:
                name = f"bench.exact.{model}.{q}"
                benchmarks.setdefault(name, {"unit": _EXACT_UNIT, "values": {}})
                benchmarks[name]["values"][spec["variant"]] = value
    if benchmarks:
        record(history, repo, sha, benchmarks)
    return history


def has_measurements(history: str) -> bool:
    root = os.path.join(history, "measurements")
    return os.path.isdir(root) and any(
        f.endswith(".json") for _, _, files in os.walk(root) for f in files
    )


def _branches(repo: str, commits: list[str]) -> tuple[list[str], list[str]]:
    """The fewest local branches (HEAD too, for a detached checkout) whose first-parent history
    holds every recorded commit, the one holding the most first, and the commits on none of them.

    asv places a commit on a branch when ``git rev-list --first-parent BRANCH`` lists it, and its
    pages show one branch at a time unless told otherwise: a branch chosen merely for holding
    the base (``main``) drew one point, while the branch of the head held both commits. Chosen
    greedily by how many of the commits not yet placed a branch holds, ties to the name."""
    heads = subprocess.run(
        ["git", "-C", repo, "for-each-ref", "--format=%(refname:short)", "refs/heads"],
        capture_output=True,
        text=True,
    ).stdout.split()
    wanted = set(commits)
    holds = {}
    for b in heads + ["HEAD"]:
        listed = subprocess.run(
            ["git", "-C", repo, "rev-list", "--first-parent", b, "--"],
            capture_output=True,
            text=True,
        ).stdout.split()
        holds[b] = wanted.intersection(listed)
    lost = [sha for sha in commits if not any(sha in h for h in holds.values())]
    left = wanted - set(lost)
    chosen: list[str] = []
    while left:
        # max() keeps the first of equals: real branches (sorted by name) before HEAD.
        best = max(holds, key=lambda b: len(holds[b] & left))
        chosen.append(best)
        left -= holds[best]
    return chosen, lost


def summary(history: str) -> dict:
    """What ``history`` holds: ``commits``, ``machines``, ``readings`` (one per benchmark,
    variant, commit and machine) and ``benchmarks``."""
    commits, machines, readings, names = set(), set(), 0, set()
    for d in measurements(history):
        commits.add(d["commit"])
        machines.add(d["machine"]["machine"])
        for name, b in d["benchmarks"].items():
            names.add(name)
            readings += len(b["values"])
    return {
        "commits": len(commits),
        "machines": sorted(machines),
        "readings": readings,
        "benchmarks": sorted(names),
    }


def measurements(history: str) -> list[dict]:
    """Every measurement file of ``history`` (Note [History without asv configuration])."""
    files: list[dict] = []
    root = os.path.join(history, "measurements")
    if not os.path.isdir(root):
        return files
    for machine in sorted(os.listdir(root)):
        for name in sorted(os.listdir(os.path.join(root, machine))):
            if name.endswith(".json"):
                with open(os.path.join(root, machine, name)) as f:
                    files.append(json.load(f))
    return files


def asv_tree(history: str, repo: str) -> tuple[str, list[str]]:
    """Write the asv configuration and results of Note [History without asv configuration]
    from ``history``'s measurements; returns the configuration's path and the recorded commits
    no branch holds (asv cannot place them; they are left out of the pages)."""
    files = measurements(history)
    results = os.path.join(history, "results")
    units: dict[str, str] = {}
    variants: dict[str, set] = {}
    for d in files:
        for name, b in d["benchmarks"].items():
            units[name] = b["unit"]
            variants.setdefault(name, set()).update(b["values"])
    benchmarks = {
        name: {
            "code": "recorded by paracheck (Note [History without asv configuration])",
            "name": name,
            "param_names": ["variant"],
            "params": [[repr(v) for v in sorted(variants[name])]],
            "timeout": 60,
            "type": "track",
            "unit": units[name],
            "version": "1",
        }
        for name in sorted(units)
    }
    os.makedirs(results, exist_ok=True)
    with open(os.path.join(results, "benchmarks.json"), "w") as f:
        json.dump({**benchmarks, "version": 2}, f, indent=1)
    for d in files:
        m = d["machine"]
        where = os.path.join(results, m["machine"])
        os.makedirs(where, exist_ok=True)
        with open(os.path.join(where, "machine.json"), "w") as f:
            json.dump({**m, "version": 1}, f, indent=1)
        rows = {}
        for name, b in d["benchmarks"].items():
            names = sorted(b["values"])
            rows[name] = [[b["values"][v] for v in names], [[repr(v) for v in names]], "1"]
        out = {
            "commit_hash": d["commit"],
            "env_name": "paracheck-history",
            "date": d.get("recorded", d["date"]),
            "params": {**m, "python": platform.python_version()},
            "python": platform.python_version(),
            "requirements": {},
            "env_vars": {},
            "result_columns": ["result", "params", "version"],
            "results": rows,
            "durations": {},
            "version": 2,
        }
        with open(os.path.join(where, f"{d['commit'][:8]}-paracheck-history.json"), "w") as f:
            json.dump(out, f)
    branches, lost = _branches(repo, [d["commit"] for d in files])
    conf = {
        "version": 1,
        "project": os.path.basename(os.path.abspath(repo)),
        "repo": os.path.abspath(repo),
        "dvcs": "git",
        "branches": branches or ["HEAD"],
        "environment_type": "existing",
        "results_dir": "results",
        "html_dir": "html",
    }
    path = os.path.join(history, "asv.conf.json")
    with open(path, "w") as f:
        json.dump(conf, f, indent=1)
    return path, lost
