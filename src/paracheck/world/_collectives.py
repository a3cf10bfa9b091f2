"""Inside a rank process: count the collectives a job issues and publish the count in a file.

Private to ``paracheck.world``. The rank wraps the public collectives of the ``torch.distributed``
namespace once, at start (before any target is imported, so ``from torch.distributed import
all_reduce`` in a target binds the wrapper too), and ``Work.wait``. While a job runs, every call
updates this rank's status: which collective it is inside (if any), how many of each it issued,
and how many went to the default group. The status is one small JSON record rewritten in place
(``os.pwrite`` at offset 0, padded to a fixed size) in ``<stack_dir>/rank<r>.status``; the driver
reads it while a job is late, to tell a deadlock from a slow case (Note [Definite deadlock] in
``paracheck.world._watch``) and to say in a hang report what the ranks disagree on. When the
record is written is Note [Counting costs the step nothing].

Note [Counting costs the step nothing]
    A DDP that overlaps communication with backward launches its collectives from autograd hooks,
    on the thread that also launches backward's kernels: on a GPU, every microsecond spent there
    is a microsecond the GPU may wait. Rewriting the status record (JSON and a ``pwrite``, about
    11 us) on every launch and every ``Work.wait`` cost an overlapped DDP of 435 parameters tens of
    milliseconds per step on 2 GPUs, seen only there. So a call that returns at once (a launch
    with ``async_op=True``, ``Work.wait``) only updates the counts in memory, and the rank's
    watchdog thread writes the record when it changed (``flush``, every 0.05 s); a blocking call
    (any other collective) and the start and end of a job still write at once. The driver loses
    nothing: a rank blocked inside a wait or a launch is flushed within 0.05 s, well inside the
    0.1 s between the two polls Note [Definite deadlock] needs, and the deadlock rules compare
    counts that only grow, so a record 0.05 s old can make a deadlock look later, never make one.

Calls that torch makes between its own c10d functions do not go through the namespace and are not
counted, so a forwarding alias (``all_gather_object`` -> ``all_gather``) counts once.
"""

from __future__ import annotations

import inspect
import json
import os
import threading
import time
from collections.abc import Callable

__all__ = ["CollectiveCounter", "install", "read_status", "set_step", "COUNTED"]

COUNTED = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_single",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce_scatter_single",
    "broadcast",
    "reduce",
    "barrier",
    "all_to_all",
    "all_to_all_single",
    "gather",
    "scatter",
    "send",
    "recv",
    "isend",
    "irecv",
    "monitored_barrier",
    "all_gather_object",
    "broadcast_object_list",
    "gather_object",
    "scatter_object_list",
    "batch_isend_irecv",
)

# Collectives whose tensor must have the same number of elements and dtype on every rank; the
# others (all_gather, reduce_scatter, all_to_all, the object collectives) may differ by design.
SIZED = ("all_reduce", "broadcast", "reduce")

_RECORD = (
    2048  # bytes of one status record (fixed, so a reader never sees the tail of an older one)
)


class CollectiveCounter:
    """This rank's collective counts for the running job, mirrored to its status file."""

    def __init__(self, path: str | None = None):
        self._fd: int | None = None
        if path is not None:
            self.attach(path)
        self.active = False
        self.job = None
        self.began_ns = 0
        self.step: int | None = None  # the step the job said it is in (set_step)
        self.on_step: Callable[[int], None] | None = (
            None  # called by set_step, before ``step`` changes
        )
        self._dirty = False  # counts changed since the record was last written
        # Held while a record is built and written: the watchdog's flush must not write an older
        # record over the one a blocking call just wrote.
        self._writing = threading.Lock()
        self._reset()

    def attach(self, path: str) -> None:
        """Mirror the counts to ``path`` from now on."""
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)

    def _reset(self) -> None:
        self.counts: dict[str, int] = {}
        self.total = 0
        self.world_total = 0  # collectives on the default group (the ones every rank must match)
        self.inside: str | None = None
        self.inside_index = 0
        # The last SIZED collective on the default group this job entered, kept after it
        # returns or raises: [kind, its count of that kind, world_total, numel, dtype].
        self.sized: list | None = None

    def begin(self, job) -> None:
        self.job = job
        self.began_ns = time.time_ns()  # on the clock of torch's flight recorder
        self.step = None
        self._reset()
        self.active = True
        self._write("running")

    def end(self, state: str) -> None:
        self.active = False
        self.inside = None
        self._write(state)

    def enter(
        self, name: str, on_world: bool, size: list | None = None, *, blocking: bool = True
    ) -> None:
        """Entering a collective; one that returns at once (``blocking=False``) is written by the
        next ``flush`` (Note [Counting costs the step nothing])."""
        self.counts[name] = self.counts.get(name, 0) + 1
        self.total += 1
        self.world_total += on_world
        self.inside, self.inside_index = name, self.counts[name]
        if on_world and size is not None:
            self.sized = [name, self.counts[name], self.world_total, *size]
        if blocking:
            self._write("running")
        else:
            self._dirty = True

    def enter_wait(self) -> None:
        self.inside, self.inside_index = "wait", self.counts.get("wait", 0) + 1
        self._dirty = True

    def leave(self, *, blocking: bool = True) -> None:
        self.inside = None
        if blocking:
            self._write("running")
        else:
            self._dirty = True

    def flush(self) -> None:
        """Write the record if a call since the last write left it out (from the watchdog
        thread: Note [Counting costs the step nothing])."""
        if self._dirty and self.active:
            self._write("running")

    def _write(self, state: str) -> None:
        with self._writing:
            self._write_locked(state)

    def _write_locked(self, state: str) -> None:
        # Cleared before the record is read: a call that lands while it is built sets it again
        # and is written by the next flush.
        self._dirty = False
        if self._fd is None:
            return
        rec = {
            "job": self.job,
            "state": state,
            "inside": self.inside,
            "inside_index": self.inside_index,
            "sized": self.sized,
            "total": self.total,
            "world_total": self.world_total,
            "counts": dict(self.counts),  # a copy: the watchdog thread may write while it grows
            "step": self.step,
            # When the job's code started (Note [Started ranks] in paracheck.world._watch).
            "began_ns": self.began_ns,
        }
        data = json.dumps(rec, separators=(",", ":")).encode()
        os.pwrite(self._fd, data.ljust(_RECORD)[:_RECORD], 0)


