"""The gate's operating point on this machine: how often ``paracheck gate`` FAILs, PASSes or says
INCONCLUSIVE on identical commits and on planted slowdowns, and how long it takes.

Builds, in a temporary directory, a user repository from ``examples/gate_user_package`` (the
DDP class ``mypkg.ddp:MyDDP``) with one commit per planted slowdown on top of the base:

* ``sleep-10``, ``sleep-25``, ``sleep-40``: after each gradient synchronisation, sleep for 10% /
  25% / 40% of the fastest step seen so far (forward to forward, the extra itself excluded; in a
  wrapper's first step, of that step up to its synchronisation): a blocking slowdown, like a
  wait on a lock or I/O; measured against the step as the machine's load stretches it;
* ``spin-10``, ``spin-25``, ``spin-40``: the same duration spent computing (a busy loop): a
  CPU-bound slowdown, like a needless copy.

On a loaded machine a sleep wakes late (its process waits for a core), so a planted sleep costs
more than its nominal share; the table's median ratios show the slowdown actually planted.

Then runs the gate (as a user runs it: TARGET ``mypkg.ddp:MyDDP``, installed paracheck) N times
base vs base and N times base vs each planted commit, and prints per comparison the FAILs (exit
1), PASSes (exit 0), INCONCLUSIVEs (exit 3), the runs that could not measure (exit 2), the
median of the runs' median ratios and their rounds and seconds. ``--load K`` runs
``scripts/load.py --per-core K`` for the whole measurement (K busy processes per CPU).

    python scripts/gate_operating.py [--n 10] [--kinds sleep-25,...] [--load 4] [--json out.json]
        [-- gate args]

Takes about N x (1 + kinds) gate runs of 0.5-2 min each on a 2-core machine. On a machine of
many cores, ``--jobs J`` runs J gates at once, each pinned to its own ``--cores-per-job`` CPUs
with its own copy of the repository (``--deadline`` bounds a run's time; ``--merge`` tabulates
several runs' ``--json`` files together).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "examples", "gate_user_package")
TARGET = "mypkg.ddp:MyDDP"
KINDS = ("sleep-10", "sleep-25", "sleep-40", "spin-10", "spin-25", "spin-40")
DEFAULT_KINDS = ("sleep-25", "spin-25")
GIT = [
    "git",
    "-c",
    "user.name=gate operating",
    "-c",
    "user.email=gate-operating@localhost",
    "-c",
    "commit.gpgsign=false",
]

_PATCH = """

# --- planted slowdown: {kind} ------------------------------------------------------------------
import time as _planted_time

_planted_forward = MyDDP.forward
_planted_finish = MyDDP.finish_gradient_synchronization


def _planted_slow_forward(self, *args, **kwargs):
    now = _planted_time.perf_counter()
    last = getattr(self, "_planted_start", None)
    if last is not None:
        # The fastest step so far without the extra itself: a load spike cannot inflate it.
        period = now - last - self._planted_extra
        self._planted_period = min(period, getattr(self, "_planted_period", period))
    self._planted_start = now
    return _planted_forward(self, *args, **kwargs)


def _planted_slow_finish(self):
    _planted_finish(self)
    # Until a whole step has been seen (the first step of each timed job), the part of this step
    # seen so far stands in for it: every step, the first too, is slowed.
    period = getattr(self, "_planted_period", None)
    if period is None:
        period = _planted_time.perf_counter() - self._planted_start
    extra = {fraction} * period
    start = _planted_time.perf_counter()
    if {spin}:
        while _planted_time.perf_counter() < start + extra:
            pass
    elif extra > 0:
        _planted_time.sleep(extra)
    self._planted_extra = _planted_time.perf_counter() - start


