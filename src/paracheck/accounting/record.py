"""Exact, noise-free accounting of what a rank does: collectives issued and tensor bytes live.

``Recorder`` is a ``TorchDispatchMode``: every aten and c10d operator dispatched while it is
active passes through it, whoever calls it (paracheck's variants, torch DDP's C++ reducer,
``ZeroRedundancyOptimizer``, a user's class, even code that did ``from torch.distributed import
all_reduce`` long before). So it needs no cooperation from the code it measures and no patched
``torch.distributed`` functions. It is the one recorder: the benchmarks read its calls and memory
(``paracheck.bench.step``), the check reads one payload size per call through
``paracheck.accounting.traffic.record_collectives``, and a ``ScheduleWatch``
(``paracheck.accounting.schedule``) set as its ``observer`` sees every operator to place each
collective in the step.

Note [Two ways of watching collectives]
    ``paracheck.world`` also wraps the ``torch.distributed`` namespace in every rank, for liveness,
    not accounting: for the whole of every job it says which collective a rank is *inside* (the
    wait of a synchronous call included) while it hangs, which a dispatch mode cannot (it sees an
    operator as it is issued and nothing of ``Work.wait``), and it costs nothing per tensor
    operator. It wraps once, at rank start, so names bound later go through it too, but it cannot
    see collectives issued from C++ (torch DDP's reducer) or merged by torch (a coalesced group).
    The recorder here sees every dispatched operator with its tensors, but only inside the blocks
    it measures. Neither needs the other.

Note [Exact quantities]
    Timings on a shared 2-core machine move by tens of percent between identical runs; these do
    not move at all, which is why the merge gate fails on *any* increase of them:

    * collectives per step, by kind (all_reduce, broadcast, all_gather, reduce_scatter, ...);
    * payload bytes per step: the message size of each collective (the buffer of an all-reduce or
      broadcast, the full gathered output of an all-gather, the full input of a reduce-scatter);
    * bus bytes per step: the payloads costed by Note [Bus bytes] in
      ``paracheck.accounting.cost`` (nccl-tests' convention: all-reduce 2(W-1)/W x size,
      all-gather and reduce-scatter (W-1)/W x size, broadcast 1 x size). With it ZeRO-1's
      reduce-scatter + all-gather costs exactly one all-reduce;
    * live and peak tensor bytes: the sum of the sizes of the tensor storages allocated under the
      recorder that are still referenced. Frees are seen the moment the last reference goes
      (a finaliser on the storage's Python object, which torch keeps for the storage's whole
      life), so the peak is exact at operator granularity and does not depend on the allocator,
      the OS or other processes. Workspace an operator frees before it returns is not seen, nor
      are buffers that gloo/NCCL allocate outside torch's dispatcher.

    Python's cyclic garbage collector frees cycles at moments that depend on the process's
    history; a ``Recorder`` that tracks memory therefore collects before it starts and disables
    the collector while it is active (restored on exit), so the same code gives the same peak in
    any process.

Note [Host cost per step]
    What a step costs the host, counted rather than timed (a count does not move with the load on
    the machine, so the gate holds it like bytes):

    * operators: every operator dispatched (aten and c10d), views included: each is one pass
      through the dispatcher;
    * launches: the operators that do work on the data: not views (``OpOverload.is_view``), not
      the allocation-only factories (``empty``, ``empty_like``, ``empty_strided``, ``new_empty``,
      ``new_empty_strided``), not collectives (counted on their own). On a GPU each is at least
      one kernel launch; on the CPU it is a kernel called. An operator that launches several
      kernels inside (a fused optimizer's multi-tensor apply) counts once: the count is of host
      work, which is what a launch costs the host;
    * allocations: tensor storages created (the storages behind ``live_bytes``);
    * hooks: Python hooks torch calls back during the step (``count_hooks``): tensor hooks
      (``register_hook``, ``register_post_accumulate_grad_hook``), module forward and backward
      hooks, and callbacks queued on the autograd engine. torch DDP's reducer hooks are C++ and
      are not counted: the count is of Python the step runs per parameter or bucket.

    All four are per rank and per steady-state step, the largest over ranks.

Note [Late frees after a collective]
    A tensor given to a gloo collective is also referenced by the collective's work object, and
    gloo's worker thread drops that reference a moment *after* ``wait()`` has returned. A
    temporary buffer (the flat buffer of a broadcast_coalesced in torch DDP's constructor,
    FlatDDP's flat gradients) therefore dies at a moment that races with the allocations that
    follow, and the peak would depend on thread scheduling (measured: torch DDP's construction
    peak read 8.4 MB or 12.6 MB for the same code). So before the first operator after a
    collective, the recorder sleeps in 1 ms steps until no storage has been freed for two
    steps in a row (at most 50 ms): the worker thread, runnable as soon as the collective
    completed, gets the core while the main thread sleeps. A race that survives this shows up as
    a quantity that differs between two readings, which the gate reports as UNSTABLE.
"""

