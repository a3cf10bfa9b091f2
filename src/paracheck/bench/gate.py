"""``paracheck gate --base REF [--head REF] [TARGET ...]``: a merge gate that catches real
regressions and stays quiet on noise, in any git repository.

What it measures. With TARGETs (import paths ``package.module:Class`` of DDP wrappers, sharded
optimizers or ZeRO classes, as ``paracheck check`` takes them) each target trains the built-in LM
workload at both commits, measured by the *installed* paracheck: the repository (not paracheck's
own) is exported at each commit and that tree (``<tree>/src`` too when it exists) goes first on
``PYTHONPATH``, so ``import package`` finds the commit's code and ``import paracheck`` the
installed one. Without TARGETs, in paracheck's own repository, every built-in variant is measured
by each commit's own ``paracheck.bench`` (``PYTHONPATH=<tree>/src``).

How it measures. Each commit's tree is exported with ``git archive`` (the repository's working
tree, index and refs are not touched) and gets its own worker process
(``paracheck.bench._worker``) and its own persistent ``World``, so each side runs its own code on
the same machine at the same time of day. The workers take turns job by job: round r measures
every variant on base then head when r is even, head then base when r is odd (ABBA), so a machine
that slows down or speeds up during the run affects both sides alike. asv is not used for this:
``asv continuous`` installs each commit into an environment (minutes per commit), runs the commits
one after the other rather than job by job, and its per-benchmark process start would dominate
our short jobs.

Note [The gate rule]
    * Exact quantities (Note [Exact quantities] in ``paracheck.bench._record``: collectives,
      payload bytes and bus bytes per step, optimizer-state bytes per rank, peak tensor bytes
      during init / forward-backward-sync / optimizer step, per variant; on CUDA also the
      allocator's peaks of Note [CUDA memory points]) are measured twice per side, in the first
      and the last round. They FAIL on any increase, however small. A side whose two readings
      differ is reported UNSTABLE (a warning: that quantity is then not exact and is not gated).
    * Timings, per variant. A job times ``steps`` steps (per step the slowest rank) and keeps
      its fastest step: load from other processes only ever adds time, so the fastest step is
      the reading least disturbed by it. What is timed is wall time by default (``--timing
      wall``): a slowdown that blocks (a sleep, a wait on a lock or a collective, I/O) shows in
      wall time only, a CPU-bound one in both. ``--timing cpu`` times the rank processes' CPU
      time instead (blind to blocking slowdowns; steadier where the machine is shared).
    * A pass starts with one untimed job per side and variant (a fresh worker's first job pays
      for imports and first connections), then R interleaved rounds give per side R job readings and per round one ratio
      head/base of the two jobs run back to back. Two statistics, each blind to a different
      kind of noise: the *median of the paired ratios* (a load that drifts during the run
      affects both jobs of a round alike; one disturbed round cannot move a median) and the
      *ratio of the minima* (the fastest job of each side over the whole pass: a side that
      was unlucky in most rounds still gets its quiet moment). A pass says "slower" only when
      both exceed ``1 + threshold`` (default 0.10), "faster" only when both are below
      ``1 - threshold``.
    * Confidence: a pass that says "slower" or "faster" only makes the variant a *suspect*.
      Suspects are measured again in a second pass of ``confirm_rounds`` rounds (default twice
      ``rounds``) by freshly started workers and ranks (a process's own luck, where the loader
      and allocator put things and which cores its ranks share, can bias one side for its whole
      life; it must not be able to confirm itself). A timing FAILS only when both passes say
      "slower"; "faster" twice is reported, never a failure. R is rounded up to an even number
      so that each side runs first in exactly half of the rounds.
    * Exit 1 when something FAILS (a table says what), 0 otherwise, 2 when the gate cannot
      measure (an unknown ref, a target that does not import at head, a rank that raised).
      ``--json PATH`` writes the verdict and every reading, also when the gate cannot measure.
    * How often this rule raises a false alarm on identical commits and how often it catches a
      planted 10% / 25% slowdown on a given machine: ``python scripts/gate_operating.py``.
"""

from __future__ import annotations

import argparse
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
import time
from dataclasses import dataclass, field

__all__ = ["main", "GateRow", "PassTiming", "timing_verdict", "exact_verdict", "EXACT_QUANTITIES"]

