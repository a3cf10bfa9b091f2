"""Launching a step's asynchronous collectives from a thread of their own, on NCCL.

Note [Launching off the autograd thread]
    A DDP that overlaps communication with backward launches its collectives from gradient hooks,
    on the thread that also launches backward's kernels, and on a GPU a step of a small or
    medium model is close to host-bound: every microsecond a hook spends is one the GPU may wait
    for. Most of a launch's host time is inside the process group (NCCL's enqueue, its events,
    its work record), C++ that runs without the GIL: on 2x H200, xl LM, 243 all-reduces per
    step, backward's host time was 101 ms with the launches in the hooks against 80 ms with them
    handed to one other thread (torch DDP's C++ reducer: 73 ms; ``docs/measurements.md``).
    So where it pays, a hook hands the launch to ``Launcher``, one daemon thread per process
    that makes the calls in the order they were queued (so every rank still launches its
    collectives in the same order), with the CUDA stream that was current in the hook made
    current first: the collective then waits for every kernel queued on that stream before its
    launch, the gradient it reduces among them (it may also wait for a few kernels queued after
    the hook: the order is kept, the overlap barely changes). Before anything reads a result,
    the wrapper takes the work handle from ``Pending.work()``, which waits for that launch and
    re-raises what it raised. ``BucketedDDP`` queues its copies into a bucket the same way, ahead
    of the bucket's launch (292 copies per xl step: 9 ms of the hooks' host time).

    Collectives launched on two threads are ordered only where one waits for the other, and every
    rank must issue them in the same order: so a wrapper that also issues collectives from the
    calling thread (Zero1's presence flags and all-gathers) first ``drain()``s the launcher, and
    every launch queued in a backward pass has been made by the time that backward returns (the
    round's end-of-backward callback drains or waits for them), so that a collective of the
    user's own between ``backward()`` and the synchronisation meets the same order on every rank
    as it does with launches in the hooks.

    Launches stay on the calling thread (``launcher_for`` returns None) unless the tensors are
    CUDA tensors of an NCCL group: gloo's launches are cheap and its collectives run on its own
    threads anyway. They stay there too while a dispatch or function mode is active
    (paracheck's ``Recorder``, a profiler's), so that the mode sees each collective where the
    hook asked for it, in the thread whose modes it is: the exact schedule of a step
    (``paracheck.accounting``) is recorded with launches in the hooks on every device.
"""

from __future__ import annotations

import os
import queue
import threading

import torch

__all__ = [
    "Launcher",
    "Pending",
    "drain",
    "launch",
    "launcher_for",
    "on_nccl",
    "uses_launcher",
    "watched",
]

# A switch, so that benchmarks can time the launches in the hooks beside it.
ENABLED = True
# For tests: the thread on any tensors and group (gloo on the CPU), modes or not.
FORCE = False


def _no_stream():
    return None


def _current_stream() -> tuple[int, int, int]:
    """The current CUDA stream of the current device as ``(stream_id, device_index,
    device_type)``: what ``torch.cuda.current_stream()`` reads, without building a ``Stream``
    (a hook pays this once per launch it queues)."""
    return torch._C._cuda_getCurrentStream(torch._C._cuda_getDevice())


def _make_current(stream: tuple[int, int, int]) -> None:
    """Make ``stream`` (as ``_current_stream`` gives it) this thread's device and stream."""
    stream_id, device_index, device_type = stream
    torch._C._cuda_setDevice(device_index)
    torch._C._cuda_setStream(
        stream_id=stream_id, device_index=device_index, device_type=device_type
    )


class Pending:
    """One queued launch: ``work()`` waits for it and returns what the call returned."""

    __slots__ = ("_done", "_error", "_launcher", "_value")

    def __init__(self, launcher: Launcher):
        self._launcher = launcher
        self._done = False
        self._value = None
        self._error: BaseException | None = None

    @property
    def launched(self) -> bool:
        """Whether the call has been made (it may have raised)."""
        return self._done

    def work(self):
        if not self._done:
            self._launcher.wait_for(self)
        if self._error is not None:
            raise self._error
        return self._value

    def wait(self):
        """``work().wait()``: the handle's own wait, where the call returned one."""
        w = self.work()
        return None if w is None else w.wait()


