"""Watching a step: ``ScheduleWatch`` records the events of Note [Communication schedule of a
step] (``paracheck.accounting._schedule_model``) while the step runs, riding on a ``Recorder``.

Note [Device syncs counted on the CPU]
    On a GPU a sync is a host call that blocks until the device's queue has drained. The same
    Python-level operations are counted on both devices, so a CPU run shows what a GPU run would:

    * ``aten._local_scalar_dense`` of a device tensor (``.item()``, ``bool(t)``, ``int(t)``,
      ``float(t)``), ``aten.nonzero``, ``aten.masked_select``, ``aten.equal`` and
      ``aten.is_nonzero`` of one (their output's size or value depends on the data);
    * ``Tensor.tolist()``, ``.numpy()`` and ``.cpu()`` of a device tensor (device to host), and
      ``aten.copy_`` between a host and a device tensor without ``non_blocking`` (not the copy
      of ``t[index] = number``, whose number torch makes a device scalar on a GPU, and not what a
      backend copies inside a collective's ``wait``);
    * ``torch.tensor(data, device=...)`` / ``torch.as_tensor(data, device=...)`` from host data:
      a host-to-device copy that is not ``non_blocking`` makes torch synchronise the stream
      (``cudaMemcpyAsync`` then ``cudaStreamSynchronize`` from pageable memory, which
      ``torch.cuda.set_sync_debug_mode`` reports). ``Tensor.to(...)`` between host and device
      (without ``non_blocking``) is counted on a GPU only: on the CPU ``.to(p.device)`` cannot
      be told from ``.to("cpu")``.

    A *device tensor* on a GPU is a CUDA tensor. On the CPU it is a tensor derived from one the
    step is given as device-resident (the model's parameters, buffers and gradients, the batch):
    every output of an operator with a device tensor among its inputs is one, and so is the
    output of a factory operator (``zeros``, ``empty``, ``full``; torch DDP's buckets, made in
    C++). ``torch.tensor`` and ``torch.as_tensor`` decide by their ``device=``: a
    ``torch.device`` (as ``p.device`` gives) makes a device tensor (and, from host data, counts
    as a host-to-device copy), none or a string (``torch.tensor(0.0, device="cpu")``: AdamW's
    step counter, which torch keeps on the host) a host tensor. An in-place operator keeps its
    first argument's side. The one mismatch left: a factory operator called without ``device=``
    makes a host tensor on a GPU and a device tensor here, so reading it back counts on the CPU
    only (no built-in does). What is not counted:
    ``torch.cuda.synchronize()``, event and stream ``synchronize()`` (explicit, and absent from
    every built-in), and syncs inside C++ code (torch DDP's reducer). The GPU test checks the count
    against ``torch.cuda.set_sync_debug_mode("warn")``'s warnings.

"""

from __future__ import annotations

import sys

import torch

from paracheck.accounting._schedule_model import PHASES, ScheduleEvent, StepSchedule

# -- watching a step ----------------------------------------------------------------------------
_SYNC_OPS = frozenset({"_local_scalar_dense", "nonzero", "masked_select", "equal", "is_nonzero"})
_TO_HOST = {
    torch.Tensor.tolist: "tolist",
    torch.Tensor.numpy: "numpy",
    torch.Tensor.cpu: "cpu",
}
_TENSOR_TO = torch.Tensor.to
_FROM_HOST = {torch.tensor: "tensor", torch.as_tensor: "as_tensor"}
_SKIP_PREFIXES: tuple[str, ...] = ()


def _skip_prefixes() -> tuple[str, ...]:
    global _SKIP_PREFIXES
    if not _SKIP_PREFIXES:
        import contextlib
        import functools
        import os
        import weakref

        import paracheck.accounting
        import paracheck.world

        _SKIP_PREFIXES = (
            os.path.dirname(torch.__file__) + os.sep,
            os.path.dirname(paracheck.accounting.__file__) + os.sep,
            os.path.dirname(paracheck.world.__file__) + os.sep,
            weakref.__file__,
            contextlib.__file__,
            functools.__file__,
        )
    return _SKIP_PREFIXES


def _where() -> str:
    """The innermost function of the calling code outside torch, paracheck.accounting and
    paracheck.world (Note [Communication schedule of a step])."""
    prefixes = _skip_prefixes()
    f = sys._getframe(1)
    while f is not None and f.f_code.co_filename.startswith(prefixes):
        f = f.f_back
    if f is None:
        return "?"
    return getattr(f.f_code, "co_qualname", f.f_code.co_name)


def _storage(t):
    try:
        if t.device.type == "meta" or t.layout != torch.strided:
            return None
        return t.untyped_storage()
    except (RuntimeError, NotImplementedError):
        return None


