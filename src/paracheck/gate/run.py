"""The gate's run: each commit's tree exported, one worker per side, the interleaved passes
(Note [The gate rule] in ``paracheck.gate``).

Note [One worker per tree]
    In paracheck's own repository each side runs the worker module *of its commit's tree*, and
    the module's path differs between commits: ``paracheck.gate._worker`` now,
    paracheck.bench._worker before the gate had its own package. ``_worker_module`` looks in
    each tree for the newest path first, so a head can still be compared with a base that
    predates the move (or the reverse). The worker protocol is the same in both. Measuring a
    user's TARGETs, the installed paracheck's worker runs on both sides.
"""

from __future__ import annotations

import io
import json
import os
import selectors
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field

from paracheck.accounting.schedule import SCHEDULE_QUANTITIES
from paracheck.errors import GateError
from paracheck.gate.rule import (
    CUDA_QUANTITIES,
    DEFAULT_ROUNDS,
    ERROR_RATE,
    EXACT_QUANTITIES,
    GateRow,
    PassTiming,
    RatioDecision,
    decide_ratio,
    exact_verdict,
    round_words,
    sequential_plan,
    timing_row,
)

__all__ = ["GateConfig", "GateError", "run_gate"]

# Newest first: Note [One worker per tree].
_WORKERS = ("paracheck.gate._worker", "paracheck.bench._worker")


# -- sides --------------------------------------------------------------------------------------
def _git(repo: str, *args: str) -> str:
    proc = subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise GateError(f"git {' '.join(args)} failed in {repo}: {proc.stderr.strip()}")
    return proc.stdout.strip()


