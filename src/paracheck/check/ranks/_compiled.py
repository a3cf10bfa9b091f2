"""A compiled case inside a rank (Note [Compiled cases] in ``paracheck.cases._compile``): the
wrapper called through ``torch.compile``, the backward under compiled autograd where the setting
names it, and what the compilation cost.

Note [Recording compiled code]
    Every window's collectives are recorded by a ``TorchDispatchMode``
    (``paracheck.accounting.record.Recorder``), and Dynamo declines to trace while a mode that
    does not ignore compile internals is active: it runs the frame eagerly, silently (torch 2.13,
    ``convert_frame``: "non-infra torch dispatch mode present", read in its source), so a compile
    row would check the eager code again. So
    while a compiled case runs, the recorder says it ignores compile internals
    (``Recorder.compiled_code``): Dynamo compiles with the mode off, and the compiled code runs
    with it on, so the collectives it issues through the dispatcher (torch DDP's reducer, the
    functional collectives of a traced hook, a wrapper's ``dist.all_reduce``) are recorded as
    eagerly. Operators fused into one kernel are not seen one by one, which changes no count the
    check reads (collectives are never fused). The rank counts the graphs it compiled
    (``CompiledRun.graphs``), so that a case Dynamo ran eagerly is told from one it compiled.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch

from paracheck.accounting.record import Recorder
from paracheck.cases import COMPILE_SETTINGS, Case
from paracheck.check.ranks._drive import DDPDriver
from paracheck.check.ranks.job import RankJob
from paracheck.check.ranks.record import RankRecord

__all__ = ["CompiledRun", "compiling", "run_compiled"]

# Where Dynamo compiles a frame: an exception raised with this file on its traceback was raised
# while compiling, not by the compiled code running (Note [What torch cannot compile]).
_COMPILING_FILE = "torch/_dynamo/convert_frame.py"


@dataclass
class CompiledRun:
    """What a compiled case cost one rank: the graphs Dynamo gave the backend (one a compiled
    frame, forward and backward together; each piece of a graph split at DDP's buckets; each
    compiled-autograd graph), the seconds Dynamo spent compiling
    (``torch._dynamo.utils.calculate_time_spent``: frames and backward graphs) and the case's
    whole training; ``setting`` None for an eager case (then ``driver`` and ``record`` are the
    identity)."""

    setting: str | None = None
    graphs: int = 0
    compile_s: float = 0.0
    wall_s: float = 0.0
    _backend: Callable[..., Any] | None = None
    _t0: float = 0.0

    def driver(self, drv: DDPDriver) -> DDPDriver:
        """``drv`` with its forward called through ``torch.compile`` (the wrapper itself, as users
        compile it: Note [Compiled cases]); unchanged for an eager case."""
        if self.setting is None or self._backend is None:
            return drv
        if COMPILE_SETTINGS[self.setting].whole_step:
            raise _NotCompiled(
                f"compiled={self.setting!r} compiles a loop's whole step; a DDP case has none"
            )
        if COMPILE_SETTINGS[self.setting].compiled_autograd and _wraps_torch_ddp(drv.wrapper):
            raise _NotCompiled(TORCH_DDP_COMPILED_AUTOGRAD)
        return replace(drv, forward=torch.compile(drv.forward, backend=self._backend))

    def loop(self, step_fn: Callable, model: torch.nn.Module) -> Callable:
        """A loop's ``step_fn`` as a compiled case calls it (Note [Compiled loops]): ``model``
        compiled in place (``nn.Module.compile``: the same module, its calls compiled), or for a
        whole-step setting the step called through ``torch.compile``; unchanged for an eager
        case."""
        if self.setting is None or self._backend is None:
            return step_fn
        if COMPILE_SETTINGS[self.setting].whole_step:
            return torch.compile(step_fn, backend=self._backend)
        model.compile(backend=self._backend)
        return step_fn

    def record(self, record):
        """``record`` (a ``RankRecord``) with this run's cost, for a compiled case."""
        if self.setting is None or record.skipped is not None:
            return record
        import torch._dynamo.utils

        self.wall_s = time.monotonic() - self._t0
        self.compile_s = torch._dynamo.utils.calculate_time_spent().get("total_wall_time", 0.0)
        return replace(
            record,
            compiled={
                "setting": self.setting,
                "graphs": self.graphs,
                "compile_s": round(self.compile_s, 3),
                "wall_s": round(self.wall_s, 3),
            },
        )


@contextlib.contextmanager
def compiling(case: Case):
    """The whole of one case's training on a rank, compiled as ``case.compiled`` names (Note
    [Compiled cases]); yields a ``CompiledRun`` (its ``driver`` and ``record`` are the identity for
    an eager case). Dynamo's caches are reset first, and its configuration is restored after."""
    if case.compiled is None:
        yield CompiledRun()
        return
    import torch._dynamo
    import torch._dynamo.utils
    from torch._dynamo import compiled_autograd
    from torch._dynamo.backends.registry import lookup_backend

    setting = COMPILE_SETTINGS[case.compiled]
    run = CompiledRun(setting.name)
    inner = lookup_backend(setting.backend)

    def counting(gm, example_inputs):
        run.graphs += 1
        return inner(gm, example_inputs)

    run._backend = counting
    torch._dynamo.reset()
    torch._dynamo.utils.reset_frame_count()
    was_optimize, was_recording = torch._dynamo.config.optimize_ddp, Recorder.compiled_code
    torch._dynamo.config.optimize_ddp = setting.optimize_ddp  # type: ignore[assignment]
    Recorder.compiled_code = True  # Note [Recording compiled code]
    run._t0 = time.monotonic()
    try:
        with contextlib.ExitStack() as stack:
            if setting.backend == "inductor":  # Note [A rank waiting for its compiler]
                import torch._inductor.config as inductor

                stack.enter_context(inductor.patch(compile_threads=1))
                stack.enter_context(_running_while_children_run())
            if setting.compiled_autograd:
                stack.enter_context(compiled_autograd._enable(torch.compile(backend=counting)))
            yield run
    finally:
        torch._dynamo.config.optimize_ddp = was_optimize
        Recorder.compiled_code = was_recording
        torch._dynamo.reset()