def _target_device(args, kwargs):
    target = kwargs.get("device")
    for a in args[1:]:
        if isinstance(a, (str, torch.device)):
            target = a
        elif isinstance(a, torch.Tensor):
            target = a.device
    return None if target is None else torch.device(target)


def _python_level(watch: ScheduleWatch, original, python_sync):
    """``original`` (a syncing Tensor method or a factory from host data) with the Python-level
    half of Note [Device syncs counted on the CPU]: the event, and what the result is."""
    factory = original in _FROM_HOST

    def wrapper(*args, **kwargs):
        w = watch
        kind = python_sync(original, args, kwargs) if w._recording and not w._inside else None
        if kind is not None:
            w._event("sync", kind, _where())
        w._inside += kind is not None
        w._in_factory += factory
        try:
            out = original(*args, **kwargs)
        finally:
            w._inside -= kind is not None
            w._in_factory -= factory
        if factory and not w._cuda and _names_device(kwargs.get("device")):
            w.mark_device(out)
        return out

    return wrapper


def _names_device(device) -> bool:
    """On the CPU: does a factory's ``device=`` name the step's device? A ``torch.device`` (as
    ``p.device`` gives) does; a string (``"cpu"``, as host-side code spells it) does not."""
    return isinstance(device, torch.device)