def _export(repo: str, sha: str, dest: str) -> None:
    data = subprocess.run(
        ["git", "-C", repo, "archive", "--format=tar", sha], capture_output=True, check=True
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        if hasattr(tarfile, "data_filter"):  # Python >= 3.10.12 / 3.11.4: refuse links out of dest
            tar.extractall(dest, filter="data")
        else:
            tar.extractall(dest)


class _Side:
    """One commit's worker process, running the module ``worker``; ``paths`` go first on its
    ``PYTHONPATH``."""

    def __init__(
        self, label: str, ref: str, sha: str, tree: str, paths: tuple[str, ...], worker: str
    ):
        self.label, self.ref, self.sha, self.tree, self.paths = label, ref, sha, tree, paths
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            list(paths) + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        )
        self.stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", worker],
            cwd=tree,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
        )
        self._sel = selectors.DefaultSelector()
        self._sel.register(self.proc.stdout, selectors.EVENT_READ)
        self.info: dict = {}

    def send(self, msg: dict) -> None:
        try:
            self.proc.stdin.write(json.dumps(msg) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise GateError(f"{self.label} ({self.ref}) worker died: {self._tail()}") from None

    def receive(self, timeout: float) -> dict:
        if not self._sel.select(timeout):
            raise GateError(
                f"{self.label} ({self.ref}) worker gave no answer within {timeout:.0f} s"
            )
        line = self.proc.stdout.readline()
        if not line:
            raise GateError(f"{self.label} ({self.ref}) worker exited: {self._tail()}")
        reply = json.loads(line)
        if not reply.get("ok"):
            raise GateError(
                f"{self.label} ({self.ref}) failed to measure:\n{reply.get('error', '')}"
            )
        return reply

    def request(self, msg: dict, timeout: float) -> dict:
        self.send(msg)
        return self.receive(timeout)

    def _tail(self) -> str:
        self.stderr.seek(0)
        return self.stderr.read().decode(errors="replace")[-3000:]

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.send({"cmd": "stop"})
                self.proc.wait(timeout=30)
            except (GateError, subprocess.TimeoutExpired, OSError):
                self.proc.kill()
                self.proc.wait()
        self.stderr.close()


# -- the run ------------------------------------------------------------------------------------
@dataclass
class GateConfig:
    repo: str
    base: str
    head: str
    targets: tuple[str, ...] = ()  # import paths; () measures paracheck's own built-in variants
    device: str = "cpu"
    world_size: int = 2
    variants: tuple[str, ...] | None = None
    # The budget of Note [Sequential sign test]: the most rounds per variant, rounded up to
    # even, and the seconds the rounds may take (checked after every second round).
    rounds: int = DEFAULT_ROUNDS
    seconds: float = 600.0
    fresh_every: int = 10  # rounds per set of workers, rounded up to even
    error_rate: float = ERROR_RATE  # per gate and direction, shared by the variants
    threshold: float = 0.10
    steps: int = 8
    warmup: int = 2
    bucket_mb: float = 1.0
    model: str = "gate"
    timeout: float = 300.0
    timing: str = "wall"  # "wall" | "cpu"
    verbose: bool = False
    json_path: str | None = None
    log: object = field(default=sys.stderr)


def _even(n: int) -> int:
    return n + n % 2


def _spec(variant: str, cfg: GateConfig) -> dict:
    from paracheck.bench.suites import model_for

    model = model_for(cfg.model)
    from dataclasses import asdict

    return {
        "variant": variant,
        "model": asdict(model),
        "world_size": cfg.world_size,
        "batch": 4,
        "dtype": "float32",
        "bucket_mb": cfg.bucket_mb,
        "warmup": cfg.warmup,
        "steps": cfg.steps,
        "tf32": True,
        "fused": True,
        "seed": 0,
    }


def _say(cfg: GateConfig, text: str) -> None:
    print(text, file=cfg.log, flush=True)


def _read_exact(cfg, sides, variants, exact: dict) -> None:
    """One reading of every exact quantity per side and variant, appended to ``exact``."""
    for v in variants:
        for side in sides:
            res = side.request({"cmd": "account", "spec": _spec(v, cfg)}, cfg.timeout)["result"]
            for q in EXACT_QUANTITIES:
                # A commit older than a quantity does not report it: not compared.
                if q in res:
                    exact.setdefault((v, q, side.label), []).append(res[q])
            if res.get("schedule"):
                exact.setdefault((v, "schedule", side.label), []).append(res["schedule"])


def _round(cfg, sides, variants, r: int, got: dict, cuda: dict) -> None:
    """Round ``r``: each variant timed on both sides back to back, base first when ``r`` is
    even; appends the readings to ``got`` and sets the jobs' CUDA peaks in ``cuda``."""
    estimator = "cpu_min" if cfg.timing == "cpu" else "min"
    order = sides if r % 2 == 0 else sides[::-1]
    for v in variants:
        for side in order:
            res = side.request({"cmd": "time", "spec": _spec(v, cfg)}, cfg.timeout)["result"]
            got[v][side.label].append(res[estimator])
            for k, reading in res["cuda_memory"].items():
                cuda[(v, f"cuda_{k}", side.label)] = reading


def _rounds(cfg, trees, own, sides: list, variants, exact: dict):
    """The rounds of Note [The gate rule] until every variant is decided or the budget ends;
    ``sides`` (the running workers) is replaced in place when the workers are restarted.
    Returns each variant's readings, its last decision and the plan."""
    plan = sequential_plan(_even(cfg.rounds), cfg.error_rate / len(variants))
    coverage = 1 - 2 * plan.alpha
    fresh = _even(cfg.fresh_every)
    got: dict[str, dict[str, list[float]]] = {v: {"base": [], "head": []} for v in variants}
    decided: dict[str, RatioDecision] = {}
    undecided = list(variants)
    t0 = time.monotonic()
    r = 0
    first_cuda: dict = {}
    last_cuda: dict = {}
    while undecided and r < plan.max_rounds:
        if r and r % fresh == 0:
            # Fresh processes (Note [Sequential sign test]).
            for side in sides:
                side.close()
            sides[:] = []
            sides[:] = _start_sides(cfg, trees, own)
            _warm_up(cfg, sides, undecided)
        for _ in range(2):
            _round(cfg, sides, undecided, r, got, first_cuda if r == 0 else last_cuda)
            if r == 0:
                _read_exact(cfg, sides, variants, exact)
            r += 1
        says = []
        for v in list(undecided):
            g = got[v]
            d = decide_ratio([h / b for b, h in zip(g["base"], g["head"])], cfg.threshold, plan)
            decided[v] = d
            says.append(round_words(v, g["base"], g["head"], d, coverage))
            if d.decided:
                undecided.remove(v)
        _say(cfg, f"  rounds {r - 1}-{r}/{plan.max_rounds}: " + ", ".join(says))
        if undecided and time.monotonic() - t0 > cfg.seconds:
            _say(cfg, f"  --seconds={cfg.seconds:g} spent after {r} rounds")
            break
    # The exact quantities' second reading, by the workers that ran last; the CUDA peaks of
    # each variant's first and last timed jobs.
    _read_exact(cfg, sides, variants, exact)
    for key, reading in first_cuda.items():
        exact.setdefault(key, []).extend([reading, last_cuda.get(key, reading)])
    timings = {v: PassTiming(tuple(g["base"]), tuple(g["head"])) for v, g in got.items()}
    return timings, decided, plan


def _warm_up(cfg, sides, variants) -> None:
    """One untimed job per side and variant before a pass: a fresh worker's first job pays for
    imports, the first collectives' connections and the allocator's first requests (it ran
    ~30% slower than the next on the 2-core machine) and must not be one of the readings."""
    warm = {"warmup": 1, "steps": 1}
    for v in variants:
        for side in sides:
            side.request({"cmd": "time", "spec": {**_spec(v, cfg), **warm}}, cfg.timeout)


def _paths(tree: str, own: bool) -> tuple[str, ...]:
    """What goes first on a side's ``PYTHONPATH``: paracheck's ``src`` in its own repository; else
    the tree's ``src`` (a src layout) where it exists, then the tree itself."""
    src = os.path.join(tree, "src")
    if own:
        return (src,)
    return (src, tree) if os.path.isdir(src) else (tree,)


def _worker_module(tree: str, own: bool) -> str | None:
    """The worker module a side runs (Note [One worker per tree]): in paracheck's own repository
    the newest one ``tree`` has (None when it has none), else the installed paracheck's."""
    if not own:
        return _WORKERS[0]
    for module in _WORKERS:
        if os.path.exists(os.path.join(tree, "src", *module.split(".")) + ".py"):
            return module
    return None


def _under(path: str, tree: str) -> bool:
    return os.path.realpath(path).startswith(os.path.realpath(tree) + os.sep)


def _start_sides(cfg: GateConfig, trees: list[tuple], own: bool) -> list[_Side]:
    """One fresh worker (and World) per (label, ref, sha, tree), started in parallel."""
    sides = [_Side(*t, _paths(t[3], own), _worker_module(t[3], own)) for t in trees]
    try:
        start = {
            "cmd": "start",
            "device": cfg.device,
            "world_size": cfg.world_size,
            "timeout": cfg.timeout,
        }
        if cfg.targets:
            start["targets"] = list(cfg.targets)
        for side in sides:
            side.send(start)
        for side in sides:
            side.info = side.receive(cfg.timeout + 120)
            if own and not _under(side.info["paracheck"], side.tree):
                raise GateError(
                    f"{side.label} imported paracheck from {side.info['paracheck']}, not from its tree "
                    f"{side.tree}: an install shadows PYTHONPATH"
                )
            for target, where in side.info.get("modules", {}).items():
                # The target's package exists in the commit's tree but was imported from elsewhere:
                # an installed copy shadows the tree and both sides would measure the same code.
                top = target.split(":")[0].split(".")[0]
                in_tree = any(
                    os.path.exists(os.path.join(p, top))
                    or os.path.exists(os.path.join(p, top + ".py"))
                    for p in side.paths
                )
                if in_tree and not _under(where, side.tree):
                    raise GateError(
                        f"{side.label} ({side.ref}) imported target {target} from {where}, not from the "
                        f"commit's tree {side.tree}: an installed copy of {top!r} shadows it"
                    )
    except BaseException:
        for side in sides:
            side.close()
        raise
    return sides


def _trees(cfg: GateConfig, shas: dict, tmp: str) -> tuple[list[tuple], bool]:
    """Export both commits; returns the sides' (label, ref, sha, tree) and whether paracheck's
    own benchmarks measure them (no TARGETs, paracheck's repository)."""
    trees = []
    own = not cfg.targets
    for label, ref in (("base", cfg.base), ("head", cfg.head)):
        tree = os.path.join(tmp, label)
        os.makedirs(tree)
        _export(cfg.repo, shas[label], tree)
        if own and _worker_module(tree, own) is None:
            raise GateError(
                f"no TARGET given and {label} {ref} ({shas[label][:10]}) of {cfg.repo} is not "
                f"paracheck's own repository (no src/paracheck/gate/_worker.py): name the classes "
                f"to measure, e.g. paracheck gate --base {cfg.base} mypackage.ddp:MyDDP"
            )
        trees.append((label, ref, shas[label], tree))
    return trees, own


def _choose_variants(cfg: GateConfig, sides: list[_Side]) -> tuple[list[str], list[GateRow]]:
    base_info, head_info = sides[0].info, sides[1].info
    base_v, head_v = set(base_info["variants"]), set(head_info["variants"])
    if cfg.targets:
        broken = head_info.get("missing", {})
        if broken:
            raise GateError(
                f"head {cfg.head} cannot build "
                + "; ".join(f"TARGET={t!r}: {e}" for t, e in broken.items())
            )
        wanted = tuple(cfg.targets)
    else:
        wanted = cfg.variants or tuple(v for v in head_info["variants"] if v in base_v)
    variants = [v for v in wanted if v in base_v and v in head_v]
    if cfg.targets:
        # Every TARGET builds at head (checked above); one that base cannot build is new.
        missing = base_info.get("missing", {})
        rows = [
            GateRow(
                t,
                "variant",
                None,
                None,
                "new",
                f"base cannot build it: {missing[t].splitlines()[0][:200]}",
            )
            for t in wanted
            if t in missing
        ]
    else:
        rows = [
            GateRow(
                v,
                "variant",
                None,
                None,
                "gone" if v in base_v else "new",
                "present on one side only",
            )
            for v in sorted((base_v ^ head_v) & set(cfg.variants or base_v | head_v))
        ]
    if not variants:
        raise GateError(
            f"no variant to compare: base has {sorted(base_v)}, head has {sorted(head_v)}, "
            f"asked for {list(wanted)}"
            + "".join(
                f"; base cannot build {t}: {e.splitlines()[0][:200]}"
                for t, e in base_info.get("missing", {}).items()
            )
        )
    return variants, rows


def run_gate(cfg: GateConfig) -> tuple[list[GateRow], dict]:
    """Measure and decide; returns the rows and a JSON-able record. Raises GateError."""
    shas = {
        label: _git(cfg.repo, "rev-parse", "--verify", f"{ref}^{{commit}}")
        for label, ref in (("base", cfg.base), ("head", cfg.head))
    }
    tmp = tempfile.mkdtemp(prefix="paracheck-gate-")
    sides: list[_Side] = []
    try:
        trees, own = _trees(cfg, shas, tmp)
        sides = _start_sides(cfg, trees, own)
        variants, rows = _choose_variants(cfg, sides)
        _say(
            cfg,
            f"gate: base {cfg.base} ({shas['base'][:10]}) vs head {cfg.head} ({shas['head'][:10]}), "
            f"{cfg.device}, {cfg.world_size} ranks, {cfg.timing} time, variants {', '.join(variants)}",
        )
        _say(cfg, "rounds (head/base ratio of the fastest step, per round):")
        exact: dict = {}
        _warm_up(cfg, sides, variants)
        timings, decisions, plan = _rounds(cfg, trees, own, sides, variants, exact)
        coverage = 1 - 2 * plan.alpha
        quantity = f"step {cfg.timing} time (ms)"
        for v in variants:
            rows.append(timing_row(v, quantity, timings[v], decisions[v], coverage, cfg.verbose))
        order = {v: i for i, v in enumerate(variants)}
        names = list(EXACT_QUANTITIES) + list(CUDA_QUANTITIES)
        for v, key in sorted(
            {(v, k) for (v, k, _) in exact if k in names},
            key=lambda vk: (order[vk[0]], names.index(vk[1])),
        ):
            b, h = exact.get((v, key, "base"), []), exact.get((v, key, "head"), [])
            if not b or not h:
                continue
            verdict = exact_verdict(b, h)
            detail = "" if len(set(b + h)) == 1 else f"base {sorted(set(b))}, head {sorted(set(h))}"
            if verdict == "REGRESSION" and key in SCHEDULE_QUANTITIES:
                detail = _schedule_detail(v, key, exact) or detail
            rows.append(GateRow(v, key, b[0], h[0], verdict, detail))
        record = {
            "base": {"ref": cfg.base, "sha": shas["base"]},
            "head": {"ref": cfg.head, "sha": shas["head"]},
            "targets": list(cfg.targets),
            "paracheck": "installed" if not own else "each commit's own",
            "device": cfg.device,
            "world_size": cfg.world_size,
            "threshold": cfg.threshold,
            "max_rounds": plan.max_rounds,
            "seconds_budget": cfg.seconds,
            "error_rate": cfg.error_rate,
            "coverage": coverage,
            "timing": cfg.timing,
            "steps": cfg.steps,
            "model": cfg.model,
            "timings": {
                v: {
                    **t.to_dict(),
                    "verdict": decisions[v].verdict,
                    "interval": [decisions[v].low, decisions[v].high],
                }
                for v, t in timings.items()
            },
            "rows": [r.__dict__ for r in rows],
        }
        return rows, record
    finally:
        for side in sides:
            side.close()
        shutil.rmtree(tmp, ignore_errors=True)


def _schedule_detail(variant: str, quantity: str, exact: dict) -> str:
    """What moved in the schedule (Note [Communication schedule of a step]), in the lines that
    concern ``quantity``."""
    from paracheck.accounting.schedule import StepSchedule, schedule_changes

    b, h = exact.get((variant, "schedule", "base")), exact.get((variant, "schedule", "head"))
    if not b or not h:
        return ""
    lines = schedule_changes(variant, StepSchedule.from_dict(b[0]), StepSchedule.from_dict(h[0]))
    if quantity == "device_syncs":
        wanted: tuple[str, ...] = (" sync",)
    elif quantity == "waits_in_backward":
        wanted = (" wait",)
    else:  # what moves a launch, or stalls backward
        wanted = (" launched ", " wait")
    lines = [line for line in lines if any(w in line for w in wanted)]
    shown = "; ".join(line.removeprefix(f"{variant}: ") for line in lines[:3])
    return shown + (f"; and {len(lines) - 3} more" if len(lines) > 3 else "")