EXACT_QUANTITIES = (
    "collectives",
    "payload_bytes",
    "bus_bytes",
    "optimizer_state_bytes",
    "peak_init_bytes",
    "peak_before_step_bytes",
    "peak_step_bytes",
)
CUDA_QUANTITIES = ("cuda_init", "cuda_before_step", "cuda_after_step", "cuda_peak")


class GateError(RuntimeError):
    """The gate cannot measure: its message says which side and why."""


# -- the rule, as pure functions ----------------------------------------------------------------
@dataclass(frozen=True)
class PassTiming:
    """One pass's job readings of one variant (seconds, each a job's fastest step), paired by
    round: ``base[r]`` and ``head[r]`` ran back to back in round r."""

    base: tuple[float, ...]
    head: tuple[float, ...]

    def __post_init__(self):
        if not self.base or len(self.base) != len(self.head):
            raise ValueError(
                f"base ({len(self.base)} readings) and head ({len(self.head)}) must pair up, "
                f"at least one round"
            )
        if min(self.base) <= 0 or min(self.head) <= 0:
            raise ValueError(f"readings must be > 0: base {self.base}, head {self.head}")

    @property
    def ratios(self) -> list[float]:
        return [h / b for b, h in zip(self.base, self.head)]

    @property
    def median_ratio(self) -> float:
        """Median of the paired head/base ratios."""
        return statistics.median(self.ratios)

    @property
    def min_ratio(self) -> float:
        """Head's fastest job over base's fastest job."""
        return min(self.head) / min(self.base)

    def says(self, threshold: float) -> str:
        """ "slower", "faster" or "same": see Note [The gate rule]."""
        m, r = self.median_ratio, self.min_ratio
        if m > 1 + threshold and r > 1 + threshold:
            return "slower"
        if m < 1 - threshold and r < 1 - threshold:
            return "faster"
        return "same"

    def to_dict(self) -> dict:
        return {
            "base_s": list(self.base),
            "head_s": list(self.head),
            "ratios": self.ratios,
            "median_ratio": self.median_ratio,
            "min_ratio": self.min_ratio,
        }


def timing_verdict(first: PassTiming, second: PassTiming | None, threshold: float) -> str:
    """``first``/``second``: the two passes' readings (``second`` None when no second pass ran).
    Returns "ok", "faster" or "REGRESSION"; see Note [The gate rule]."""
    if not threshold > 0:
        raise ValueError(f"threshold={threshold!r} must be > 0")
    said = first.says(threshold)
    if said == "same":
        return "ok"
    if second is None:
        raise ValueError(
            f"the first pass says {said} (median ratio {first.median_ratio:.3f}, ratio of minima "
            f"{first.min_ratio:.3f}, threshold {threshold}): a second pass is required"
        )
    if second.says(threshold) != said:
        return "ok"
    return "REGRESSION" if said == "slower" else "faster"


def exact_verdict(base: list, head: list) -> str:
    """``base``/``head``: the readings of one exact quantity on each side. "ok", "better",
    "REGRESSION" (head above base by any amount) or "UNSTABLE" (a side disagrees with itself)."""
    if not base or not head:
        raise ValueError("base and head must each hold at least one reading")
    if len(set(base)) > 1 or len(set(head)) > 1:
        return "UNSTABLE"
    if head[0] > base[0]:
        return "REGRESSION"
    return "better" if head[0] < base[0] else "ok"


@dataclass
class GateRow:
    variant: str
    quantity: str
    base: float | None
    head: float | None
    verdict: str
    detail: str = ""

    @property
    def failed(self) -> bool:
        return self.verdict == "REGRESSION"


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
    """One commit's worker process; ``paths`` go first on its ``PYTHONPATH``."""

    def __init__(self, label: str, ref: str, sha: str, tree: str, paths: tuple[str, ...]):
        self.label, self.ref, self.sha, self.tree, self.paths = label, ref, sha, tree, paths
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            list(paths) + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        )
        self.stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "paracheck.bench._worker"],
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
class _Config:
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


def _spec(variant: str, cfg: _Config) -> dict:
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


def _say(cfg: _Config, text: str) -> None:
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


def _under(path: str, tree: str) -> bool:
    return os.path.realpath(path).startswith(os.path.realpath(tree) + os.sep)


def _start_sides(cfg: _Config, trees: list[tuple], own: bool) -> list[_Side]:
    """One fresh worker (and World) per (label, ref, sha, tree), started in parallel."""
    sides = [_Side(*t, _paths(t[3], own)) for t in trees]
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