def read_status(path: str) -> dict | None:
    """The last status record a rank wrote (None if there is none, or it is being rewritten)."""
    try:
        with open(path, "rb") as f:
            data = f.read(_RECORD)
        return json.loads(data.rstrip(b" \x00").decode())
    except (OSError, ValueError):
        return None


_INSTALLED: CollectiveCounter | None = None  # this rank's counter, once install() ran


def set_step(step: int) -> None:
    """Say that this rank's job has reached training step ``step``: a rank that exceeds its memory
    cap is reported at the step in which it did (Note [Rank memory cap] in
    ``paracheck.world._memory``). Does nothing outside a ``World``'s rank."""
    if _INSTALLED is not None:
        if _INSTALLED.on_step is not None:
            _INSTALLED.on_step(step)
        _INSTALLED.step = step


def install(counter: CollectiveCounter) -> None:
    """Wrap ``torch.distributed``'s collectives and ``Work.wait`` so that they report to ``counter``."""
    global _INSTALLED
    import torch.distributed as dist

    _INSTALLED = counter
    for name in COUNTED:
        fn = getattr(dist, name, None)
        if fn is None or getattr(fn, "_paracheck_counted", False):
            continue
        setattr(dist, name, _wrap(counter, name, fn))
    try:
        from torch._C._distributed_c10d import Work

        original_wait = Work.wait

        def wait(self, *args, **kwargs):
            # Inside a counted collective (a synchronous one waits on its own Work) the collective
            # is what the rank is in.
            if not counter.active or counter.inside is not None:
                return original_wait(self, *args, **kwargs)
            counter.enter_wait()
            try:
                return original_wait(self, *args, **kwargs)
            finally:
                counter.leave(blocking=False)

        Work.wait = wait  # type: ignore[method-assign]  # patching a method of a C++ class
    except (ImportError, AttributeError, TypeError):  # a torch without c10d's Work: counts only
        pass


def _position(fn, name: str) -> int | None:
    """Where argument ``name`` of ``fn`` may be passed positionally (None: nowhere)."""
    try:
        names = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return None
    return names.index(name) if name in names else None


def _size(name: str, args, kwargs) -> list | None:
    """A SIZED collective's tensor as [numel, dtype], with the root rank for a broadcast or a
    reduce ([numel, dtype, root]; ranks that name different roots wait for each other); None for
    the others, or no tensor."""
    if name not in SIZED:
        return None
    import torch

    t = args[0] if args else kwargs.get("tensor")
    if not torch.is_tensor(t):
        return None
    out = [t.numel(), str(t.dtype).removeprefix("torch.")]
    if name in ("broadcast", "reduce"):
        root = args[1] if len(args) > 1 else kwargs.get("src", kwargs.get("dst"))
        if isinstance(root, int):
            out.append(root)
    return out


def _wrap(counter: CollectiveCounter, name: str, fn):
    import functools

    import torch.distributed as dist

    pos = _position(fn, "group")
    async_pos = _position(fn, "async_op")

    @functools.wraps(fn)
    def counted(*args, **kwargs):
        if not counter.active:
            return fn(*args, **kwargs)
        group = kwargs.get("group", args[pos] if pos is not None and len(args) > pos else None)
        blocking = not kwargs.get(
            "async_op",
            args[async_pos] if async_pos is not None and len(args) > async_pos else False,
        )
        counter.enter(
            name,
            group is None or group is dist.group.WORLD,
            _size(name, args, kwargs),
            blocking=blocking,
        )
        try:
            return fn(*args, **kwargs)
        finally:
            counter.leave(blocking=blocking)

    counted._paracheck_counted = True  # type: ignore[attr-defined]  # a marker on the wrapper
    return counted
