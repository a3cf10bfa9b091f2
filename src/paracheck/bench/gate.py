"""``paracheck gate --base REF [--head REF]``: a merge gate that catches real regressions and stays
quiet on noise.

How it measures. Each commit's tree is exported with ``git archive`` (the repository's working
tree, index and refs are not touched) and gets its own worker process
(``paracheck.bench._worker``) with ``PYTHONPATH=<tree>/src`` and its own persistent ``World``, so
each side runs its own code on the same machine at the same time of day. The workers take turns
job by job: round r measures every variant on base then head when r is even, head then base when
r is odd (ABBA), so a machine that slows down or speeds up during the run affects both sides alike.
asv is not used for this: ``asv continuous`` installs each commit into an environment (minutes per
commit, and impossible in an ``existing`` environment on a machine without network, where it would
measure the installed code for both commits), runs the commits one after the other rather than
job by job, and its per-benchmark process start would dominate our short jobs.

Note [The gate rule]
    * Exact quantities (Note [Exact quantities] in ``paracheck.bench._record``: collectives,
      payload bytes and bus bytes per step, optimizer-state bytes per rank, peak tensor bytes
      during init / forward-backward-sync / optimizer step, per variant; on CUDA also the
      allocator's peaks of Note [CUDA memory points]) are measured twice per side, in the first
      and the last round. They FAIL on any increase, however small. A side whose two readings
      differ is reported UNSTABLE (a warning: that quantity is then not exact and is not gated).
    * Timings, per variant: each job times ``steps`` steps (slowest rank per step) and keeps
      the fastest step, the reading least disturbed by other processes. What is timed is the
      step's CPU time on ``--device cpu`` (the rank processes' CPU time over all their threads:
      the work done; on the shared 2-core machine wall time moved 0.4x-1.8x between back-to-back
      identical jobs, CPU time 0.85x-1.12x) and its wall time on ``--device cuda`` (a dedicated
      machine; ``--timing`` overrides either). For each round the ratio head/base; a pass's
      estimate is the median of its ``rounds`` ratios. A timing whose
      estimate exceeds ``1 + threshold`` (default 0.10) is only *suspect*; it is measured again
      in a second interleaved pass of ``confirm_rounds`` rounds (default twice ``rounds``: only
      the suspects are re-measured, so a longer, steadier pass is cheap) by freshly started
      workers and ranks, and FAILS only if the second estimate exceeds ``1 + threshold`` too. Below ``1 - threshold`` twice is reported as faster, never a failure.
    * Exit 1 when something FAILS (a table says what), 0 otherwise, 2 when the gate cannot
      measure (an unknown ref, a commit without ``paracheck.bench``, a rank that raised).
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

__all__ = ["main", "GateRow", "timing_verdict", "exact_verdict", "EXACT_QUANTITIES"]

EXACT_QUANTITIES = (
    "collectives", "payload_bytes", "bus_bytes", "optimizer_state_bytes",
    "peak_init_bytes", "peak_before_step_bytes", "peak_step_bytes",
)
CUDA_QUANTITIES = ("cuda_init", "cuda_before_step", "cuda_after_step", "cuda_peak")


class GateError(RuntimeError):
    """The gate cannot measure: its message says which side and why."""


# -- the rule, as pure functions ----------------------------------------------------------------
def timing_verdict(first: list[float], second: list[float] | None, threshold: float) -> str:
    """``first``/``second``: per-round head/base ratios of the two passes (``second`` None when
    no second pass ran). Returns "ok", "faster" or "REGRESSION"; see Note [The gate rule]."""
    if not first:
        raise ValueError("first=[] must hold at least one round's ratio")
    if not threshold > 0:
        raise ValueError(f"threshold={threshold!r} must be > 0")
    m1 = statistics.median(first)
    if abs(m1 - 1) <= threshold:
        return "ok"
    if second is None:
        raise ValueError(f"a first-pass estimate of {m1:.3f} is outside 1 +- {threshold}: a second pass is required")
    m2 = statistics.median(second)
    if m1 > 1 + threshold and m2 > 1 + threshold:
        return "REGRESSION"
    if m1 < 1 - threshold and m2 < 1 - threshold:
        return "faster"
    return "ok"


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
    data = subprocess.run(["git", "-C", repo, "archive", "--format=tar", sha], capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        if hasattr(tarfile, "data_filter"):  # Python >= 3.10.12 / 3.11.4: refuse links out of dest
            tar.extractall(dest, filter="data")
        else:
            tar.extractall(dest)


class _Side:
    """One commit's worker process."""

    def __init__(self, label: str, ref: str, sha: str, tree: str):
        self.label, self.ref, self.sha, self.tree = label, ref, sha, tree
        env = dict(os.environ)
        src = os.path.join(tree, "src")
        env["PYTHONPATH"] = os.pathsep.join([src] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
        self.stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([sys.executable, "-m", "paracheck.bench._worker"], cwd=tree, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr, text=True)
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
            raise GateError(f"{self.label} ({self.ref}) worker gave no answer within {timeout:.0f} s")
        line = self.proc.stdout.readline()
        if not line:
            raise GateError(f"{self.label} ({self.ref}) worker exited: {self._tail()}")
        reply = json.loads(line)
        if not reply.get("ok"):
            raise GateError(f"{self.label} ({self.ref}) failed to measure:\n{reply.get('error', '')}")
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
    device: str = "cpu"
    world_size: int = 2
    variants: tuple[str, ...] | None = None
    rounds: int = 5
    confirm_rounds: int | None = None  # None: 2 * rounds
    threshold: float = 0.10
    steps: int = 8
    warmup: int = 2
    bucket_mb: float = 1.0
    model: str = "gate"
    timeout: float = 300.0
    timing: str = "cpu"  # "cpu" | "wall"
    verbose: bool = False
    json_path: str | None = None
    log: object = field(default=sys.stderr)


def _spec(variant: str, cfg: _Config) -> dict:
    from paracheck.bench.suites import model_for

    model = model_for(cfg.model)
    from dataclasses import asdict

    return {"variant": variant, "model": asdict(model), "world_size": cfg.world_size, "batch": 4,
            "dtype": "float32", "bucket_mb": cfg.bucket_mb, "warmup": cfg.warmup, "steps": cfg.steps,
            "tf32": True, "fused": True, "seed": 0}


def _say(cfg: _Config, text: str) -> None:
    print(text, file=cfg.log, flush=True)


def _timing_pass(cfg, sides, variants, exact: dict | None, readings: dict, rounds: int) -> dict[str, list[float]]:
    """One interleaved pass of ``rounds`` rounds; returns per-variant head/base ratios; appends
    each job's reading to ``readings[(variant, side)]`` and fills ``exact`` readings when given."""
    estimator = "cpu_min" if cfg.timing == "cpu" else "min"
    ratios: dict[str, list[float]] = {v: [] for v in variants}
    for r in range(rounds):
        order = sides if r % 2 == 0 else sides[::-1]
        for v in variants:
            value = {}
            for side in order:
                res = side.request({"cmd": "time", "spec": _spec(v, cfg)}, cfg.timeout)["result"]
                value[side.label] = res[estimator]
                readings.setdefault((v, side.label), []).append(res[estimator])
                if exact is not None and r in (0, rounds - 1):
                    for k, reading in res["cuda_memory"].items():
                        exact.setdefault((v, f"cuda_{k}", side.label), []).append(reading)
            ratios[v].append(value["head"] / value["base"])
        if exact is not None and r in (0, rounds - 1):
            for v in variants:
                for side in order:
                    res = side.request({"cmd": "account", "spec": _spec(v, cfg)}, cfg.timeout)["result"]
                    for q in EXACT_QUANTITIES:
                        exact.setdefault((v, q, side.label), []).append(res[q])
        _say(cfg, f"  round {r + 1}/{rounds}: " + ", ".join(f"{v} {ratios[v][-1]:.3f}" for v in variants))
    return ratios


def _start_sides(cfg: _Config, trees: list[tuple[str, str, str, str]]) -> list[_Side]:
    """One fresh worker (and World) per (label, ref, sha, tree), started in parallel."""
    sides = [_Side(*t) for t in trees]
    try:
        start = {"cmd": "start", "device": cfg.device, "world_size": cfg.world_size, "timeout": cfg.timeout}
        for side in sides:
            side.send(start)
        for side in sides:
            side.info = side.receive(cfg.timeout + 120)
            if not side.info["paracheck"].startswith(side.tree):
                raise GateError(f"{side.label} imported paracheck from {side.info['paracheck']}, not from its tree "
                                f"{side.tree}: an install shadows PYTHONPATH")
    except BaseException:
        for side in sides:
            side.close()
        raise
    return sides


def run_gate(cfg: _Config) -> tuple[list[GateRow], dict]:
    """Measure and decide; returns the rows and a JSON-able record. Raises GateError."""
    shas = {label: _git(cfg.repo, "rev-parse", "--verify", f"{ref}^{{commit}}")
            for label, ref in (("base", cfg.base), ("head", cfg.head))}
    tmp = tempfile.mkdtemp(prefix="paracheck-gate-")
    sides: list[_Side] = []
    try:
        trees = []
        for label, ref in (("base", cfg.base), ("head", cfg.head)):
            tree = os.path.join(tmp, label)
            os.makedirs(tree)
            _export(cfg.repo, shas[label], tree)
            if not os.path.exists(os.path.join(tree, "src", "paracheck", "bench", "_worker.py")):
                raise GateError(f"{label} {ref} ({shas[label][:10]}) has no src/paracheck/bench/_worker.py: "
                                f"the gate measures each commit with its own paracheck.bench, which it lacks")
            trees.append((label, ref, shas[label], tree))
        sides = _start_sides(cfg, trees)
        base_v, head_v = (set(s.info["variants"]) for s in sides)
        wanted = cfg.variants or tuple(v for v in sides[1].info["variants"] if v in base_v)
        variants = [v for v in wanted if v in base_v and v in head_v]
        rows = [GateRow(v, "variant", None, None, "gone" if v in base_v else "new", "present on one side only")
                for v in sorted((base_v ^ head_v) & set(cfg.variants or base_v | head_v))]
        if not variants:
            raise GateError(f"no variant to compare: base has {sorted(base_v)}, head has {sorted(head_v)}, "
                            f"asked for {list(cfg.variants) if cfg.variants else 'all'}")
        _say(cfg, f"gate: base {cfg.base} ({shas['base'][:10]}) vs head {cfg.head} ({shas['head'][:10]}), "
                  f"{cfg.device}, {cfg.world_size} ranks, variants {', '.join(variants)}")
        _say(cfg, "pass 1 (head/base step-time ratio per round):")
        exact: dict = {}
        readings: dict = {}
        first = _timing_pass(cfg, sides, variants, exact, readings, cfg.rounds)
        suspects = [v for v in variants if abs(statistics.median(first[v]) - 1) > cfg.threshold]
        second: dict[str, list[float]] = {}
        if suspects:
            # Fresh processes for the confirmation: a process's own luck (where the allocator
            # and the loader put things, which cores its ranks share) can bias one side by
            # several percent for its whole life; it must not be able to confirm itself.
            for side in sides:
                side.close()
            sides = []
            _say(cfg, f"pass 2, fresh workers, re-measuring the suspects {', '.join(suspects)}:")
            sides = _start_sides(cfg, trees)
            second = _timing_pass(cfg, sides, suspects, None, readings, cfg.confirm_rounds or 2 * cfg.rounds)
        quantity = f"step {cfg.timing} time (ms)"
        for v in variants:
            m1 = statistics.median(first[v])
            verdict = timing_verdict(first[v], second.get(v), cfg.threshold)
            detail = f"ratio: pass 1 x{m1:.3f}" + (f", pass 2 x{statistics.median(second[v]):.3f}" if v in second else "")
            rows.append(GateRow(v, quantity, 1e3 * statistics.median(readings[(v, "base")]),
                                1e3 * statistics.median(readings[(v, "head")]), verdict, detail))
        order = {v: i for i, v in enumerate(variants)}
        names = list(EXACT_QUANTITIES) + list(CUDA_QUANTITIES)
        for (v, key) in sorted({(v, k) for (v, k, _) in exact}, key=lambda vk: (order[vk[0]], names.index(vk[1]))):
            b, h = exact.get((v, key, "base"), []), exact.get((v, key, "head"), [])
            if not b or not h:
                continue
            rows.append(GateRow(v, key, b[0], h[0], exact_verdict(b, h),
                                "" if len(set(b + h)) == 1 else f"base {sorted(set(b))}, head {sorted(set(h))}"))
        record = {"base": {"ref": cfg.base, "sha": shas["base"]}, "head": {"ref": cfg.head, "sha": shas["head"]},
                  "device": cfg.device, "world_size": cfg.world_size, "threshold": cfg.threshold,
                  "rounds": cfg.rounds, "confirm_rounds": cfg.confirm_rounds or 2 * cfg.rounds, "timing": cfg.timing,
                  "first_pass": first, "second_pass": second,
                  "rows": [r.__dict__ for r in rows]}
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
    lines = ["| variant | quantity | base | head | verdict | detail |", "| --- | --- | ---: | ---: | --- | --- |"]
    for r in shown:
        lines.append(f"| {r.variant} | {r.quantity} | {_fmt(r.quantity, r.base)} | {_fmt(r.quantity, r.head)} "
                     f"| {r.verdict} | {r.detail} |")
    if hidden:
        lines.append(f"\n{hidden} exact quantities unchanged (--verbose shows them).")
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="paracheck gate", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Rule: exact quantities fail on any increase; step times fail when the median "
                                       "head/base ratio of interleaved rounds exceeds 1+threshold in two passes. "
                                       "Step time is CPU time on --device cpu, wall time on --device cuda.")
    p.add_argument("--base", required=True, help="the commit to compare against (any git revision)")
    p.add_argument("--head", default="HEAD", help="the commit under test (default HEAD)")
    p.add_argument("--repo", default=".", help="the git repository (default: the current directory)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="gloo on CPU or NCCL on GPUs")
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--variants", default=None, help="comma-separated variants (default: all on both sides)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds of the first pass (default 5)")
    p.add_argument("--confirm-rounds", type=int, default=None,
                   help="rounds of the second pass, which re-measures only the suspects (default 2 x rounds)")
    p.add_argument("--threshold", type=float, default=0.10, help="relative step-time threshold (default 0.10)")
    p.add_argument("--steps", type=int, default=8, help="timed steps per job (default 8)")
    p.add_argument("--timing", choices=("cpu", "wall"), default=None,
                   help="what a step's time is: CPU time (default on cpu) or wall time (default on cuda)")
    p.add_argument("--model", default=None, help="model of the suites (default: 'gate' on CPU, 'small' on CUDA)")
    p.add_argument("--bucket-mb", type=float, default=None, help="bucket size (default 1 on CPU, 25 on CUDA)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds one job may take")
    p.add_argument("--json", dest="json_path", default=None, help="also write the measurements as JSON here")
    p.add_argument("--verbose", action="store_true", help="show every exact quantity, not only changed ones")
    return p


def main(argv=None) -> int:
    """``paracheck gate``: 0 when nothing regressed, 1 on a regression (table on stdout), 2 when
    the gate cannot measure."""
    args = _parser().parse_args(argv)
    for name in ("world_size", "rounds", "steps", "confirm_rounds"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            print(f"paracheck gate: --{name.replace('_', '-')}={getattr(args, name)} must be >= 1", file=sys.stderr)
            return 2
    if not args.threshold > 0:
        print(f"paracheck gate: --threshold={args.threshold} must be > 0", file=sys.stderr)
        return 2
    cuda = args.device == "cuda"
    cfg = _Config(repo=os.path.abspath(args.repo), base=args.base, head=args.head, device=args.device,
                  world_size=args.world_size,
                  variants=tuple(v.strip() for v in args.variants.split(",") if v.strip()) if args.variants else None,
                  rounds=args.rounds, confirm_rounds=args.confirm_rounds, threshold=args.threshold, steps=args.steps,
                  bucket_mb=args.bucket_mb if args.bucket_mb is not None else (25.0 if cuda else 1.0),
                  model=args.model or ("small" if cuda else "gate"), timeout=args.timeout,
                  timing=args.timing or ("wall" if cuda else "cpu"),
                  verbose=args.verbose, json_path=args.json_path)
    t0 = time.monotonic()
    try:
        rows, record = run_gate(cfg)
    except GateError as exc:
        print(f"paracheck gate: cannot decide: {exc}", file=sys.stderr)
        return 2
    failed = [r for r in rows if r.failed]
    print(format_rows(rows, verbose=cfg.verbose))
    unstable = [r for r in rows if r.verdict == "UNSTABLE"]
    if unstable:
        print(f"\nwarning: {len(unstable)} quantities are not reproducible on one side and were not gated")
    print(f"\n{'REGRESSION' if failed else 'PASS'}: {len(failed)} of {len(rows)} quantities regressed "
          f"(threshold {cfg.threshold:.0%} on step times, any increase on exact quantities; "
          f"{time.monotonic() - t0:.0f} s)")
    if cfg.json_path:
        record["seconds"] = time.monotonic() - t0
        with open(cfg.json_path, "w") as f:
            json.dump(record, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