from __future__ import annotations

import gc
import time
import weakref
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from paracheck.accounting.cost import bus_bytes

__all__ = [
    "COLLECTIVE_KINDS",
    "CONTROL_REDUCE_OPS",
    "CollectiveCall",
    "HookCounter",
    "Recorder",
    "count_hooks",
]

# c10d (torch.distributed) and _c10d_functional operator names -> kind.
_C10D_KINDS = {
    "allreduce_": "all_reduce",
    "allreduce_coalesced_": "all_reduce",
    "all_reduce": "all_reduce",
    "all_reduce_": "all_reduce",
    "all_reduce_coalesced": "all_reduce",
    "all_reduce_coalesced_": "all_reduce",
    "broadcast_": "broadcast",
    "broadcast": "broadcast",
    "allgather_": "all_gather",
    "_allgather_base_": "all_gather",
    "allgather_coalesced_": "all_gather",
    "allgather_into_tensor_coalesced_": "all_gather",
    "all_gather_into_tensor": "all_gather",
    "all_gather_into_tensor_coalesced": "all_gather",
    "all_gather_into_tensor_out": "all_gather",
    "reduce_scatter_": "reduce_scatter",
    "_reduce_scatter_base_": "reduce_scatter",
    "reduce_scatter_tensor_coalesced_": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "reduce_scatter_tensor_out": "reduce_scatter",
    "reduce_": "reduce",
    "gather_": "gather",
    "scatter_": "scatter",
    "alltoall_": "all_to_all",
    "alltoall_base_": "all_to_all",
    "all_to_all_single": "all_to_all",
    "send": "send",
    "isend": "send",
    "recv_": "recv",
    "irecv": "recv",
    "recv_any_source_": "recv",
    "barrier": "barrier",
    "monitored_barrier_": "barrier",
}
COLLECTIVE_KINDS = tuple(sorted(set(_C10D_KINDS.values())))
# c10d's ReduceOp::RedOpType values, as a boxed ReduceOp's op() returns them.
_REDUCE_OPS = ("sum", "avg", "product", "min", "max", "band", "bor", "bxor", "premul_sum")
CONTROL_REDUCE_OPS = frozenset({"product", "min", "max", "band", "bor", "bxor"})
# Kinds whose message size is the larger of (output, input): the full tensor, not one shard.
_SHARDED_KINDS = {"all_gather", "reduce_scatter", "gather", "scatter"}


@dataclass(frozen=True)
class CollectiveCall:
    """One collective operator as dispatched: its kind, the operator, its message size in bytes
    (Note [Exact quantities]), the size of its process group, and the group itself (None where
    this torch cannot say which)."""

    kind: str
    op: str
    payload_bytes: int
    world_size: int
    group: object = field(default=None, compare=False, repr=False)
    # The payload's element type ("float32"; "" where it holds no tensor).
    dtype: str = field(default="", compare=False)
    # A reducing collective's operation ("sum", "avg", "max", ...; "" where none or unknown).
    reduce_op: str = field(default="", compare=False)

    @property
    def is_control(self) -> bool:
        """A reduction by max, min, product or a bitwise operation: it cannot average gradients,
        so it carries an agreement between the ranks (a flag, an overflow, a count)."""
        return self.reduce_op in CONTROL_REDUCE_OPS

    @property
    def bus_bytes(self) -> float:
        return bus_bytes(self.kind, self.payload_bytes, self.world_size)


