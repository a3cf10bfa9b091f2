"""CUDA timing and instrumentation as no-ops, for judging a target's logic on a CPU-only machine.

Runs inside the rank processes (``--stub-cuda-timing``; ``Target.stub_cuda_timing`` runs the
kind's rank program through ``run_stubbed``). Code under test often times or annotates its communication with
``torch.cuda.synchronize()``, ``torch.cuda.nvtx.range(...)``, ``torch.cuda.Event(
enable_timing=True)`` or ``torch.cuda.current_stream()``; on a build without CUDA each raises
before the logic runs. ``stubbed_cuda_timing()`` replaces exactly those attributes of
``torch.cuda`` / ``torch.cuda.nvtx`` for the duration of one job and restores them after, so a
rank never keeps a stub into the next job. Only attributes looked up at call time are replaced:
a name imported before the job (``from torch.cuda import synchronize``) keeps the original.
Nothing that moves data is stubbed (``.cuda()``, ``device="cuda"`` still need a GPU), and
``torch.cuda.is_available()`` still says False.
"""

from __future__ import annotations

import contextlib

from paracheck.check.ranks.job import RankJob

__all__ = ["STUBBED", "run_stubbed", "stubbed_cuda_timing"]


class _Event:
    """``torch.cuda.Event`` with nothing to time: ``elapsed_time`` is 0.0."""

    def __init__(self, *args, **kwargs):
        pass

    def record(self, stream=None):
        pass

    def wait(self, stream=None):
        pass

    def query(self) -> bool:
        return True

    def synchronize(self):
        pass

    def elapsed_time(self, end_event) -> float:
        return 0.0


class _Stream:
    """``torch.cuda.Stream`` on which everything is already complete."""

    def __init__(self, *args, **kwargs):
        pass

    def synchronize(self):
        pass

    def wait_stream(self, stream):
        pass

    def wait_event(self, event):
        pass

    def record_event(self, event=None):
        return event if event is not None else _Event()

    def query(self) -> bool:
        return True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _nothing(*args, **kwargs):
    return None


def _zero(*args, **kwargs):
    return 0


def _null_context(*args, **kwargs):
    return contextlib.nullcontext()


# (module attribute path, replacement): what the stub replaces.
STUBBED = (
    ("torch.cuda", "synchronize", _nothing),
    ("torch.cuda", "Event", _Event),
    ("torch.cuda", "Stream", _Stream),
    ("torch.cuda", "current_stream", lambda device=None: _Stream()),
    ("torch.cuda", "default_stream", lambda device=None: _Stream()),
    ("torch.cuda", "stream", _null_context),
    ("torch.cuda", "reset_peak_memory_stats", _nothing),
    ("torch.cuda", "reset_max_memory_allocated", _nothing),
    ("torch.cuda.nvtx", "range", _null_context),
    ("torch.cuda.nvtx", "range_push", _zero),
    ("torch.cuda.nvtx", "range_pop", _zero),
    ("torch.cuda.nvtx", "range_start", _zero),
    ("torch.cuda.nvtx", "range_end", _nothing),
    ("torch.cuda.nvtx", "mark", _nothing),
)

_MISSING = object()


@contextlib.contextmanager
def stubbed_cuda_timing():
    """Within the block, the ``STUBBED`` CUDA timing/instrumentation calls are no-ops."""
    import importlib

    saved = []
    try:
        for module_name, attr, stub in STUBBED:
            module = importlib.import_module(module_name)
            saved.append((module, attr, getattr(module, attr, _MISSING)))
            setattr(module, attr, stub)
        yield
    finally:
        for module, attr, original in reversed(saved):
            if original is _MISSING:
                delattr(module, attr)
            else:
                setattr(module, attr, original)


def run_stubbed(job: RankJob):
    """The rank program ``job.stubbed`` (``"module:function"``, the target's kind's) run
    within ``stubbed_cuda_timing()``: one entry for every kind (``Target.rank_fn``)."""
    import importlib

    job.require("stubbed")
    module, _, name = job.stubbed.partition(":")
    program = getattr(importlib.import_module(module), name)
    with stubbed_cuda_timing():
        return program(job)
