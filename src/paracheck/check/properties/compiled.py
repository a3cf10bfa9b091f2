"""The ``compile-ledger`` property (DDP targets, in compiled cases: Note [Compiled cases] in
``paracheck.cases._compile``): a compiled case issues the collectives its eager twin issues.

Note [A sync compiled away]
    Averaging is linear: a wrapper that synchronises every micro-step where it should have
    accumulated under ``no_sync()`` leaves the same average as one that synchronises once, and a
    sync that becomes a no-op leaves gradients that equal the oracle's wherever the ranks'
    gradients agree (one rank; every rank fed alike). Values alone cannot tell; the ledger can.
    So the same case is run once more, eagerly (``compiled=None``), on the same World, and each
    rank's synchronisation windows are compared with the compiled run's, window by window: the
    collectives issued as (kind, payload bytes), those issued inside ``no_sync()``, and those
    issued in the synchronised passes, before ``finish_gradient_synchronization()`` (the
    schedule: a design whose hooks do not fire under compile and that reduces every gradient in
    its finish instead computes the same values, and has lost its overlap of communication with
    backward without a word). Compared as multisets, not sequences: under ``torch.compile``
    the gradients of one compiled graph are accumulated together, after its whole backward, so
    hooks that fire per gradient may launch in another order than eagerly; which messages a
    window sends, and how large, is what a compiled sync that does nothing (or too much)
    changes. A case the eager run skips, or the compiled one (torch could not compile it: Note
    [What torch cannot compile] in ``paracheck.check.ranks._compiled``), is not judged.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from paracheck.cases import Case
from paracheck.check.properties._divergence import Divergence
from paracheck.check.ranks.record import RankRecord, Window
from paracheck.world import World

__all__ = [
    "NAME",
    "check_compile_ledger",
    "compiling_seconds",
    "compiling_too_long",
    "model_cannot_compile",
    "ledger_difference",
]

# Note [Compiling is not hanging]
#   A compiled case compiles inside its job, under the World's hang timeout: seconds for aot_eager,
#   up to minutes for the inductor on a loaded CPU (gcc), where the eager cases before it set the
#   search's adaptive timeout at ten times theirs. So a compiled case runs under the World's whole
#   timeout (``paracheck.check.run.run_case``), and a compiled case that still does not finish
#   while a rank's stack is inside Dynamo or the inductor is skipped, naming the timeout to raise:
#   a slow compiler is no hang of the target's. A rank found anywhere else (every rank waiting in
#   a collective, or in the target's own code) is a hang as in an eager case.
#   The frames that say "compiling" are those of Dynamo's frame conversion and of the inductor's
#   compilation and code cache, never those compiled code runs through (Dynamo's and AOTAutograd's
#   runtime wrappers): a rank hung in a collective its compiled code issued is a hang. A stack is
#   printed only to its 100 innermost frames: a rank importing the inductor's kernels from inside
#   AOTAutograd's partitioner had Dynamo's frame conversion cut off below them (a correct DDP's
#   compiled case was called a hang after 22 s, importing jinja2, on a loaded machine), so the
#   frames of Dynamo's tracing and graph output and of AOTAutograd's compiling count too.
_COMPILER_FRAMES = (
    "/torch/_dynamo/convert_frame.py",
    "/torch/_dynamo/symbolic_convert.py",
    "/torch/_dynamo/output_graph.py",
    "/torch/_functorch/_aot_autograd/graph_compile.py",
    "/torch/_functorch/partitioners.py",
    "/torch/_inductor/compile_fx.py",
    "/torch/_inductor/codecache.py",
    "/torch/_inductor/cpp_builder.py",
    "/torch/_inductor/graph.py",
)

NAME = "compile-ledger"


def _messages(calls) -> str:
    counts = Counter(calls)
    return ", ".join(f"{n} x {kind} of {size} B" for (kind, size), n in sorted(counts.items()))


def _window_difference(compiled: Window, eager: Window) -> str | None:
    if Counter(compiled.in_no_sync) != Counter(eager.in_no_sync):
        return (
            f"inside no_sync() it issued [{_messages(compiled.in_no_sync)}] where eagerly it "
            f"issued [{_messages(eager.in_no_sync)}]"
        )
    if Counter(compiled.in_passes) != Counter(eager.in_passes):
        return (
            f"during forward and backward it issued [{_messages(compiled.in_passes)}] where "
            f"eagerly it issued [{_messages(eager.in_passes)}] (the rest in its finish)"
        )
    if Counter(compiled.calls) != Counter(eager.calls):
        return (
            f"it issued [{_messages(compiled.calls)}] where eagerly it issued "
            f"[{_messages(eager.calls)}]"
        )
    return None


def ledger_difference(compiled: list[RankRecord], eager: list[RankRecord]):
    """The first (step, rank, what) at which the compiled run's windows differ from the eager
    run's (Note [A sync compiled away]), or None."""
    for rank, (c, e) in enumerate(zip(compiled, eager)):
        for k, (sc, se) in enumerate(zip(c.steps, e.steps)):
            if len(sc.windows) != len(se.windows):
                return (
                    k,
                    rank,
                    f"{len(sc.windows)} synchronisation windows where eagerly {len(se.windows)}",
                )
            for w, (wc, we) in enumerate(zip(sc.windows, se.windows)):
                found = _window_difference(wc, we)
                if found is not None:
                    return k, rank, f"in window {w} {found}"
    return None


