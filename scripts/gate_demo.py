"""Shows that ``paracheck gate`` catches real regressions and stays quiet on identical code.

Builds, in a temporary clone (the repository it is run from is only read), three commits:

* ``base``: the current working tree of this repository (tracked and untracked, not ignored);
* ``slow``: base plus a patch that makes the bucketed DDP's step 25% slower: after gradient
  synchronisation it computes (spins) for a quarter of the CPU time of the previous step (forward
  to forward), i.e. extra work of 25% of a step, the way a needless copy or a redundant pass is.
  The gate times wall time (Note [The gate rule]), which sees this CPU-bound slowdown and a
  blocking one (a sleep) alike; ``scripts/gate_operating.py`` measures both kinds;
* ``fatter``: base plus a patch that gives the bucketed DDP one extra full-size gradient buffer
  (a float32 tensor of every trainable element, allocated at construction and kept).

Then runs ``paracheck gate`` five times base vs base, once base vs slow and once base vs fatter,
and prints a table of expected and actual exit codes: base vs base must not FAIL (exit 0, PASS,
or 3, INCONCLUSIVE where the machine is too noisy to tell), the two others must (exit 1). Exit 0
when every run is as expected.
Falls back to ``flat`` when no bucketed DDP is registered.

    python scripts/gate_demo.py [--runs 5] [--variants ...] [-- extra gate arguments]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

_SLOW_PATCH = """

# --- gate demo: 25% slower -----------------------------------------------------------------
import functools as _gate_demo_functools
import time as _gate_demo_time

_gate_demo_forward = {cls}.forward
_gate_demo_finish = {cls}.finish_gradient_synchronization


def _gate_demo_slow_forward(self, *args, **kwargs):
    now = _gate_demo_time.process_time()
    # CPU time of the previous step without the extra work itself (else it would compound).
    self._gate_demo_period = now - getattr(self, "_gate_demo_start", now) - getattr(self, "_gate_demo_spun", 0.0)
    self._gate_demo_start = now
    return _gate_demo_forward(self, *args, **kwargs)


def _gate_demo_slow_finish(self):
    _gate_demo_finish(self)
    start = _gate_demo_time.process_time()
    period = self._gate_demo_period if self._gate_demo_period > 0 else start - self._gate_demo_start
    while _gate_demo_time.process_time() < start + 0.25 * period:
        pass
    self._gate_demo_spun = _gate_demo_time.process_time() - start


_gate_demo_functools.update_wrapper(_gate_demo_slow_forward, _gate_demo_forward)
_gate_demo_functools.update_wrapper(_gate_demo_slow_finish, _gate_demo_finish)
{cls}.forward = _gate_demo_slow_forward
{cls}.finish_gradient_synchronization = _gate_demo_slow_finish
"""

_FAT_PATCH = """

# --- gate demo: one extra full-size gradient buffer ------------------------------------------
import torch as _gate_demo_torch

import functools as _gate_demo_functools

_gate_demo_init = {cls}.__init__


@_gate_demo_functools.wraps(_gate_demo_init)  # keeps the signature: paracheck reads bucket_size_mb from it
def _gate_demo_fat_init(self, module, *args, **kwargs):
    _gate_demo_init(self, module, *args, **kwargs)
    trainable = [p for p in module.parameters() if p.requires_grad]
    self._gate_demo_grad_copy = _gate_demo_torch.zeros(sum(p.numel() for p in trainable), dtype=trainable[0].dtype,
                                                         device=trainable[0].device)