# Note [What torch cannot compile]
#   Some wrappers cannot be compiled in some settings, and torch says so loudly, while compiling:
#   compiled autograd traces a post-accumulate-grad hook that queues an autograd-engine callback
#   (paracheck's overlapped and bucketed DDPs do, to finish a round) only with fullgraph=True
#   ("queue_callback() is only supported when Compiled Autograd is enabled with fullgraph=True"),
#   and with fullgraph=True a hook that launches an asynchronous all-reduce cannot be traced at all;
#   torch DDP with the graph-break optimiser refuses a bucket cap under its 1 MiB first bucket
#   ("First bucket should be smaller/equal to other buckets", torch 2.13). Such a case computes
#   nothing wrong: it is skipped with torch's words (every rank compiles the same frames, so every
#   rank raises alike), never failed. An exception raised by the compiled code as it runs (a
#   hook's own error) has no compiling frame on its traceback and fails the case as eagerly.
# Note [What torch cannot compile], continued: torch DDP under compiled autograd runs its Python
# reducer (the only one compiled autograd accepts), which, measured on torch 2.13, issues no
# all-reduce of find_unused_parameters' map of locally used parameters (compile-ledger: 16 B
# missing from every window), and after which the rank's later compiled torch DDP cases raised
# in backward ("_DDPSink.backward: MLP.forward() missing 1 required positional argument") on
# fresh Dynamo caches. Such cases are skipped, naming both.
TORCH_DDP_COMPILED_AUTOGRAD = (
    "torch DDP under compiled autograd is not judged: its Python reducer drops the all-reduce of "
    "find_unused_parameters' used-parameter map, and left the rank's later compiled torch DDP "
    "cases raising in _DDPSink.backward (torch 2.13)"
)


class _NotCompiled(Exception):
    """A compiled case this rank does not run (the reason is the message)."""


def _wraps_torch_ddp(wrapper) -> bool:
    from torch.nn.parallel import DistributedDataParallel

    modules = wrapper.modules() if isinstance(wrapper, torch.nn.Module) else ()
    return any(isinstance(m, DistributedDataParallel) for m in modules)


def compile_failure(exc: BaseException, setting: str) -> str | None:
    """Why a case was skipped, where ``exc`` was raised while Dynamo compiled a frame (Note [What
    torch cannot compile]); None where it was raised otherwise."""
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.replace("\\", "/").endswith(_COMPILING_FILE):
            first = (str(exc).strip().splitlines() or [""])[0]
            return (
                f"torch.compile ({setting}) cannot compile this case: {type(exc).__name__}: "
                f"{first[:300]}"
            )
        tb = tb.tb_next
    return None


def run_compiled(job: RankJob, train) -> RankRecord:
    """``train(job, compiled)`` (a rank program's training, returning its ``RankRecord``)
    under ``compiling(job.case)``, with the compilation's cost recorded; a case torch
    cannot compile is skipped (Note [What torch cannot compile])."""
    case: Case = job.case
    with compiling(case) as compiled:
        try:
            return compiled.record(train(job, compiled))
        except _NotCompiled as exc:
            return RankRecord.skip(str(exc))
        except Exception as exc:
            why = None if case.compiled is None else compile_failure(exc, case.compiled)
            if why is None:
                raise
            return RankRecord.skip(why)


# Note [A rank waiting for its compiler]
#   The inductor builds each new C++ kernel with gcc, a child process of the rank. The World's
#   watch reads a rank's own threads' CPU time, and a rank that neither ran, issued a collective
#   nor changed state for 3 s is a stall, reported at once as a hang (Note [Timeout verdicts] in
#   paracheck.world._collect): measured, a bucketed case lowered by the inductor was stopped so
#   after 37 s, with its ranks waiting for gcc. So while an inductor case runs, the compiler runs
#   in the rank's own children only (``compile_threads=1``: no pool of workers kept alive), and a
#   thread of the rank runs for ``_SHARE`` of each ``_PERIOD_S`` while the rank has a child
#   alive: the rank is seen as running exactly while its compiler is.
_PERIOD_S = 0.1
_SHARE = 0.1


def _has_children() -> bool:
    base = "/proc/self/task"
    try:
        for tid in os.listdir(base):
            with open(f"{base}/{tid}/children") as f:
                if f.read().strip():
                    return True
    except OSError:
        return False
    return False


@contextlib.contextmanager
def _running_while_children_run():
    done = threading.Event()

    def beat() -> None:
        while not done.wait(_PERIOD_S * (1 - _SHARE)):
            if _has_children():
                until = time.monotonic() + _PERIOD_S * _SHARE
                while time.monotonic() < until:
                    pass

    thread = threading.Thread(target=beat, name="paracheck-compiler-wait", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