# Operators that allocate and compute nothing (Note [Host cost per step]).
_ALLOCATION_ONLY = frozenset(
    {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"}
)


def collective_kind(func) -> str | None:
    """The kind (``COLLECTIVE_KINDS``) of a dispatched operator, or None where it is not a c10d or
    functional collective."""
    if getattr(func, "namespace", "") not in ("c10d", "_c10d_functional", "c10d_functional"):
        return None
    return _C10D_KINDS.get(_op_name(func))


def _op_name(func) -> str:
    packet = getattr(func, "overloadpacket", None)
    return getattr(packet, "__name__", str(func)).split(".")[-1]


def tensors_in(obj):
    """Every tensor in ``obj`` (a tensor, or lists and tuples of them, nested)."""
    return _tensors(obj)


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            yield from _tensors(o)


def _nbytes(obj) -> int:
    return sum(t.numel() * t.element_size() for t in _tensors(obj))


def _process_group(args, kwargs):
    """The process group a c10d operator was given, or None. The dispatcher passes it boxed as a
    ``torch.ScriptObject`` (no methods of its own); ``ProcessGroup.unbox`` gives back the very
    object ``torch.distributed`` handed out (``dist.group.WORLD``, ``new_group()``'s result)."""
    import torch.distributed as dist

    pg_type = getattr(dist, "ProcessGroup", None)
    if pg_type is None:
        return None
    unbox = getattr(pg_type, "unbox", None)
    for a in (*args, *kwargs.values()):
        if isinstance(a, pg_type):
            return a
        if unbox is not None and isinstance(a, torch.ScriptObject):
            try:
                return unbox(a)
            except (RuntimeError, TypeError):  # another boxed class (a ReduceOp)
                continue
    return None


def _reduce_op(args, kwargs) -> str:
    """The operation of a reducing c10d operator: a boxed ``ReduceOp`` (whose ``op()`` is its
    RedOpType) or, for the functional collectives, its name as a string; "" where there is none."""
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.ScriptObject):
            try:
                if "ReduceOp" not in a._type().qualified_name():
                    continue
                code = int(a.op())
            except (RuntimeError, AttributeError, TypeError):
                continue
            return _REDUCE_OPS[code] if 0 <= code < len(_REDUCE_OPS) else ""
        if isinstance(a, str) and a.lower() in _REDUCE_OPS:
            return a.lower()
    return ""


def _group_size(group) -> int:
    import torch.distributed as dist

    if group is not None:
        return int(group.size())
    return dist.get_world_size() if dist.is_initialized() else 1


def _storage_key(t: torch.Tensor):
    # A DTensor (torch FSDP2's parameters and their optimizer state) holds its shard in
    # ``_local_tensor``; its own storage describes the whole tensor.
    t = getattr(t, "_local_tensor", t)
    try:
        if t.device.type == "meta" or t.layout != torch.strided:
            return None
        st = t.untyped_storage()
        return st._cdata, st
    except (RuntimeError, NotImplementedError):
        return None


class Recorder(TorchDispatchMode):
    """Records every collective and tracks live/peak tensor bytes while active (a context manager).

    ``calls`` lists the ``CollectiveCall``s since the last ``reset_calls()``; ``live_bytes`` and
    ``peak_bytes`` are the storage bytes allocated under the recorder and still referenced, and
    their maximum since the last ``reset_peak()``. See Note [Exact quantities]. Not thread-safe
    beyond what autograd's own threads need (finalisers only subtract).

    ``track_memory=False`` records the collectives only: no per-operator storage bookkeeping, no
    garbage collection on entry, no settling after a collective (what the check's per-call
    payload records need, at a fraction of the cost).
    """

    # Whether Dynamo may compile under the recorder (Note [Recording compiled code] in
    # paracheck.check.ranks._compiled): set while a compiled case runs.
    compiled_code = False

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return cls.compiled_code

    def __init__(self, *, track_memory: bool = True):
        super().__init__()
        self.track_memory = track_memory
        self.calls: list[CollectiveCall] = []
        self.live_bytes = 0
        self.peak_bytes = 0
        self._live: dict[int, int] = {}
        self._gc_was_enabled = False
        self._frees = 0
        self._after_collective = False
        # Note [Host cost per step]; reset with reset_calls().
        self.operators = 0
        self.launches = 0
        self.allocations = 0
        # A ScheduleWatch (paracheck.accounting.schedule) told of every operator.
        self.observer = None

    # -- context --------------------------------------------------------------------------
    def __enter__(self):
        if self.track_memory:
            gc.collect()
            self._gc_was_enabled = gc.isenabled()
            gc.disable()
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            if self._gc_was_enabled:
                gc.enable()

    # -- queries --------------------------------------------------------------------------
    def reset_calls(self) -> None:
        """Forget the collectives and the host-cost counts recorded so far."""
        self.calls = []
        self.operators = self.launches = self.allocations = 0

    def reset_peak(self) -> None:
        self.peak_bytes = self.live_bytes

    def storage_bytes(self, tensors) -> int:
        """Bytes of the distinct storages behind ``tensors`` (views and shared buffers once)."""
        seen: dict[int, int] = {}
        for t in tensors:
            if t is None:
                continue
            key = _storage_key(t)
            if key is not None:
                seen[key[0]] = key[1].nbytes()
        return sum(seen.values())

    # -- the mode -------------------------------------------------------------------------
    def settle(self, *, quiet_steps: int = 2, limit_s: float = 0.05) -> None:
        """Sleep until no storage was freed for ``quiet_steps`` 1 ms steps in a row (at most
        ``limit_s``); see Note [Late frees after a collective]."""
        deadline = time.monotonic() + limit_s
        quiet = 0
        while quiet < quiet_steps and time.monotonic() < deadline:
            before = self._frees
            time.sleep(0.001)
            quiet = quiet + 1 if self._frees == before else 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self._after_collective and self.track_memory:
            self._after_collective = False
            self.settle()
        kind = collective_kind(func)
        self.operators += 1
        if kind is not None:
            self._after_collective = True
        elif not getattr(func, "is_view", False) and _op_name(func) not in _ALLOCATION_ONLY:
            self.launches += 1
        out = self._run(func, args, kwargs)
        if kind is not None:
            if kind in _SHARDED_KINDS:
                # The full tensor is whichever side is largest: an argument of the c10d
                # operators, the result of the functional ones (given the shard and the size).
                payload = max(_nbytes(a) for a in (*args, *kwargs.values(), out))
            else:
                payload = _nbytes(args[0]) if args else 0
            group = _process_group(args, kwargs)
            first = next(iter(_tensors(args[0] if args else ())), None)
            dtype = "" if first is None else str(first.dtype).removeprefix("torch.")
            self.calls.append(
                CollectiveCall(
                    kind,
                    f"{getattr(func, 'namespace', '')}.{_op_name(func)}",
                    payload,
                    _group_size(group),
                    group,
                    dtype,
                    _reduce_op(args, kwargs)
                    if kind in ("all_reduce", "reduce", "reduce_scatter")
                    else "",
                )
            )
        if self.observer is not None:
            self.observer.on_operator(func, args, kwargs, out, self.calls[-1] if kind else None)
        return out

    def _run(self, func, args, kwargs):
        if not self.track_memory:
            return func(*args, **kwargs)
        inputs = {
            k[0]
            for k in map(_storage_key, _tensors(list(args) + list(kwargs.values())))
            if k is not None
        }
        out = func(*args, **kwargs)
        for t in _tensors(out):
            key = _storage_key(t)
            if key is None:
                continue
            cdata, st = key
            nbytes = st.nbytes()
            if cdata in self._live:
                # An in-place resize_ may have grown a storage we already count.
                self.live_bytes += nbytes - self._live[cdata]
                self._live[cdata] = nbytes
            elif cdata not in inputs:
                self.allocations += 1
                self._live[cdata] = nbytes
                self.live_bytes += nbytes
                weakref.finalize(st, self._free, cdata).atexit = False
            self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        return out

    def _free(self, cdata: int) -> None:
        self.live_bytes -= self._live.pop(cdata, 0)
        self._frees += 1