def check_compile_ledger(
    world: World, target, case: Case, ranks: list[RankRecord], *, timeout=None
) -> Divergence | None:
    """Run the compiled ``case`` again eagerly and compare every rank's synchronisation windows
    with those of its compiled run (``ranks``); None for an eager case."""
    if case.compiled is None or ranks[0].skipped is not None:
        return None
    job = target.job(replace(case, compiled=None))
    eager = world.run(target.rank_fn, job, world_size=case.world_size, timeout=timeout)
    if eager[0].skipped is not None:
        return None
    found = ledger_difference(ranks, eager)
    if found is None:
        return None
    step, rank, what = found
    return Divergence(
        step,
        NAME,
        rank,
        None,
        None,
        float("inf"),
        0.0,
        f"under torch.compile ({case.compiled}), {what}: a synchronisation compile changed "
        "(Note [A sync compiled away])",
    )


def compiling_too_long(case: Case, exc) -> str | None:
    """Why a compiled ``case`` whose job did not finish is skipped (Note [Compiling is not
    hanging]), or None: ``exc`` (a ``WorldError``) is a hang with a rank inside the compiler."""
    if case.compiled is None or getattr(exc, "kind", None) != "hung":
        return None
    stacks = [f.detail.replace("\\", "/") for f in getattr(exc, "failures", ())]
    if not any(frame in stack for stack in stacks for frame in _COMPILER_FRAMES):
        return None
    return (
        f"compiling ({case.compiled}) took longer than the hang timeout: a rank was still inside "
        "torch.compile; give the check a longer --timeout to judge compiled cases"
    )


# Note [A user's model torch cannot compile]
#   A compiled case on a user's model (Note [A user's model]) compiles the user's layers as well
#   as the wrapper, and torch may fail on the layers alone: measured on torch 2.13,
#   ``torch.compile(model, backend="aot_eager")`` of a model of stock layers (a BatchNorm1d whose
#   output is transposed into a Linear) raised "view size is not compatible with input tensor's
#   size and stride" at two rows or more, in one process, with no wrapper, as the code it compiled
#   ran. The ranks then raise in a frame of compiled code, not of Dynamo's compiling, so Note
#   [What torch cannot compile] does not see it, and the ``+compile`` row failed a correct DDP.
#   So where a compiled case on a user's model raises, the model is compiled alone in this
#   process with the case's backend, in its dtype, and run forward and backward on the batch
#   sizes its ranks had; if that raises too, the case is skipped with torch's words: torch cannot
#   compile the model, whatever the wrapper does. Once per model, setting, dtype and batch sizes.
_ALONE: dict[tuple, str | None] = {}


def model_cannot_compile(case: Case, exc) -> str | None:
    """Why a compiled ``case`` on a user's model whose ranks raised is skipped (Note [A user's
    model torch cannot compile]), or None: the model alone compiles and runs."""
    if case.compiled is None or case.user_model is None or getattr(exc, "kind", None) != "raised":
        return None
    from paracheck.cases import COMPILE_SETTINGS, DTYPES

    setting = COMPILE_SETTINGS.get(case.compiled)
    if setting is None:
        return None
    rows = tuple(sorted(set(case.batch_sizes)))
    key = (case.user_model, setting.backend, case.dtype, rows)
    if key not in _ALONE:
        _ALONE[key] = _alone(case, setting.backend, DTYPES[case.dtype], rows)
    why = _ALONE[key]
    return (
        None
        if why is None
        else f"torch.compile ({case.compiled}) cannot run the model alone: {why}"
    )


def _alone(case: Case, backend: str, dtype, rows) -> str | None:
    import torch

    from paracheck.workloads.user import build_user_model, user_batch, user_loss

    user = case.user_model
    try:
        for n in rows:
            model = build_user_model(user, case.seed, dtype)
            compiled = torch.compile(model, backend=backend)
            x, y = user_batch(user, case.seed, n, dtype)
            user_loss(user, compiled(x), y).backward()
    except Exception as exc:  # torch's, on the model alone: its words are the reason
        first = (str(exc).strip().splitlines() or [""])[0]
        return f"{type(exc).__name__}: {first[:300]} (in one process, no wrapper, {n} row{'' if n == 1 else 's'})"
    finally:
        torch._dynamo.reset()
    return None


def compiling_seconds(results) -> float:
    """The seconds rank 0 spent compiling the compiled cases among ``results`` (``CaseResult``s,
    each counted once), 0.0 where none was compiled (Note [Compiled cases] in
    ``paracheck.cases._compile``)."""
    unique = {id(r): r for r in results}.values()
    return sum((r.extra.get("compiled") or {}).get("compile_s", 0.0) for r in unique)
