"""Hash the derandomised cases each kind's strategy draws, and the oracle's trajectories on them,
so that two source trees can be compared for unchanged behaviour.

    PYTHONPATH=<tree>/src .venv/bin/python scripts/behaviour_hash.py [-n 20] [--verbose]
        [--kinds ddp,sharded,...] [--targets naive,zero1,...] [--dump DIR]

``paracheck`` is imported from whatever tree is first on the path (the first line printed names
the file), so one copy of this script measures any tree with the same virtualenv.

What is drawn
    For every kind of ``paracheck.check.kinds.KINDS`` (or those ``--kinds`` names), the kind's
    strategy is called as a check's search calls it when it draws the kind's own cases
    (``_Search.drawn`` in ``paracheck.check.shared_search``): ``strategy(world_sizes=(1, 2, 3, 4),
    precision=P)`` with P the kind's default precision (its ``Kind.dtype``: fp64, a loop's fp32)
    and no target options. Below the kinds, the public strategy functions the kinds are built
    from are drawn the same way under their own names (``cases``, ``loop_cases``,
    ``sharding_cases``, ``fsdp_cases``), so that a kind whose strategy was wrapped by a newer one
    can still be compared on the draws underneath it.

    ``--targets`` adds a row per built-in target with the cases a check's search of it draws:
    ``_Search(target, world, CheckSettings(world_sizes=(1, 2, 3, 4)), ...)`` of
    ``paracheck.check.shared_search`` is built as ``check_target`` builds it (with a stand-in
    World, which building it does not use), so the tree's own path from settings to strategy is
    followed (the world sizes, the precision, the features turned off and mapped out of every
    case), and its ``strategy`` is drawn (``search:<target>``). A second row per target
    (``checked:<target>``) holds the first ``--checked`` cases (default 40) of the check's own
    first search over the whole contract: its ``_Checker.search``, with its own test function,
    its digest of the target and the search, and its Hypothesis settings, each case recorded and
    passed instead of run. This is the derandomised sequence a check at seed 0 runs.

    The first N cases come from one Hypothesis test with ``derandomize=True``, no database and the
    generate phase only. Hypothesis derives a derandomised seed from the test function's source,
    so the recording test is defined once, in ``_draw`` below: the same text for every tree.

What is hashed
    cases: SHA-256 over each case's ``Case.to_json()``, one per line, in draw order.
    trajectories: SHA-256 over ``paracheck.oracle.train(case)`` for each case in order: the
    initial parameters and buffers, then per step the losses (as float.hex), the synchronised
    gradients, the parameters after the step, the optimizer state (by parameter index, then by
    name, sorted), the float32 masters where kept, and whether the step was skipped. Every tensor
    is hashed as its dtype, its shape and its bytes; a missing one as ``None``. A case the oracle
    raises on is hashed as the exception's type and text. Torch runs on one thread.

Reading a difference
    Hypothesis's derandomised sequence depends on the strategy's structure, not only on the values
    it draws: after its first ten valid cases it mutates earlier ones by copying one span of
    choices over another span of the same label, and a ``.map`` that is not the identity adds a
    span. So wrapping a strategy in a map that changes no case (removing a feature none of its
    cases has) still changes the cases drawn after its first mutation (from the 12th to the 18th
    case in the searches of paracheck's built-ins at 20 examples). Two trees whose strategy
    rows agree and whose ``search:`` rows differ turn off other features, or wrap the strategy
    otherwise.

Output: a line naming the imported ``paracheck``, then one line per kind and per strategy:
name (``search:<target>`` and ``checked:<target>`` for a target's rows), N, cases hash, trajectories hash (the first 16
hex digits of each), and the strategy drawn. ``--verbose`` adds, per case, its index, world
size, case hash and trajectory hash; ``--dump DIR`` writes each case's JSON to
``DIR/<name>/<index>.json`` for a diff.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import os
import sys
import time

import torch
from hypothesis import HealthCheck, Phase, given, settings

WORLD_SIZES = (1, 2, 3, 4)
PRECISIONS = {"float64": "fp64", "float32": "fp32", "bfloat16": "bf16"}
# The strategy functions underneath the kinds' strategies, by the names both trees give them.
STRATEGIES = {
    "cases": ("paracheck.strategies._core:cases", "fp64"),
    "loop_cases": ("paracheck.strategies._loop:loop_cases", "fp32"),
    "sharding_cases": ("paracheck.strategies._sharding:sharding_cases", "fp64"),
    "fsdp_cases": ("paracheck.strategies._fsdp:fsdp_cases", "fp64"),
}


def _load(path: str):
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def _draw(strategy, n: int) -> list:
    """The first ``n`` cases ``strategy`` draws, derandomised. Keep this function's text as it
    is: Hypothesis seeds the derandomised draws from it."""
    drawn: list = []

    @settings(
        derandomize=True,
        database=None,
        max_examples=n,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        phases=[Phase.generate],
    )
    @given(strategy)
    def record(case):
        drawn.append(case)

    record()
    return drawn


def _tensor(h, t) -> None:
    if t is None:
        h.update(b"None;")
        return
    if not torch.is_tensor(t):
        t = torch.tensor(float(t))
    t = t.detach().cpu().contiguous()
    h.update(f"{t.dtype}{tuple(t.shape)}:".encode())
    h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    h.update(b";")


def _tensors(h, label: bytes, tensors) -> None:
    h.update(label)
    for t in tensors:
        _tensor(h, t)


def _trajectory_hash(case) -> str:
    from paracheck.oracle import train

    h = hashlib.sha256()
    try:
        traj = train(case)
    except Exception as exc:  # the oracle refusing a case is behaviour too
        h.update(f"raised {type(exc).__name__}: {exc}".encode())
        return h.hexdigest()
    _tensors(h, b"initial_params", traj.initial_params)
    _tensors(h, b"initial_buffers", traj.initial_buffers)
    for k, step in enumerate(traj.steps):
        h.update(f"step {k} losses".encode())
        for rank in step.losses:
            h.update(",".join(float(x).hex() for x in rank).encode() + b";")
        _tensors(h, b"grads", step.grads)
        _tensors(h, b"params", step.params)
        h.update(b"state")
        for index in sorted(step.state):
            h.update(f"[{index}]".encode())
            for name in sorted(step.state[index]):
                h.update(name.encode())
                _tensor(h, step.state[index][name])
        h.update(b"masters")
        if step.masters is None:
            h.update(b"None;")
        else:
            for t in step.masters:
                _tensor(h, t)
        h.update(f"skipped {bool(step.skipped)}".encode())
    return h.hexdigest()


def _measure(name: str, path: str, cases: list, verbose: bool, dump: str | None) -> str:
    case_hash, traj_hash = hashlib.sha256(), hashlib.sha256()
    rows = []
    for i, case in enumerate(cases):
        text = case.to_json()
        case_hash.update(text.encode() + b"\n")
        one = _trajectory_hash(case)
        traj_hash.update(one.encode() + b"\n")
        rows.append(
            f"  {name} #{i} world={case.world_size} "
            f"case={hashlib.sha256(text.encode()).hexdigest()[:16]} traj={one[:16]}"
        )
        if dump:
            folder = os.path.join(dump, name)
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, f"{i:03d}.json"), "w") as f:
                f.write(case.to_json(indent=1) + "\n")
    line = (
        f"{name:<22} {len(cases):>3} {case_hash.hexdigest()[:16]} {traj_hash.hexdigest()[:16]} "
        f"{path}"
    )
    return "\n".join([line, *rows]) if verbose else line


def _search(name: str):
    """A check's ``_Search`` of the built-in ``name`` at world sizes 1-4, every other setting at
    its default, on a stand-in World (building a search does not use it)."""
    from types import SimpleNamespace

    from paracheck.check.settings import CheckSettings
    from paracheck.check.shared_search import _Search
    from paracheck.check.targets import resolve_target

    target = resolve_target(name)
    world = SimpleNamespace(timeout=60.0)
    search = _Search(target, world, CheckSettings(world_sizes=WORLD_SIZES), *[None] * 4)
    return search, f"{target.kind}, {search.precision}"


def _checked(search, n: int) -> list:
    """The first ``n`` cases the check's first search over the whole contract runs (its
    ``_Checker.search`` with the tag ``new:0``: its own test function and derandomised
    sequence), each recorded and passed instead of run, so that nothing fails and nothing
    shrinks."""
    from types import SimpleNamespace

    cases: list = []

    def run(case):
        cases.append(case)
        return SimpleNamespace(failed_properties=frozenset())

    search.checker.run = run
    search.checker.search(
        search.strategy,
        lambda failed: None,
        max_examples=n,
        tag="new:0",
        shrink_budget=lambda prop: None,
    )
    return cases


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=20, help="cases per kind (default 20)")
    parser.add_argument("--kinds", help="comma-separated kinds (default: every kind)")
    parser.add_argument("--targets", help="comma-separated built-in targets (default: none)")
    parser.add_argument(
        "--checked",
        type=int,
        default=40,
        help="cases of each target's own search (default 40, the ci profile's)",
    )
    parser.add_argument("--verbose", action="store_true", help="a line per case")
    parser.add_argument("--dump", help="write each case's JSON under this directory")
    args = parser.parse_args(argv)

    torch.set_num_threads(1)
    import paracheck
    from paracheck.check.kinds import KINDS

    print(f"paracheck: {paracheck.__file__}")
    kinds = args.kinds.split(",") if args.kinds else list(KINDS)
    print(f"{'name':<22} {'N':>3} {'cases':<16} {'trajectories':<16} strategy")
    done: dict[tuple[str, str], str] = {}
    t0 = time.monotonic()
    jobs = [
        (kind, KINDS[kind].strategy, PRECISIONS[KINDS[kind].dtype]) if kind in KINDS else (kind,)
        for kind in kinds
    ]
    jobs += [(name, path, precision) for name, (path, precision) in STRATEGIES.items()]
    for job in jobs:
        if len(job) == 1:
            print(f"{job[0]:<22} not a kind of this tree")
            continue
        name, path, precision = job
        key = (path, precision)
        if key in done and not args.verbose and not args.dump:
            # The same strategy at the same precision draws the same cases (zero, zero2, sharded).
            print(f"{name:<22}{done[key][22:]}")
            continue
        strategy = _load(path)(world_sizes=WORLD_SIZES, precision=precision)
        out = _measure(name, path, _draw(strategy, args.n), args.verbose, args.dump)
        done[key] = out.splitlines()[0]
        print(out, flush=True)
    targets = args.targets.split(",") if args.targets else []
    for name in targets:
        search, what = _search(name)
        cases = _draw(search.strategy, args.n)
        row = f"search:{name}"
        print(_measure(row, f"search ({what})", cases, args.verbose, args.dump), flush=True)
    for name in targets:
        search, what = _search(name)
        cases = _checked(search, args.checked)
        row = f"checked:{name}"
        print(_measure(row, f"the check's sequence ({what})", cases, args.verbose, args.dump))
    print(f"({time.monotonic() - t0:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
