"""FSDP: fully sharded data parallelism (ZeRO-3) in the teaching style of ``paracheck.ddp``.

Every trainable parameter of two or more dimensions (linear and embedding weights) is sharded:
rank r keeps only its 1-D chunk of the flattened, zero-padded tensor, and the module holds that
chunk as the parameter (an optimizer built over ``fsdp.parameters()`` steps shards). Other
parameters (biases, norm weights) are replicated and all-reduced, as in DDP.

Note [FSDP data flow]
    Layout: parameter i of ``numel`` elements is padded to ``W * c`` (``c = ceil(numel / W)``) and
    rank r holds elements ``[r * c, (r + 1) * c)`` (``shard_range``); the padding is zero and its
    gradient is zero, so it stays zero under SGD, Adam and AdamW.

    Forward: a forward pre-hook on each module that owns sharded parameters all-gathers them
    (``_Gather``, an autograd function) and puts the full tensor in the module's ``__dict__``, where
    attribute lookup finds it before the shard registered in ``_parameters``; the post-hook removes
    it. What the module's operations save for backward is packed by a saved-tensors hook: a tensor
    on a gathered parameter's storage is kept as (parameter, view), not as memory, so the full
    tensor is freed when the module's forward returns. Without prefetch at most one module's full
    parameters are alive at a time (Note [Prefetching the next modules]).

    Backward: unpacking such a saved tensor all-gathers the parameter again; ``_Gather``'s backward
    adds the full gradient of that use to the parameter's local sum, and at its last use (the
    forward counted the uses: a tied weight has two) reduce-scatters the sum (summed over ranks,
    divided by W) into the shard's gradient, which autograd accumulates (a second backward adds):
    one reduce-scatter per parameter and synchronised backward, a tied weight's included. Inside
    ``no_sync()`` the full gradient is kept locally instead and added to the next synchronised one.
    ``finish_gradient_synchronization()`` reduce-scatters what ``no_sync()`` still holds and
    all-reduces the replicated parameters' gradients (and divides by W).

    Every rank must run the same modules in the same order: each call of a sharded module is a
    collective.

Note [A module reads its children's parameters]
    A module that owns parameters itself may read a child's parameters without calling the
    child: ``nn.MultiheadAttention`` passes ``out_proj.weight`` to ``F.linear`` and never calls
    ``out_proj``, whose own hook would then never gather it (the 1-D shard reached a matrix
    product). So the parameters of a module whose parent owns a sharded parameter itself are
    gathered and released by the parent's call, with the parent's own (``gather_units``). A
    module whose parent shards nothing of its own (a ``Linear`` in a ``Sequential`` or
    ``ModuleList``, or under a root that owns only a frozen vector) is its own unit: the
    generated models' units are their layers. Within a unit each parameter is gathered once and
    the one full tensor set on every module of the unit that owns it.

Note [Prefetching the next modules]
    With ``prefetch=k`` a module's pre-hook, after gathering its own parameters, issues
    asynchronous all-gathers of the next k module calls' parameters in the order the previous
    forward called them (the first forward, with no order yet, prefetches nothing); a module's
    gather then waits on its prefetched work instead of gathering. So at most k + 1 modules'
    full parameters are alive at once in forward: the running one and the k prefetched. Every
    rank records the same order and issues the same gathers in it. A prefetched gather the
    forward did not consume (a module not called this time) is waited on and dropped when the
    forward returns. Backward gathers on demand, one saved tensor at a time, as without prefetch.

Note [Casting before communication]
    With ``compute_dtype`` (bfloat16, say) the registered parameters stay in their own dtype
    (float32): they are the master weights the optimizer steps. A shard is cast to
    ``compute_dtype`` before its all-gather, so the gather moves half the bytes and the full
    parameter exists only in ``compute_dtype``; a replicated parameter is cast as its module
    runs (the cast's backward gives its gradient back in float32), and floating inputs are cast
    on the way in. A full gradient arrives in ``compute_dtype`` and is upcast to the shard's
    dtype before anything sums it (another use's, a ``no_sync()`` micro-batch's, other ranks'):
    the reduce-scatter runs in float32 (``paracheck_reduce_dtype``), so a sum of W bfloat16
    gradients is rounded once, to float32, not W times to bfloat16.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["FSDP", "gather_units", "shard_range"]

_reduce_scatter_tensor = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_all_gather_into_tensor = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def shard_range(numel: int, world_size: int, rank: int) -> tuple[int, int]:
    """Rank ``rank``'s elements ``[start, stop)`` of a flattened parameter of ``numel`` elements,
    padded to a multiple of ``world_size`` (Note [FSDP data flow]); ``stop`` may pass ``numel``."""
    chunk = math.ceil(numel / world_size)
    return rank * chunk, (rank + 1) * chunk


def gather_units(module: nn.Module, sharded) -> dict[nn.Module, nn.Module]:
    """Every module of ``module`` (itself included) -> the module whose call gathers its
    parameters: its parent's unit where the parent owns a parameter ``sharded(p)`` says is
    sharded, else itself (Note [A module reads its children's parameters])."""
    units = {module: module}
    for parent in module.modules():  # parents before their children
        owns = any(p is not None and sharded(p) for p in parent._parameters.values())
        for child in parent.children():
            units.setdefault(child, units[parent] if owns else child)
    return units


class _Sharded:
    """One sharded parameter: its shard (the registered parameter), full shape and owners."""

    def __init__(self, index: int, shard: nn.Parameter, shape: torch.Size, numel: int):
        self.index, self.shard, self.shape, self.numel = index, shard, shape, numel
        self.pending: torch.Tensor | None = None  # gradient held locally inside no_sync()
        self.uses = 0  # gathers with autograd in the current forward
        self.seen = 0  # of them, backwards run since the last reduction
        self.partial: torch.Tensor | None = None  # their gradients' sum so far


class _Gather(torch.autograd.Function):
    """shard -> full parameter (all-gather); backward: full gradient -> shard gradient
    (reduce-scatter, divided by W)."""

    @staticmethod
    def forward(ctx, shard, fsdp, entry):
        ctx.fsdp, ctx.entry = fsdp, entry
        return fsdp._all_gather(entry)

    @staticmethod
    def backward(ctx, grad_full):
        return ctx.fsdp._reduce_gradient(ctx.entry, grad_full), None, None


class FSDP(nn.Module):
    """Fully sharded data parallelism: ``FSDP(module)``; ``forward``; after each backward outside
    ``no_sync()``, ``finish_gradient_synchronization()``; an optimizer over ``fsdp.parameters()``
    (the shards and the replicated parameters, in ``module.parameters()`` order).

    ``gather_full_params()`` and ``full_gradients()`` return every parameter and gradient whole,
    in that order (collectives: every rank calls them). Contract: equal to single-process
    training on the rank-averaged gradient up to summation order, with the modules every rank
    runs the same. ``compute_dtype``: every forward and backward computes with the parameters
    cast to it, and the registered parameters, in their own dtype, are the master weights
    (Note [Casting before communication]); then equal to that training with float32 masters,
    up to the rounding of the reduced mean.
    """

    # The dtype the gradients are reduced in where a compute dtype is given (the shards').
    paracheck_reduce_dtype = "float32"

    def __init__(
        self, module: nn.Module, compute_dtype: torch.dtype | None = None, *, prefetch: int = 0
    ):
        super().__init__()
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
            raise ValueError(f"prefetch={prefetch!r} must be an int >= 0")
        self.prefetch = prefetch
        # The last forward's module calls, this forward's, and the gathers issued ahead (entry
        # index -> (work, padded full tensor)): Note [Prefetching the next modules].
        self._order: list[nn.Module] = []
        self._calls: list[nn.Module] = []
        self._prefetched: dict[int, tuple] = {}
        if compute_dtype is not None and not (
            isinstance(compute_dtype, torch.dtype) and compute_dtype.is_floating_point
        ):
            raise ValueError(
                f"compute_dtype={compute_dtype!r} must be None or a floating torch.dtype"
            )
        self.compute_dtype = compute_dtype
        self.module = module
        self.world_size = dist.get_world_size()
        self.rank = dist.get_rank()
        self._sync = True
        with torch.no_grad():
            for t in [*module.parameters(), *module.buffers()]:
                dist.broadcast(t, src=0)
        self._entries: list[_Sharded] = []
        self._replicated: list[nn.Parameter] = []
        self._by_module: dict[nn.Module, list[tuple[str, _Sharded]]] = {}
        # Replicated parameters a module casts to compute_dtype as it runs, by name.
        self._casts: dict[nn.Module, list[str]] = {}
        # unit -> the modules whose parameters its call gathers or casts, itself first (Note [A
        # module reads its children's parameters]).
        self._owners: dict[nn.Module, list[nn.Module]] = {}
        units = gather_units(module, self._is_sharded)
        seen: dict[int, _Sharded] = {}
        for index, p in enumerate(module.parameters()):
            if self._is_sharded(p):
                seen[id(p)] = self._shard(index, p)
            else:
                self._replicated.append(p)
        for owner in module.modules():
            for name, p in list(owner._parameters.items()):
                if p is not None and id(p) in seen:
                    entry = seen[id(p)]
                    owner._parameters[name] = entry.shard
                    self._by_module.setdefault(owner, []).append((name, entry))
                elif p is not None and compute_dtype is not None and p.is_floating_point():
                    self._casts.setdefault(owner, []).append(name)
        for owner in module.modules():  # parents before their children: a unit first
            if owner in self._by_module or owner in self._casts:
                self._owners.setdefault(units[owner], []).append(owner)
        for unit in self._owners:
            unit.register_forward_pre_hook(self._gather_into)
            unit.register_forward_hook(self._release)
        self._live: dict[int, _Sharded] = {}  # storage pointer -> gathered parameter

    # -- layout -------------------------------------------------------------------------------
    def _is_sharded(self, p: nn.Parameter) -> bool:
        """Trainable matrices are sharded; vectors and frozen parameters are replicated."""
        return p.requires_grad and p.dim() >= 2

    def _shard(self, index: int, p: nn.Parameter) -> _Sharded:
        start, stop = shard_range(p.numel(), self.world_size, self.rank)
        flat = p.detach().reshape(-1)
        chunk = torch.zeros(stop - start, dtype=p.dtype, device=p.device)
        have = flat[start : min(stop, p.numel())]
        chunk[: have.numel()] = have
        entry = _Sharded(index, nn.Parameter(chunk), p.shape, p.numel())
        self._entries.append(entry)
        return entry

    def _empty_padded(self, shard: torch.Tensor) -> torch.Tensor:
        return torch.empty(shard.numel() * self.world_size, dtype=shard.dtype, device=shard.device)

    def _gather_padded(self, shard: torch.Tensor) -> torch.Tensor:
        """Every rank's ``shard`` (a 1-D chunk) concatenated: the flat, padded whole."""
        padded = self._empty_padded(shard)
        _all_gather_into_tensor(padded, shard)
        return padded

    def _all_gather(self, entry: _Sharded) -> torch.Tensor:
        """The full parameter, in ``compute_dtype`` where one is given: the shard is cast before
        the gather (Note [Casting before communication]); a prefetched one once its work is
        done (Note [Prefetching the next modules])."""
        ahead = self._prefetched.pop(entry.index, None)
        if ahead is not None:
            work, padded = ahead
            work.wait()
            return padded[: entry.numel].view(entry.shape)
        return self._gather_padded(self._to_send(entry))[: entry.numel].view(entry.shape)

    def _to_send(self, entry: _Sharded) -> torch.Tensor:
        shard = entry.shard.detach()
        return shard if self.compute_dtype is None else shard.to(self.compute_dtype)

    def _prefetch_after(self, position: int) -> None:
        """Issue the gathers of the ``prefetch`` module calls after call ``position`` of the last
        forward's order (Note [Prefetching the next modules])."""
        for unit in self._order[position + 1 : position + 1 + self.prefetch]:
            for _, entry in self._sharded_of(unit):
                if entry.index in self._prefetched:
                    continue
                shard = self._to_send(entry)
                padded = self._empty_padded(shard)
                work = _all_gather_into_tensor(padded, shard, async_op=True)
                self._prefetched[entry.index] = (work, padded)

    def _drop_prefetched(self) -> None:
        for work, _ in self._prefetched.values():
            work.wait()
        self._prefetched.clear()

    def _upcast(self, entry: _Sharded, grad: torch.Tensor) -> torch.Tensor:
        """A use's full gradient in the shard's dtype, before anything sums it."""
        return grad.to(entry.shard.dtype)

    def _reduce_gradient(self, entry: _Sharded, grad_full: torch.Tensor) -> torch.Tensor | None:
        grad = self._upcast(entry, grad_full.reshape(-1))
        entry.seen += 1
        if entry.seen < entry.uses:  # a tied weight: wait for its last use's gradient
            entry.partial = grad.clone() if entry.partial is None else entry.partial.add_(grad)
            return None
        if entry.partial is not None:
            grad, entry.partial = entry.partial.add_(grad), None
        entry.seen = 0
        if entry.pending is not None:
            grad = grad + entry.pending
            entry.pending = None
        if not self._sync:
            entry.pending = grad.clone()
            return None
        return self._reduce_scatter(entry, grad)

    def _reduce_scatter(self, entry: _Sharded, grad: torch.Tensor) -> torch.Tensor:
        c = entry.shard.numel()
        padded = torch.zeros(c * self.world_size, dtype=grad.dtype, device=grad.device)
        padded[: entry.numel] = grad
        out = torch.empty(c, dtype=grad.dtype, device=grad.device)
        _reduce_scatter_tensor(out, padded, op=dist.ReduceOp.SUM)
        return out.div_(self.world_size).to(entry.shard.dtype)

    # -- forward ------------------------------------------------------------------------------
    def _sharded_of(self, unit: nn.Module) -> list[tuple[str, _Sharded]]:
        return [x for owner in self._owners.get(unit, ()) for x in self._by_module.get(owner, ())]

    def _gather_into(self, unit: nn.Module, args) -> None:
        gathered: dict[int, torch.Tensor] = {}  # one gather per parameter of the unit
        for owner in self._owners[unit]:
            for name in self._casts.get(owner, ()):
                owner.__dict__[name] = owner._parameters[name].to(self.compute_dtype)
            for name, entry in self._by_module.get(owner, ()):
                if entry.index not in gathered:
                    entry.uses += torch.is_grad_enabled()
                    gathered[entry.index] = full = _Gather.apply(entry.shard, self, entry)
                    self._live[full.untyped_storage().data_ptr()] = entry
                owner.__dict__[name] = gathered[entry.index]
        if gathered:
            self._calls.append(unit)
            if self._order[: len(self._calls)] == self._calls:
                self._prefetch_after(len(self._calls) - 1)

    def _release(self, unit: nn.Module, args, output) -> None:
        for owner in self._owners[unit]:
            for name in self._casts.get(owner, ()):
                owner.__dict__.pop(name)
            for name, _ in self._by_module.get(owner, ()):
                full = owner.__dict__.pop(name)
                self._live.pop(full.untyped_storage().data_ptr(), None)

    def _pack(self, t: torch.Tensor):
        entry = self._live.get(t.untyped_storage().data_ptr()) if t.numel() else None
        if entry is None:
            return t
        return (entry, t.size(), t.stride(), t.storage_offset())

    def _unpack(self, packed):
        if isinstance(packed, torch.Tensor):
            return packed
        entry, size, stride, offset = packed
        with torch.no_grad():
            full = self._all_gather(entry)
        return full.as_strided(size, stride, offset)

    def forward(self, *args, **kwargs):
        for entry in self._entries:  # a new graph: count its uses afresh
            entry.uses, entry.seen, entry.partial = 0, 0, None
        if self.compute_dtype is not None:
            args = tuple(
                a.to(self.compute_dtype) if torch.is_tensor(a) and a.is_floating_point() else a
                for a in args
            )
        self._order, self._calls = self._calls or self._order, []
        try:
            with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
                return self.module(*args, **kwargs)
        finally:
            self._drop_prefetched()

    # -- synchronisation ----------------------------------------------------------------------
    @contextlib.contextmanager
    def no_sync(self):
        """Backward passes inside keep their gradients locally (full size); the first backward
        outside reduces them with its own."""
        previous, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = previous

    def finish_gradient_synchronization(self) -> None:
        for entry in self._entries:
            if entry.pending is not None:
                grad, entry.pending = entry.pending, None
                reduced = self._reduce_scatter(entry, grad)
                if entry.shard.grad is None:
                    entry.shard.grad = reduced
                else:
                    entry.shard.grad.add_(reduced)
        for p in self._replicated:
            if p.requires_grad and p.grad is not None:
                dist.all_reduce(p.grad)
                p.grad.div_(self.world_size)

    # -- whole tensors, for checking ----------------------------------------------------------
    def _whole(self, tensors) -> list[torch.Tensor | None]:
        by_index = {e.index: e for e in self._entries}
        out: list[torch.Tensor | None] = []
        for index, t in enumerate(tensors):
            entry = by_index.get(index)
            if entry is None or t is None:
                out.append(None if t is None else t.detach().clone())
                continue
            padded = self._gather_padded(t.detach().contiguous())
            out.append(padded[: entry.numel].view(entry.shape).clone())
        return out

    def gather_full_params(self) -> list[torch.Tensor]:
        """Every parameter, whole, in ``module.parameters()`` order (a collective)."""
        return self._whole(list(self.module.parameters()))  # type: ignore[return-value]

    def full_gradients(self) -> list[torch.Tensor | None]:
        """Every parameter's synchronised gradient, whole (None where there is none; a
        collective)."""
        return self._whole([p.grad for p in self.module.parameters()])