class Launcher:
    """One daemon thread making the calls queued by ``submit``, in order (Note [Launching off
    the autograd thread])."""

    def __init__(self):
        self.pid = os.getpid()
        # The stream current in the caller, made current in the thread (none without CUDA).
        self._stream = _current_stream if torch.cuda.is_available() else _no_stream
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._last: Pending | None = None
        self._done = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="paracheck-launcher", daemon=True)
        self._thread.start()

    def submit(self, fn, *args, **kwargs) -> Pending:
        pending = Pending(self)
        self._last = pending
        self._queue.put((pending, self._stream(), fn, args, kwargs))
        return pending

    def drain(self) -> None:
        """Wait until every call queued so far has been made (not completed: launched)."""
        last = self._last
        if last is not None and not last._done:
            self.wait_for(last)

    def wait_for(self, pending: Pending) -> None:
        with self._done:
            while not pending._done:
                # Woken by the thread; the timeout keeps the wait interruptible (a World stops a
                # job by raising in its thread, which a lock held forever would never let in).
                self._done.wait(0.05)

    def _run(self) -> None:
        current = None
        while True:
            pending, stream, fn, args, kwargs = self._queue.get()
            try:
                if stream is not None and stream != current:
                    _make_current(stream)
                    current = stream
                pending._value = fn(*args, **kwargs)
            except BaseException as e:  # handed to the waiter, which raises it
                pending._error = e
            with self._done:
                pending._done = True
                self._done.notify_all()


_LAUNCHER: Launcher | None = None
_LOCK = threading.Lock()


def _launcher() -> Launcher:
    global _LAUNCHER
    launcher = _LAUNCHER
    if launcher is None or launcher.pid != os.getpid():  # none yet, or one of a parent (fork)
        with _LOCK:
            if _LAUNCHER is None or _LAUNCHER.pid != os.getpid():
                _LAUNCHER = Launcher()
            launcher = _LAUNCHER
    return launcher


def on_nccl(tensor: torch.Tensor, process_group) -> bool:
    """Whether ``tensor`` is a CUDA tensor and ``process_group`` an NCCL group."""
    import torch.distributed as dist

    if not (tensor.is_cuda and dist.is_initialized()):
        return False
    try:
        return dist.get_backend(process_group) == "nccl"
    except (RuntimeError, ValueError):
        return False


def uses_launcher(tensor: torch.Tensor, process_group) -> bool:
    """Whether launches for ``tensor`` on ``process_group`` may go to the launcher thread: CUDA
    tensors on an NCCL group (decided once, by a wrapper's constructor)."""
    return FORCE or (ENABLED and on_nccl(tensor, process_group))


def watched() -> bool:
    """Whether a dispatch or function mode is active (a recorder, a profiler's): launches then
    stay where they are asked for (Note [Launching off the autograd thread])."""
    return bool(torch._C._len_torch_dispatch_stack() or torch._C._is_torch_function_mode_enabled())


def launcher_for(enabled: bool) -> Launcher | None:
    """The launcher for this launch, or None to launch on the calling thread: ``enabled`` (see
    ``uses_launcher``) and nothing ``watched()``."""
    if FORCE:
        return _launcher()
    if not enabled or not ENABLED or watched():
        return None
    return _launcher()


def launch(enabled: bool, fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` on the launcher thread where ``launcher_for(enabled)`` gives one
    (a ``Pending``, whose ``wait()`` waits for the launch, then for the work), else here."""
    launcher = launcher_for(enabled)
    if launcher is None:
        return fn(*args, **kwargs)
    return launcher.submit(fn, *args, **kwargs)


def drain() -> None:
    """Wait until every launch queued in this process has been made (none queued: no wait)."""
    launcher = _LAUNCHER
    if launcher is not None and launcher.pid == os.getpid():
        launcher.drain()