class ScheduleWatch:
    """Records one step's schedule (Note [Communication schedule of a step]) through a
    ``Recorder`` it is attached to. Use::

        with Recorder() as rec, ScheduleWatch(rec, params, device_tensors, tokens=T) as watch:
            ...                       # build, warm up: device tensors are followed (CPU)
            watch.start()             # the measured step: events, host calls
            watch.phase = "forward"; ...; watch.phase = "backward"; loss.backward(); ...
            watch.stop()
        schedule = watch.schedule()

    ``params``: the trainable parameters, whose gradients are counted; ``device_tensors``: on
    the CPU, what the step holds on its device from the start (parameters, buffers, the batch:
    Note [Device syncs counted on the CPU]). Enter it inside the recorder."""

    def __init__(self, recorder, params, device_tensors=(), *, tokens: int):
        self.recorder = recorder
        self.params = [p for p in params if p.requires_grad]
        self.tokens = tokens
        self.phase = "forward"
        self.events: list[ScheduleEvent] = []
        self.produced_bytes = 0
        self.produced_elems = 0
        self.host_calls = 0
        self.world_calls = 0
        self._cuda = any(p.is_cuda for p in self.params)
        self._in_factory = 0  # inside a Python-level factory call, which decides itself
        for t in device_tensors:
            self.mark_device(t)
        self._inside = 0  # a Python-level sync is being counted: its operators are not
        # Inside ``t[index] = number``: on a GPU torch makes the number a device scalar, so the
        # CPU's copy of a host scalar into the device tensor is no host-to-device copy.
        self._scalar_setitem = 0
        self._recording = False
        self._nodes: list = []
        self._handles: list = []
        self._saved_wait = None
        self._saved: list[tuple[object, str, object]] = []

    # -- device tensors (CPU) -----------------------------------------------------------------
    def mark_device(self, obj) -> None:
        from paracheck.accounting.record import tensors_in

        for t in tensors_in(obj):
            st = _storage(t)
            if st is not None:
                st._paracheck_on_device = True  # torch keeps a storage's Python object for life

    def is_device(self, t) -> bool:
        if self._cuda:
            return t.is_cuda
        st = _storage(t)
        return st is not None and getattr(st, "_paracheck_on_device", False)

    # -- events ----------------------------------------------------------------------------------
    def _event(self, what: str, kind: str, where: str, **kw) -> None:
        self.events.append(
            ScheduleEvent(
                what, kind, self.phase, self.produced_bytes, self.produced_elems, where, **kw
            )
        )

    def on_operator(self, func, args, kwargs, out, call) -> None:
        """Called by the Recorder after every operator (``call``: its ``CollectiveCall``, None
        where it is not a collective)."""
        from paracheck.accounting.record import tensors_in

        packet = getattr(func, "overloadpacket", None)
        name = getattr(packet, "__name__", str(func)).split(".")[-1]
        if self._recording:
            if call is not None:
                self._event(
                    "collective",
                    call.kind,
                    _where(),
                    payload_bytes=call.payload_bytes,
                    dtype=call.dtype,
                    group_size=call.world_size,
                )
                return
            if name == "wait_tensor":
                self._event("wait", "wait_tensor", _where())
                return
        inputs = list(tensors_in(list(args) + list(kwargs.values())))
        device_in = [self.is_device(t) for t in inputs]
        if self._recording and not self._inside:
            if name in _SYNC_OPS and any(device_in):
                self._event("sync", "item" if name == "_local_scalar_dense" else name, _where())
            elif (
                name == "copy_"
                and len(inputs) >= 2
                and device_in[0] != device_in[1]
                and not kwargs.get("non_blocking", args[2] if len(args) > 2 else False)
                and not (self._scalar_setitem and device_in[0] and inputs[1].dim() == 0)
            ):
                self._event("sync", "to_host" if device_in[1] else "to_device", _where())
        if self._cuda or self._inside:
            return
        # Which outputs are device tensors: see Note [Device syncs counted on the CPU]. A
        # factory operator's are (torch DDP's buckets, made in C++); an in-place operator's
        # output (its first argument) keeps its side.
        if not (any(device_in) or (not inputs and "device" in kwargs and not self._in_factory)):
            return
        ids = {id(st) for st in map(_storage, inputs)}
        for t in tensors_in(out):
            st = _storage(t)
            if st is not None and id(st) not in ids:
                st._paracheck_on_device = True

    def _python_sync(self, func, args, kwargs) -> str | None:
        """The kind of a Python-level sync (Note [Device syncs counted on the CPU]), or None."""
        if func in _TO_HOST:
            t = args[0] if args else None
            return _TO_HOST[func] if isinstance(t, torch.Tensor) and self.is_device(t) else None
        if func in _FROM_HOST:
            device = kwargs.get("device")
            if device is None or not args or isinstance(args[0], torch.Tensor):
                return None
            if self._cuda and torch.device(device).type != "cuda":
                return None
            return "to_device" if self._cuda or _names_device(device) else None
        if func is _TENSOR_TO and self._cuda and args:
            if kwargs.get("non_blocking") or any(a is True for a in args[2:]):
                return None
            target = _target_device(args, kwargs)
            if target is None or target.type == args[0].device.type:
                return None
            return "to_host" if target.type == "cpu" else "to_device"
        return None

    def _counted_wait(self, original):
        watch = self

        def wait(*args, **kwargs):
            if watch._recording:
                watch._event("wait", "work.wait", _where())
            # What a backend does inside the wait (gloo's reduce-scatter copies its result into
            # the output there) is the collective's, not a sync of the step.
            watch._inside += 1
            try:
                return original(*args, **kwargs)
            finally:
                watch._inside -= 1

        return wait

    def _counted_setitem(self, original):
        watch = self

        def setitem(t, index, value):
            scalar = isinstance(value, (bool, int, float, complex))
            watch._scalar_setitem += scalar
            try:
                return original(t, index, value)
            finally:
                watch._scalar_setitem -= scalar

        return setitem

    # -- gradient bytes ----------------------------------------------------------------------------
    def _grad_produced(self, nbytes: int, nelems: int):
        def prehook(grad_outputs):
            self.produced_bytes += nbytes
            self.produced_elems += nelems

        return prehook

    # -- the context -----------------------------------------------------------------------------
    def __enter__(self) -> ScheduleWatch:
        with torch.enable_grad():
            for p in self.params:
                # The AccumulateGrad node of a leaf, held so that torch keeps using this node.
                node = p.view_as(p).grad_fn.next_functions[0][0]
                self._nodes.append(node)
                self._handles.append(
                    node.register_prehook(
                        self._grad_produced(p.numel() * p.element_size(), p.numel())
                    )
                )
        work = _work_class()
        if work is not None:
            self._saved_wait = work.wait
            work.wait = self._counted_wait(work.wait)
        self._saved_streams = {
            n: getattr(torch.cuda.Stream, n) for n in ("wait_stream", "wait_event")
        }
        for n, f in self._saved_streams.items():
            setattr(torch.cuda.Stream, n, self._counted_stream_wait(n, f))
        for owner, originals in ((torch.Tensor, _TO_HOST), (torch, _FROM_HOST)):
            for f, name in originals.items():
                self._saved.append((owner, name, owner.__dict__.get(name, _MISSING)))
                setattr(owner, name, _python_level(self, f, self._python_sync))
        self._saved.append(
            (torch.Tensor, "__setitem__", torch.Tensor.__dict__.get("__setitem__", _MISSING))
        )
        torch.Tensor.__setitem__ = self._counted_setitem(torch.Tensor.__setitem__)
        if self._cuda:
            self._saved.append((torch.Tensor, "to", torch.Tensor.__dict__.get("to", _MISSING)))
            torch.Tensor.to = _python_level(self, torch.Tensor.to, self._python_sync)
        self.recorder.observer = self
        return self

    def _counted_stream_wait(self, kind: str, original):
        watch = self

        def wait(*args, **kwargs):
            if watch._recording:
                watch._event("wait", kind, _where())
            return original(*args, **kwargs)

        return wait

    def __exit__(self, *exc):
        self.stop()
        self.recorder.observer = None
        for owner, name, original in reversed(self._saved):
            if original is _MISSING:
                delattr(owner, name)
            else:
                setattr(owner, name, original)
        self._saved = []
        for n, f in self._saved_streams.items():
            setattr(torch.cuda.Stream, n, f)
        work = _work_class()
        if work is not None and self._saved_wait is not None:
            work.wait = self._saved_wait
        for h in self._handles:
            h.remove()
        self._handles, self._nodes = [], []
        return False

    def start(self) -> None:
        """Forget everything so far and record from here (the measured step)."""
        self.events = []
        self.produced_bytes = self.produced_elems = 0
        self.host_calls = self.world_calls = 0
        self.phase = "forward"
        self.resume()

    def resume(self) -> None:
        """Record again after ``stop()``, keeping what was recorded."""
        if not self._recording:
            self._recording = True
            _start_counting_calls(self)

    def stop(self) -> None:
        """Stop recording (``resume()`` goes on)."""
        if self._recording:
            _stop_counting_calls()
            self._recording = False

    def mark(self, phase: str) -> None:
        """The step enters ``phase`` (one of ``PHASES``)."""
        if phase not in PHASES:
            raise ValueError(f"phase={phase!r} must be one of {PHASES}")
        self.phase = phase

    def schedule(self) -> StepSchedule:
        return StepSchedule(
            tuple(self.events),
            self.produced_bytes,
            self.produced_elems,
            self.tokens,
            self.host_calls,
            self.world_calls,
        )