class HookCounter:
    """The Python hooks torch called back while ``count_hooks()`` was active (Note [Host cost per
    step]): ``calls``, reset with ``reset()``."""

    def __init__(self):
        self.calls = 0

    def reset(self) -> None:
        self.calls = 0

    def wrap(self, fn):
        def counted(*args, **kwargs):
            self.calls += 1
            return fn(*args, **kwargs)

        return counted


_HOOK_METHODS = (
    (torch.Tensor, "register_hook"),
    (torch.Tensor, "register_post_accumulate_grad_hook"),
    (torch.nn.Module, "register_forward_pre_hook"),
    (torch.nn.Module, "register_forward_hook"),
    (torch.nn.Module, "register_full_backward_pre_hook"),
    (torch.nn.Module, "register_full_backward_hook"),
    (torch.nn.Module, "register_backward_hook"),
)


class _CountingEngine:
    """The autograd engine, with ``queue_callback`` counted; everything else is the engine's."""

    def __init__(self, engine, counter: HookCounter):
        self._engine = engine
        self._counter = counter

    def queue_callback(self, fn):
        return self._engine.queue_callback(self._counter.wrap(fn))

    def __getattr__(self, name):
        return getattr(self._engine, name)


class count_hooks:
    """Context manager: every hook registered through the methods of Note [Host cost per step]
    while it is active (and every callback queued on the autograd engine) is counted each time
    torch calls it; yields the ``HookCounter``. Hooks registered before entering are not counted:
    enter it before building the model and the design."""

    def __enter__(self) -> HookCounter:
        self.counter = counter = HookCounter()
        self._saved = []
        for cls, name in _HOOK_METHODS:
            original = cls.__dict__.get(name)
            if original is None:
                continue

            def register(self_, hook, *args, _original=original, **kwargs):
                return _original(self_, counter.wrap(hook), *args, **kwargs)

            self._saved.append((cls, name, original))
            setattr(cls, name, register)
        variable = torch.autograd.Variable
        self._engine = variable._execution_engine
        variable._execution_engine = _CountingEngine(self._engine, counter)
        return counter

    def __exit__(self, *exc):
        torch.autograd.Variable._execution_engine = self._engine
        for cls, name, original in self._saved:
            setattr(cls, name, original)
        return False