MyDDP._planted_extra = 0.0
MyDDP.forward = _planted_slow_forward
MyDDP.finish_gradient_synchronization = _planted_slow_finish
"""


def _git(repo, *args) -> str:
    return subprocess.run(
        GIT + list(args), cwd=repo, check=True, capture_output=True, text=True
    ).stdout.strip()


def build_repo(tmp: str, kinds) -> tuple[str, dict]:
    """The user repository with ``base`` and one commit per kind on top of it; {label: sha}."""
    repo = os.path.join(tmp, "repo")
    shutil.copytree(PACKAGE, repo)
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "base")
    shas = {"base": _git(repo, "rev-parse", "HEAD")}
    for kind in kinds:
        how, pct = kind.split("-")
        _git(repo, "checkout", "-q", "-B", kind, shas["base"])
        with open(os.path.join(repo, "mypkg", "ddp.py"), "a") as f:
            f.write(_PATCH.format(kind=kind, fraction=int(pct) / 100, spin=how == "spin"))
        _git(repo, "commit", "-q", "-am", f"planted: {kind}")
        shas[kind] = _git(repo, "rev-parse", "HEAD")
    _git(repo, "checkout", "-q", "--detach", shas["base"])
    return repo, shas


def _gate(repo: str, base: str, head: str, gate_args, log, cpus=None) -> dict:
    out = os.path.join(repo, "..", "gate.json")
    if os.path.exists(out):
        os.remove(out)
    t0 = time.monotonic()
    pin = None if cpus is None else (lambda: os.sched_setaffinity(0, cpus))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "paracheck.cli",
            "gate",
            "--repo",
            repo,
            "--base",
            base,
            "--head",
            head,
            "--json",
            out,
            *gate_args,
            TARGET,
        ],
        capture_output=True,
        text=True,
        preexec_fn=pin,
    )
    log.write(
        f"\n## gate --base {base[:10]} --head {head[:10]}: exit {proc.returncode}\n{proc.stdout}{proc.stderr}"
    )
    log.flush()
    rec = json.load(open(out)) if os.path.exists(out) else {}
    t = rec.get("timings", {}).get(TARGET, {})
    return {
        "exit": proc.returncode,
        "verdict": rec.get("verdict"),
        "seconds": time.monotonic() - t0,
        "rounds": len(t.get("ratios", [])),
        "ratios": t.get("ratios"),
        "median_ratio": t.get("median_ratio"),
        "min_ratio": t.get("min_ratio"),
        "interval": t.get("interval"),
        "error": rec.get("error"),
        "cpus": None if cpus is None else sorted(cpus),
    }


def _fmt(x) -> str:
    return "-" if x is None else f"{x:.3f}"


def _table(runs: dict[str, list[dict]]) -> str:
    lines = [
        "| comparison | runs | FAIL (exit 1) | PASS (exit 0) | INCONCLUSIVE (exit 3) | exit 2 "
        "| median of median ratios | median rounds | median seconds |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for label, rs in runs.items():
        if not rs:
            continue
        count = {code: sum(r["exit"] == code for r in rs) for code in (0, 1, 2, 3)}
        med = [r["median_ratio"] for r in rs if r.get("median_ratio") is not None]
        name = "identical" if label == "identical" else label + "% slower"
        lines.append(
            f"| {name} | {len(rs)} | {count[1]} | {count[0]} | {count[3]} | {count[2]} "
            f"| {_fmt(statistics.median(med) if med else None)} "
            f"| {statistics.median(r.get('rounds', 0) for r in rs):.0f} "
            f"| {statistics.median(r['seconds'] for r in rs):.0f} |"
        )
    return "\n".join(lines)


def _job(
    j, reps, labels, cpus, tmp, kinds, gate_args, log_path, deadline, lock, runs, save
) -> None:
    """Job ``j``: its own copy of the repository, its repetitions interleaved over ``labels``;
    ``save()`` (called under ``lock``) after every run, so a stopped measurement keeps its runs."""
    repo, shas = build_repo(os.path.join(tmp, f"job{j}"), kinds)
    with open(f"{log_path}.{j}" if cpus is not None else log_path, "w") as log:
        for i in reps:
            for label in labels:
                if time.monotonic() > deadline:
                    return
                head = shas["base" if label == "identical" else label]
                r = _gate(repo, shas["base"], head, gate_args, log, cpus)
                with lock:
                    runs[label].append(r)
                    save()
                    print(
                        f"  {i + 1} {label}: exit {r['exit']} {r['verdict']}, {r['rounds']} rounds,"
                        f" median ratio x{_fmt(r['median_ratio'])}, interval {r['interval']}"
                        f" ({r['seconds']:.0f} s{'' if cpus is None else f', cpus {sorted(cpus)}'})",
                        flush=True,
                    )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=10, help="gate runs per comparison (default 10)")
    p.add_argument(
        "--kinds",
        default=",".join(DEFAULT_KINDS),
        help=f"planted slowdowns among {','.join(KINDS)} (default {','.join(DEFAULT_KINDS)})",
    )
    p.add_argument(
        "--load",
        type=int,
        default=0,
        metavar="K",
        help="run scripts/load.py --per-core K meanwhile (default 0: no load)",
    )
    p.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="gate runs at once, each pinned to its own --cores-per-job CPUs and its own copy of "
        "the repository: a many-core machine measured as that many small machines (default 1: "
        "one run at a time, not pinned)",
    )
    p.add_argument(
        "--cores-per-job", type=int, default=2, help="CPUs per job with --jobs > 1 (default 2)"
    )
    p.add_argument(
        "--deadline",
        type=float,
        default=None,
        help="start no gate run after this many seconds; runs started still finish (default: none)",
    )
    p.add_argument(
        "--json",
        default=None,
        help="write every run's outcome here, rewritten after each run (default: none)",
    )
    p.add_argument(
        "--merge",
        nargs="+",
        default=None,
        metavar="JSON",
        help="print the table of the runs in these --json files together, and measure nothing",
    )
    p.add_argument(
        "--log",
        default=os.path.join(tempfile.gettempdir(), "paracheck-gate-operating.log"),
        help="write the gates' own output here (default: paracheck-gate-operating.log in the temp "
        "dir; with --jobs, one file per job, suffixed .J)",
    )
    p.add_argument("gate_args", nargs="*", help="extra arguments for paracheck gate (after --)")
    args = p.parse_args(argv)
    if args.merge:
        merged: dict[str, list[dict]] = {}
        for path in args.merge:
            with open(path) as f:
                for label, rs in json.load(f)["runs"].items():
                    merged.setdefault(label, []).extend(rs)
        print(_table(merged))
        return 0
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    bad = [k for k in kinds if k not in KINDS]
    if bad or args.n < 1:
        print(
            f"gate_operating: --kinds={args.kinds!r} must be among {','.join(KINDS)} and "
            f"--n={args.n} >= 1",
            file=sys.stderr,
        )
        return 2
    available = sorted(os.sched_getaffinity(0))
    if args.jobs < 1 or args.cores_per_job < 1 or args.jobs * args.cores_per_job > len(available):
        print(
            f"gate_operating: --jobs={args.jobs} x --cores-per-job={args.cores_per_job} must be "
            f">= 1 and fit in the {len(available)} CPUs available",
            file=sys.stderr,
        )
        return 2
    tmp = tempfile.mkdtemp(prefix="paracheck-gate-operating-")
    runs: dict[str, list[dict]] = {"identical": [], **{k: [] for k in kinds}}
    lock = threading.Lock()
    print(
        f"gate operating point: {args.n} runs each of {', '.join(runs)}, {args.jobs} at a time; "
        f"gate output in {args.log}",
        flush=True,
    )
    slices = [
        None
        if args.jobs == 1
        else set(available[j * args.cores_per_job : (j + 1) * args.cores_per_job])
        for j in range(args.jobs)
    ]
    gate_args = list(args.gate_args) + ["--no-history"]

    def save() -> None:
        if args.json:
            record = {
                "n": args.n,
                "jobs": args.jobs,
                "gate_args": args.gate_args,
                "load_per_core": args.load,
                "runs": runs,
            }
            with open(args.json + ".tmp", "w") as f:
                json.dump(record, f, indent=1)
            os.replace(args.json + ".tmp", args.json)

    load = None
    if args.load:
        load = subprocess.Popen(
            [sys.executable, os.path.join(ROOT, "scripts", "load.py"), "--per-core", str(args.load)]
            + ["--seconds", str(24 * 3600)]
        )
    try:
        deadline = time.monotonic() + (args.deadline if args.deadline is not None else float("inf"))
        # Interleaved: one run of every comparison per repetition, so a machine that gets busier
        # affects the false-alarm and detection rates alike. Job j takes repetitions j, j+J, ...,
        # and starts its rotation of the comparisons at a different one.
        threads = []
        for j in range(args.jobs):
            cpus = slices[j]
            labels = list(runs)
            labels = labels[j % len(labels) :] + labels[: j % len(labels)]
            reps = range(j, args.n, args.jobs)
            t = threading.Thread(
                target=_job,
                args=(j, reps, labels, cpus, tmp, kinds, gate_args, args.log, deadline, lock),
                kwargs={"runs": runs, "save": save},
            )
            t.start()
            threads.append(t)
        for t in threads:
            t.join()
    finally:
        if load is not None:
            load.terminate()
            load.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    print()
    print(_table(runs))
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