_MISSING = object()


def _work_class():
    try:
        from torch._C._distributed_c10d import Work

        return Work
    except ImportError:
        return None


# Note [Host calls per step]
#     The Python functions and C functions the step's own code calls (``sys.setprofile``'s
#     ``call`` and ``c_call`` events on the thread that runs the step, which on the CPU also runs
#     backward and its hooks): wrappers around collectives, hooks, bookkeeping per parameter or
#     per collective. The measuring code's own calls are left out: everything under the
#     recorder's ``__torch_dispatch__`` and its storage finalisers, and this module's code (its
#     wrappers pass through: what the function they wrap calls is counted, the call itself once,
#     where the step's code made it). A count does not move with the load on the
#     machine; it moves with every call a change adds per step. ``world_calls`` is the part made
#     inside ``paracheck.world``'s wrappers of the collectives and ``Work.wait`` (Note [Two ways of
#     watching collectives]): what the harness adds to every collective. CPU only: on a GPU, backward
#     runs on torch's device threads, which ``sys.setprofile`` does not reach; the count is 0.
def _start_counting_calls(watch: ScheduleWatch) -> None:
    if watch._cuda:
        return
    import weakref

    from paracheck.accounting.record import Recorder

    here = __file__
    # Pass-through code: the wrappers call what they wrap.
    through = {
        c
        for f in (ScheduleWatch._counted_wait, ScheduleWatch._counted_stream_wait, _python_level)
        for c in f.__code__.co_consts
        if hasattr(c, "co_code")
    }
    skip = {
        Recorder.__torch_dispatch__.__code__,
        Recorder._free.__code__,
        weakref.finalize.__call__.__code__,
    }
    skipped: list = []  # frames whose calls are the measuring code's
    world: list = []  # frames of paracheck.world's wrappers (counted, and in world_calls too)
    world_dir = _skip_prefixes()[2]

    def profile(frame, event, arg):
        if event == "call":
            code = frame.f_code
            if code in through and not skipped:
                watch.host_calls += 1  # the step's call of what the wrapper wraps
                watch.world_calls += bool(world)
                return
            if skipped or code in skip or code.co_filename == here:
                skipped.append(frame)
                return
            watch.host_calls += 1
            if world or code.co_filename.startswith(world_dir):
                world.append(frame)
                watch.world_calls += 1
        elif event == "return":
            if skipped and skipped[-1] is frame:
                skipped.pop()
            elif world and world[-1] is frame:
                world.pop()
        elif event == "c_call" and not skipped and frame.f_code not in through:
            watch.host_calls += 1
            watch.world_calls += bool(world)

    _profiled.append(sys.getprofile())
    sys.setprofile(profile)


_profiled: list = []


def _stop_counting_calls() -> None:
    if _profiled:
        sys.setprofile(_profiled.pop())