def _trees(cfg: _Config, shas: dict, tmp: str) -> tuple[list[tuple], bool]:
    """Export both commits; returns the sides' (label, ref, sha, tree) and whether paracheck's
    own benchmarks measure them (no TARGETs, paracheck's repository)."""
    trees = []
    own = not cfg.targets
    for label, ref in (("base", cfg.base), ("head", cfg.head)):
        tree = os.path.join(tmp, label)
        os.makedirs(tree)
        _export(cfg.repo, shas[label], tree)
        if own and not os.path.exists(
            os.path.join(tree, "src", "paracheck", "bench", "_worker.py")
        ):
            raise GateError(
                f"no TARGET given and {label} {ref} ({shas[label][:10]}) of {cfg.repo} is not "
                f"paracheck's own repository (no src/paracheck/bench/_worker.py): name the classes "
                f"to measure, e.g. paracheck gate --base {cfg.base} mypackage.ddp:MyDDP"
            )
        trees.append((label, ref, shas[label], tree))
    return trees, own


def _choose_variants(cfg: _Config, sides: list[_Side]) -> tuple[list[str], list[GateRow]]:
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


def run_gate(cfg: _Config) -> tuple[list[GateRow], dict]:
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
        suspects = [v for v in variants if first[v].says(cfg.threshold) != "same"]
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
            verdict = timing_verdict(first[v], second.get(v), cfg.threshold)
            detail = f"pass 1: median ratio x{first[v].median_ratio:.3f}, ratio of minima x{first[v].min_ratio:.3f}"
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


def _fmt(q: str, v) -> str:
    if v is None:
        return "-"
    if q.startswith("step "):
        return f"{v:.2f}"
    if isinstance(v, float) and not v.is_integer():
        return f"{v:,.1f}"
    return f"{int(v):,}"


def format_rows(rows: list[GateRow], *, verbose: bool = False) -> str:
    """A markdown table: every timing, every exact quantity that changed or is unstable (all
    exact quantities with ``verbose``)."""
    shown = [r for r in rows if verbose or r.quantity.startswith("step ") or r.verdict != "ok"]
    hidden = len(rows) - len(shown)
    lines = [
        "| variant | quantity | base | head | verdict | detail |",
        "| --- | --- | ---: | ---: | --- | --- |",
    ]
    for r in shown:
        lines.append(
            f"| {r.variant} | {r.quantity} | {_fmt(r.quantity, r.base)} | {_fmt(r.quantity, r.head)} "
            f"| {r.verdict} | {r.detail} |"
        )
    if hidden:
        lines.append(f"\n{hidden} exact quantities unchanged (--verbose shows them).")
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="paracheck gate",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Rule: exact quantities fail on any increase; a step time fails when, in two "
        "passes of interleaved rounds (the second with fresh processes), both the "
        "median of the paired head/base ratios and the ratio of the fastest jobs "
        "exceed 1+threshold. Exit 1 on a regression, 0 otherwise, 2 when the gate "
        "cannot measure.",
    )
    p.add_argument(
        "targets",
        nargs="*",
        metavar="TARGET",
        help="import paths package.module:Class of the repository's DDP wrappers, sharded optimizers or "
        "ZeRO classes, measured at both commits with the installed paracheck (default: none, which "
        "in paracheck's own repository measures its built-in variants with each commit's paracheck)",
    )
    p.add_argument(
        "--base", required=True, help="the commit to compare against (any git revision; required)"
    )
    p.add_argument("--head", default="HEAD", help="the commit under test (default HEAD)")
    p.add_argument(
        "--repo", default=".", help="the git repository (default: the current directory)"
    )
    p.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="gloo on CPU or NCCL on GPUs (default cpu)",
    )
    p.add_argument("--world-size", type=int, default=2, help="ranks per job (default 2)")
    p.add_argument(
        "--variants",
        default=None,
        help="comma-separated built-in variants, without TARGETs (default: all on both sides)",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=6,
        help="interleaved rounds of the first pass, rounded up to even (default 6)",
    )
    p.add_argument(
        "--confirm-rounds",
        type=int,
        default=None,
        help="rounds of the second pass, which re-measures only the suspects (default 2 x rounds)",
    )
    p.add_argument(
        "--threshold", type=float, default=0.10, help="relative step-time threshold (default 0.10)"
    )
    p.add_argument("--steps", type=int, default=8, help="timed steps per job (default 8)")
    p.add_argument(
        "--timing",
        choices=("wall", "cpu"),
        default="wall",
        help="what a step's time is: wall time, which sees blocking and CPU-bound slowdowns (default), "
        "or the ranks' CPU time, which sees CPU-bound ones only",
    )
    p.add_argument(
        "--model",
        default=None,
        help="LM workload of the suites (default: 'gate' on cpu, 'small' on cuda)",
    )
    p.add_argument(
        "--bucket-mb",
        type=float,
        default=None,
        help="bucket size in MB (default 1 on cpu, 25 on cuda)",
    )
    p.add_argument(
        "--timeout", type=float, default=300.0, help="seconds one job may take (default 300)"
    )
    p.add_argument(
        "--json",
        dest="json_path",
        default=None,
        help="also write the verdict and every reading as JSON to this path (default: none)",
    )
    p.add_argument(
        "--verbose",
        action="store_true",
        help="show every exact quantity, not only changed ones (default off)",
    )
    return p


