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
import statistics
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass, field

from paracheck.errors import GateError
from paracheck.gate.rule import (
    CUDA_QUANTITIES,
    EXACT_QUANTITIES,
    GateRow,
    PassTiming,
    exact_verdict,
    noise_threshold,
    timing_verdict,
)

__all__ = ["GateConfig", "GateError", "calibrate_gate", "read_thresholds", "run_gate"]

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
    rounds: int = 6
    confirm_rounds: int | None = None  # None: 2 * rounds
    threshold: float = 0.10
    # Per-variant thresholds measured by calibrate_gate (Note [Thresholds from measured noise]);
    # a variant without one is judged at ``threshold``.
    thresholds: dict = field(default_factory=dict)
    steps: int = 8
    warmup: int = 2
    bucket_mb: float = 1.0
    model: str = "gate"
    timeout: float = 300.0
    timing: str = "wall"  # "wall" | "cpu"
    verbose: bool = False
    json_path: str | None = None
    log: object = field(default=sys.stderr)

    def threshold_for(self, variant: str) -> float:
        return self.thresholds.get(variant, self.threshold)

    def settings(self) -> dict:
        """What the noise of a pass depends on: a calibration holds only for the same."""
        return {
            "device": self.device,
            "world_size": self.world_size,
            "timing": self.timing,
            "rounds": _even(self.rounds),
            "steps": self.steps,
            "model": self.model,
            "bucket_mb": self.bucket_mb,
        }


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


def _timing_pass(cfg, sides, variants, exact: dict | None, rounds: int) -> dict[str, PassTiming]:
    """One interleaved pass of ``rounds`` rounds; returns each variant's readings and fills
    ``exact`` readings (first and last round) when given."""
    estimator = "cpu_min" if cfg.timing == "cpu" else "min"
    got: dict[str, dict[str, list[float]]] = {v: {"base": [], "head": []} for v in variants}
    for r in range(rounds):
        order = sides if r % 2 == 0 else sides[::-1]
        for v in variants:
            for side in order:
                res = side.request({"cmd": "time", "spec": _spec(v, cfg)}, cfg.timeout)["result"]
                got[v][side.label].append(res[estimator])
                if exact is not None and r in (0, rounds - 1):
                    for k, reading in res["cuda_memory"].items():
                        exact.setdefault((v, f"cuda_{k}", side.label), []).append(reading)
        if exact is not None and r in (0, rounds - 1):
            for v in variants:
                for side in order:
                    res = side.request({"cmd": "account", "spec": _spec(v, cfg)}, cfg.timeout)[
                        "result"
                    ]
                    for q in EXACT_QUANTITIES:
                        # A commit older than a quantity does not report it: not compared.
                        if q in res:
                            exact.setdefault((v, q, side.label), []).append(res[q])
        _say(
            cfg,
            f"  round {r + 1}/{rounds}: "
            + ", ".join(f"{v} {got[v]['head'][-1] / got[v]['base'][-1]:.3f}" for v in variants),
        )
    return {v: PassTiming(tuple(g["base"]), tuple(g["head"])) for v, g in got.items()}


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
        rounds, confirm = _even(cfg.rounds), _even(cfg.confirm_rounds or 2 * cfg.rounds)
        _say(
            cfg,
            f"gate: base {cfg.base} ({shas['base'][:10]}) vs head {cfg.head} ({shas['head'][:10]}), "
            f"{cfg.device}, {cfg.world_size} ranks, {cfg.timing} time, variants {', '.join(variants)}",
        )
        _say(cfg, "pass 1 (head/base ratio of the fastest step, per round):")
        exact: dict = {}
        _warm_up(cfg, sides, variants)
        first = _timing_pass(cfg, sides, variants, exact, rounds)
        suspects = [v for v in variants if first[v].says(cfg.threshold_for(v)) != "same"]
        second: dict[str, PassTiming] = {}
        if suspects:
            # Fresh processes for the confirmation (Note [The gate rule]).
            for side in sides:
                side.close()
            sides = []
            _say(cfg, f"pass 2, fresh workers, re-measuring the suspects {', '.join(suspects)}:")
            sides = _start_sides(cfg, trees, own)
            _warm_up(cfg, sides, suspects)
            second = _timing_pass(cfg, sides, suspects, None, confirm)
        quantity = f"step {cfg.timing} time (ms)"
        for v in variants:
            verdict = timing_verdict(first[v], second.get(v), cfg.threshold_for(v))
            detail = f"pass 1: median ratio x{first[v].median_ratio:.3f}, ratio of minima x{first[v].min_ratio:.3f}"
            if v in cfg.thresholds:
                detail = f"threshold {cfg.thresholds[v]:.1%} (measured noise); " + detail
            if v in second:
                detail += f"; pass 2: x{second[v].median_ratio:.3f}, x{second[v].min_ratio:.3f}"
            both = (
                first[v]
                if v not in second
                else PassTiming(first[v].base + second[v].base, first[v].head + second[v].head)
            )
            rows.append(
                GateRow(
                    v,
                    quantity,
                    1e3 * statistics.median(both.base),
                    1e3 * statistics.median(both.head),
                    verdict,
                    detail,
                )
            )
        order = {v: i for i, v in enumerate(variants)}
        names = list(EXACT_QUANTITIES) + list(CUDA_QUANTITIES)
        for v, key in sorted(
            {(v, k) for (v, k, _) in exact}, key=lambda vk: (order[vk[0]], names.index(vk[1]))
        ):
            b, h = exact.get((v, key, "base"), []), exact.get((v, key, "head"), [])
            if not b or not h:
                continue
            rows.append(
                GateRow(
                    v,
                    key,
                    b[0],
                    h[0],
                    exact_verdict(b, h),
                    "" if len(set(b + h)) == 1 else f"base {sorted(set(b))}, head {sorted(set(h))}",
                )
            )
        record = {
            "base": {"ref": cfg.base, "sha": shas["base"]},
            "head": {"ref": cfg.head, "sha": shas["head"]},
            "targets": list(cfg.targets),
            "paracheck": "installed" if not own else "each commit's own",
            "device": cfg.device,
            "world_size": cfg.world_size,
            "threshold": cfg.threshold,
            "thresholds": {v: cfg.threshold_for(v) for v in variants},
            "rounds": rounds,
            "confirm_rounds": confirm,
            "timing": cfg.timing,
            "steps": cfg.steps,
            "model": cfg.model,
            "first_pass": {v: t.to_dict() for v, t in first.items()},
            "second_pass": {v: t.to_dict() for v, t in second.items()},
            "rows": [r.__dict__ for r in rows],
        }
        return rows, record
    finally:
        for side in sides:
            side.close()
        shutil.rmtree(tmp, ignore_errors=True)