{cls}.__init__ = _gate_demo_fat_init
"""


def _run(cmd, cwd, **kw):
    return subprocess.run(cmd, cwd=cwd, check=True, capture_output=True, text=True, **kw).stdout


def _target(name: str):
    sys.path.insert(0, os.path.join(_ROOT, "src"))
    from paracheck.check.targets import BUILTIN_TARGETS

    if name in BUILTIN_TARGETS:
        module, cls = BUILTIN_TARGETS[name][0].split(":")
        return name, module, cls
    return None


_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def build_repo(tmp: str, victim: str) -> tuple[str, dict]:
    """A clone of this repository at HEAD with the working tree committed as ``base``, and the
    two regression branches. Returns the clone's path and {label: sha}."""
    repo = os.path.join(tmp, "repo")
    _run(["git", "clone", "-q", "--no-hardlinks", _ROOT, repo], cwd=tmp)
    files = _run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=_ROOT).split("\0")
    tracked = set(_run(["git", "ls-files", "-z"], cwd=repo).split("\0")) - {""}
    present = {f for f in files if f and os.path.isfile(os.path.join(_ROOT, f))}
    for f in tracked - present:
        os.remove(os.path.join(repo, f))
    for f in present:
        os.makedirs(os.path.dirname(os.path.join(repo, f)) or repo, exist_ok=True)
        shutil.copy2(os.path.join(_ROOT, f), os.path.join(repo, f))
    git = [
        "git",
        "-c",
        "user.name=gate demo",
        "-c",
        "user.email=gate-demo@localhost",
        "-c",
        "commit.gpgsign=false",
    ]
    _run(git + ["add", "-A"], cwd=repo)
    _run(git + ["commit", "-q", "--allow-empty", "-m", "base: the working tree"], cwd=repo)
    shas = {"base": _run(["git", "rev-parse", "HEAD"], cwd=repo).strip()}
    _, module, cls = victim
    path = os.path.join(repo, "src", *module.split(".")) + ".py"
    for label, patch in (("slow", _SLOW_PATCH), ("fatter", _FAT_PATCH)):
        _run(["git", "checkout", "-q", "-B", label, shas["base"]], cwd=repo)
        with open(path, "a") as f:
            f.write(patch.format(cls=cls))
        _run(git + ["commit", "-q", "-am", f"demo: {label} {cls}"], cwd=repo)
        shas[label] = _run(["git", "rev-parse", "HEAD"], cwd=repo).strip()
    _run(["git", "checkout", "-q", "--detach", shas["base"]], cwd=repo)
    return repo, shas


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=5, help="self-comparisons (default 5)")
    p.add_argument("--keep", action="store_true", help="keep the temporary clone")
    p.add_argument("gate_args", nargs="*", help="extra arguments for paracheck gate (after --)")
    args = p.parse_args(argv)
    victim = _target("bucketed") or _target("flat")
    tmp = tempfile.mkdtemp(prefix="paracheck-gate-demo-")
    print(
        f"gate demo: regressions planted in {victim[0]} ({victim[1]}:{victim[2]}); clone in {tmp}",
        flush=True,
    )
    rows = []
    try:
        repo, shas = build_repo(tmp, victim)
        runs = [(f"self {i + 1}", "base", "base", (0, 3)) for i in range(args.runs)]
        runs += [
            (f"{victim[0]} 25% slower", "base", "slow", (1,)),
            (f"{victim[0]} + full-size grad buffer", "base", "fatter", (1,)),
        ]
        for label, base, head, expected in runs:
            t0 = time.monotonic()
            cmd = [
                sys.executable,
                "-m",
                "paracheck.cli",
                "gate",
                "--repo",
                repo,
                "--base",
                shas[base],
                "--head",
                shas[head],
                "--no-history",
                *args.gate_args,
            ]
            print(f"\n## {label}: paracheck gate --base {base} --head {head}", flush=True)
            proc = subprocess.run(
                cmd, cwd=tmp, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
            )
            print(proc.stdout, flush=True)
            rows.append((label, expected, proc.returncode, time.monotonic() - t0))
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    ok = all(code in expected for _, expected, code, _ in rows)
    print("\n| gate run | expected exit | exit | as expected | seconds |")
    print("| --- | ---: | ---: | --- | ---: |")
    for label, expected, code, secs in rows:
        print(
            f"| {label} | {' or '.join(map(str, expected))} | {code} "
            f"| {'yes' if code in expected else 'NO'} | {secs:.0f} |"
        )
    print(f"\n{sum(c in e for _, e, c, _ in rows)} of {len(rows)} gate runs as expected")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
