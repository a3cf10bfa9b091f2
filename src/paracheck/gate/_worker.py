"""``python -m paracheck.gate._worker``: one commit's measuring process for ``paracheck gate``.

The gate starts one worker per commit with ``PYTHONPATH=<that commit's tree>/src``, so every line
of paracheck it measures (components and measuring code alike) is that commit's. The worker keeps
one ``World`` for its whole life and answers JSON lines on stdin with JSON lines on stdout:

    {"cmd": "start", "device": "cpu"|"cuda", "world_size": 2, "timeout": 120, "targets": [...]}
        -> {"ok": true, "paracheck": "<file>", "variants": [...], "torch": "<version>",
            "missing": {target: "<why it cannot be built>"}, "modules": {target: "<its module's file>"}}

Without ``targets`` the variants are every built-in one; with them (import paths of a user's
classes, the installed paracheck measuring a user's repository) the targets that import.
    {"cmd": "time" | "account", "spec": StepSpec.to_dict()}
        -> {"ok": true, "result": StepTiming/StepAccount.to_dict()}
    {"cmd": "stop"}

A failure answers ``{"ok": false, "error": "<traceback>"}`` and the worker keeps serving.
Anything else printed (warnings, a component's prints) goes to stderr, never into the protocol.
"""

from __future__ import annotations

import json
import os
import sys
import traceback


def _targets(targets: list[str]) -> dict:
    """Which of ``targets`` build here, why the others do not, and where each one's module is."""
    import inspect

    from paracheck.check.targets import load_object, resolve_target

    variants, missing, modules = [], {}, {}
    for t in targets:
        try:
            resolve_target(t)
            modules[t] = inspect.getfile(load_object(t))
            variants.append(t)
        except Exception as exc:  # noqa: BLE001 - any import or inference failure is reported by name
            missing[t] = f"{type(exc).__name__}: {exc}"
    return {"variants": variants, "missing": missing, "modules": modules}


def main() -> int:
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # stray prints from measured code land on stderr
    sys.stdout = sys.stderr
    world = None
    try:
        for line in sys.stdin:
            if not line.strip():
                continue
            msg = json.loads(line)
            try:
                if msg["cmd"] == "stop":
                    break
                if msg["cmd"] == "start":
                    import torch

                    import paracheck
                    from paracheck.bench.variants import available_variants
                    from paracheck.world import World

                    backend = "nccl" if msg.get("device") == "cuda" else "gloo"
                    world = World(
                        int(msg["world_size"]),
                        backend=backend,
                        timeout=float(msg.get("timeout", 120)),
                    )
                    reply = {
                        "ok": True,
                        "paracheck": paracheck.__file__,
                        "torch": torch.__version__,
                    }
                    if msg.get("targets"):
                        reply.update(_targets(msg["targets"]))
                    else:
                        reply["variants"] = list(available_variants())
                else:
                    from paracheck.bench.step import StepSpec, account_step, time_step

                    spec = StepSpec.from_dict(msg["spec"])
                    measure = {"time": time_step, "account": account_step}[msg["cmd"]]
                    reply = {"ok": True, "result": measure(world, spec).to_dict()}
            except Exception:  # noqa: BLE001 - every failure goes back to the gate
                reply = {"ok": False, "error": traceback.format_exc()}
            protocol.write(json.dumps(reply) + "\n")
    finally:
        if world is not None:
            world.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