def _write_json(path: str | None, record: dict) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(record, f, indent=1)


def main(argv=None) -> int:
    """``paracheck gate``: 0 when nothing regressed, 1 on a regression (table on stdout), 2 when
    the gate cannot measure."""
    args = _parser().parse_intermixed_args(argv)
    for name in ("world_size", "rounds", "steps", "confirm_rounds"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            print(
                f"paracheck gate: --{name.replace('_', '-')}={getattr(args, name)} must be >= 1",
                file=sys.stderr,
            )
            return 2
    if not args.threshold > 0:
        print(f"paracheck gate: --threshold={args.threshold} must be > 0", file=sys.stderr)
        return 2
    for t in args.targets:
        mod, _, attr = t.partition(":")
        if not mod or not attr:
            print(
                f"paracheck gate: TARGET={t!r} must be an import path package.module:Class",
                file=sys.stderr,
            )
            return 2
    if args.targets and args.variants:
        print(
            f"paracheck gate: --variants={args.variants!r} names built-in variants; with TARGETs "
            f"({' '.join(args.targets)}) the TARGETs are what is measured",
            file=sys.stderr,
        )
        return 2
    cuda = args.device == "cuda"
    cfg = _Config(
        repo=os.path.abspath(args.repo),
        base=args.base,
        head=args.head,
        targets=tuple(args.targets),
        device=args.device,
        world_size=args.world_size,
        variants=tuple(v.strip() for v in args.variants.split(",") if v.strip())
        if args.variants
        else None,
        rounds=args.rounds,
        confirm_rounds=args.confirm_rounds,
        threshold=args.threshold,
        steps=args.steps,
        bucket_mb=args.bucket_mb if args.bucket_mb is not None else (25.0 if cuda else 1.0),
        model=args.model or ("small" if cuda else "gate"),
        timeout=args.timeout,
        timing=args.timing,
        verbose=args.verbose,
        json_path=args.json_path,
    )
    t0 = time.monotonic()
    try:
        rows, record = run_gate(cfg)
    except GateError as exc:
        print(f"paracheck gate: cannot decide: {exc}", file=sys.stderr)
        _write_json(
            cfg.json_path,
            {
                "verdict": "ERROR",
                "exit_code": 2,
                "error": str(exc),
                "base": {"ref": cfg.base},
                "head": {"ref": cfg.head},
                "targets": list(cfg.targets),
                "seconds": time.monotonic() - t0,
            },
        )
        return 2
    failed = [r for r in rows if r.failed]
    print(format_rows(rows, verbose=cfg.verbose))
    unstable = [r for r in rows if r.verdict == "UNSTABLE"]
    if unstable:
        print(
            f"\nwarning: {len(unstable)} quantities are not reproducible on one side and were not gated"
        )
    print(
        f"\n{'REGRESSION' if failed else 'PASS'}: {len(failed)} of {len(rows)} quantities regressed "
        f"(threshold {cfg.threshold:.0%} on step {cfg.timing} times, any increase on exact quantities; "
        f"{time.monotonic() - t0:.0f} s)"
    )
    record.update(
        verdict="REGRESSION" if failed else "PASS",
        exit_code=1 if failed else 0,
        regressions=[r.__dict__ for r in failed],
        seconds=time.monotonic() - t0,
    )
    _write_json(cfg.json_path, record)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