def calibrate_gate(
    cfg: GateConfig, n: int, floor: float = 0.02, alarm_rate: float = 1 / 30
) -> dict:
    """``n`` A/A gate runs of ``cfg.base`` against itself, each a first pass and a confirming
    pass, each pass with fresh workers as a gate run has; returns the thresholds record (Note
    [Thresholds from measured noise]). Raises GateError."""
    import platform

    if n < 1:
        raise ValueError(f"n={n} must be >= 1")
    sha = _git(cfg.repo, "rev-parse", "--verify", f"{cfg.base}^{{commit}}")
    tmp = tempfile.mkdtemp(prefix="paracheck-gate-")
    sides: list[_Side] = []
    ratios: dict[str, tuple[list[float], list[float]]] = {}
    rounds = (_even(cfg.rounds), _even(cfg.confirm_rounds or 2 * cfg.rounds))
    try:
        same = GateConfig(**{**cfg.__dict__, "head": cfg.base})
        trees, own = _trees(same, {"base": sha, "head": sha}, tmp)
        for i in range(n):
            for which, r in enumerate(rounds):
                sides = _start_sides(same, trees, own)
                variants, _ = _choose_variants(same, sides)
                _say(
                    cfg,
                    f"A/A run {i + 1}/{n}, pass {which + 1}: {cfg.base} ({sha[:10]}) against itself",
                )
                _warm_up(same, sides, variants)
                for v, t in _timing_pass(same, sides, variants, None, r).items():
                    ratios.setdefault(v, ([], []))[which].append(t.median_ratio)
                for side in sides:
                    side.close()
                sides = []
    finally:
        for side in sides:
            side.close()
        shutil.rmtree(tmp, ignore_errors=True)
    record = {
        "paracheck_gate_thresholds": 2,
        "commit": sha,
        "targets": list(cfg.targets),
        "settings": {**cfg.settings(), "confirm_rounds": rounds[1]},
        "machine": {"host": platform.node(), "cpus": os.cpu_count()},
        "runs": n,
        "floor": floor,
        "alarm_rate": alarm_rate,
        "variants": {},
    }
    for v, (first, second) in ratios.items():
        t, reached = noise_threshold(
            first, second, variants=len(ratios), alarm_rate=alarm_rate, floor=floor
        )
        record["variants"][v] = {
            "first_pass": first,
            "second_pass": second,
            "threshold": t,
            "reached": reached,
        }
    return record


def read_thresholds(path: str, cfg: GateConfig) -> dict[str, float]:
    """The per-variant thresholds of a calibration file, checked against ``cfg``'s settings.
    Raises GateError naming what does not match."""
    try:
        with open(path) as f:
            record = json.load(f)
    except (OSError, ValueError) as exc:
        raise GateError(f"--thresholds={path!r} cannot be read: {exc}") from None
    if not isinstance(record, dict) or record.get("paracheck_gate_thresholds") != 2:
        raise GateError(
            f"--thresholds={path!r} is not a file written by paracheck gate --calibrate"
        )
    stored = record.get("settings", {})
    now = {**cfg.settings(), "confirm_rounds": _even(cfg.confirm_rounds or 2 * cfg.rounds)}
    differ = [
        f"{k} {stored.get(k)!r} there, {now[k]!r} here" for k in now if stored.get(k) != now[k]
    ]
    if differ:
        raise GateError(
            f"--thresholds={path!r} was measured with other settings ({'; '.join(differ)}): "
            f"noise depends on them; calibrate again with these"
        )
    return {v: float(d["threshold"]) for v, d in record["variants"].items()}
