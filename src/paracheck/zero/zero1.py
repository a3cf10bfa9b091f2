"""Zero1: ZeRO stage 1 proper. Flat buckets split by element; gradients reduce-scattered during
backward; each rank steps only its shard; parameters all-gathered.

Diff with ``ShardedOptimizer``: there a DDP wrapper all-reduces every gradient and owners
broadcast whole parameters ((3W-2)/W Psi bus bytes per rank and step); here the gradient
all-reduce is cut in its two halves and the optimizer step runs between them, on 1/W of every
bucket (2(W-1)/W Psi, an all-reduce's worth; Note [Owner broadcast versus ZeRO-1]).

Note [Zero1 data flow]
    Construction packs the module's trainable parameters into per-bucket flat buffers
    (``flat_layout``, reverse registration order) and re-points every ``p.data`` at its slice, so
    the all-gather after the step writes the parameters in place. Rank r's optimizer does not see
    the parameters: it sees *pieces*, 1-D views of rank r's chunk of each bucket, one per
    (parameter, rank) overlap (``partition.Piece``), grouped like the parameter groups.

    Backward: a post-accumulate-grad hook copies ``p.grad`` into the bucket's gradient buffer and
    drops ``p.grad`` (ZeRO-1 keeps no full-size gradient on the parameter). When every parameter
    of bucket b has arrived, and buckets 0..b-1 have been launched (launch order must be the same
    on every rank), an asynchronous ``reduce_scatter_tensor`` sums the bucket into rank r's chunk.
    ``finish_gradient_synchronization()`` launches the buckets still waiting (a parameter unused
    on this rank contributes zeros), all-reduces one presence flag per parameter (Note [Gradients
    that exist on some ranks only] in ``paracheck.ddp._common``), waits, divides by W and sets
    each piece's ``.grad`` to a view of its chunk, or None where no rank had a gradient (so the
    optimizer skips it, as single-process training would).

    ``step()`` runs the wrapped optimizer on the pieces, then ``all_gather_into_tensor`` per
    bucket with rank r's chunk (a view of the same buffer) as input: in place, as NCCL documents
    (``sendbuff == recvbuff + rank * count``) and FSDP2 relies on; gloo gives the same result.

Note [Zero1 gradient accumulation]
    The chunk of bucket b is *fresh* after ``zero_grad()`` (its contents are dead or zero): the
    next reduce-scatter writes its sum there directly. A second synchronisation in the same step
    (accumulating without ``no_sync()``) must keep the chunk, but the chunk lives inside the
    gradient buffer that the new round's hooks overwrite (Note [Zero1 in-place reduce-scatter]); so
    before the round's first write into bucket b a non-fresh chunk is cloned aside, and after the
    reduce-scatter the chunk becomes ``new / W + saved``: the chunk holds sum over syncs of (sum
    over ranks)/W, the oracle's average up to summation order (and bit for bit what adding
    ``new / W`` into the kept chunk gives: IEEE addition commutes). The clones live only from the
    round's first hook to ``finish_gradient_synchronization()``, and only when accumulating. Within
    ``no_sync()`` the hooks do nothing and ``p.grad`` accumulates locally, as in DDP.

Note [Zero1 presence flags]
    Which parameters had a gradient on some rank is one all-reduce of one flag per parameter,
    built when the round is finished (a hook writing its flag into a device tensor would launch
    two kernels per parameter). Reading the sums back is a device sync: the host stops queueing
    work until every reduce-scatter before it has run. A rank that had every gradient of the round
    knows every sum is >= 1 without reading it, so only a rank that lacked one waits (as in
    ``BucketedDDP``'s Note [Presence flags after the buckets]).

Note [Zero1 in-place reduce-scatter]
    Rank r's reduced chunk of bucket b is not a buffer of its own: it is the view
    ``grad_flat[b].narrow(0, r * s, s)`` (s = the bucket's shard size), and the reduce-scatter
    runs in place, output aliasing its input at rank r's offset. NCCL documents this case
    (``recvbuff == sendbuff + rank * recvcount``) and Megatron-LM's distributed optimizer relies
    on it; gloo's ``reduce_scatter_tensor`` gives the same result with the aliased output (checked
    on torch 2.13 CPU, W = 2, 3, 4, and by every zero1 property run). This saves P'/W bytes of
    gradient per rank against a separate chunk buffer: gradients are the padded buckets only
    (``paracheck.accounting.memory.training_memory``). The price: between a backward and its
    ``finish_gradient_synchronization()`` the chunk (and so a piece's ``.grad`` kept by
    ``zero_grad(set_to_none=False)``) holds this rank's local, unreduced gradient; it is the
    averaged one again once the synchronisation returns. The padding at a bucket's end is never
    written by a hook, so it stays zero through every reduce-scatter.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import weakref

import torch
import torch.distributed as dist
from torch import nn

from paracheck.ddp._common import check_bucket_size_mb, presence_flags
from paracheck.ddp._launch import drain, launch, on_nccl, uses_launcher, watched
from paracheck.zero._zero1_optimizer import Zero1Optimizer
from paracheck.zero.partition import FlatLayout, flat_layout
from paracheck.zero.sharded import (
    check_optimizer_cls,
    clip_by_global_norm,
)

__all__ = ["Zero1", "Zero1Optimizer"]


# torch 2.13 renames reduce_scatter_tensor / all_gather_into_tensor to reduce_scatter_single /
# all_gather_single (same arguments) and makes the old names forward with a FutureWarning; older
# torch has the old names only. Picked once: the new name wherever it exists.
_reduce_scatter_tensor = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_all_gather_into_tensor = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _hook(ref: weakref.ref, i: int, p: torch.Tensor) -> None:
    # A weak reference: the hook lives on the parameter, and a closure over the wrapper would make
    # a cycle through the parameter's hook table, which the garbage collector does not traverse:
    # the wrapper, its buffers and the module would never be freed.
    zero = ref()
    if zero is not None:
        zero._grad_ready(i, p)


# Note [Zero1 coalesced all-gathers]
#     ``step()`` all-gathers every bucket after the optimizer step, on the calling thread, and
#     then waits: on NCCL each launch costs the host tens of microseconds (243 per xl step), with
#     nothing to overlap them with. There, with no dispatch or function mode watching (the same
#     condition as Note [Launching off the autograd thread]), the all-gathers are queued in torch's
#     coalescing manager and launched as one NCCL group call. The same collectives in the same
#     order on every rank, the same bytes; elsewhere (gloo, a recorder) one launch per bucket.
_COALESCING = getattr(dist.distributed_c10d, "_coalescing_manager", None)
_NO_CM = contextlib.nullcontext()


def _drain_launches(ref: weakref.ref) -> None:
    zero = ref()
    if zero is not None:
        zero._drain_queued = False
        drain()


class Zero1:
    """ZeRO-1 data parallelism: a module wrapper and an optimizer in one.

    Contract: with every rank calling, in order, ``forward`` / ``backward`` /
    ``finish_gradient_synchronization()`` (after each backward outside ``no_sync()``) /
    ``step()``, every rank holds bitwise identical parameters, equal to single-process training of
    ``optimizer_cls`` on the rank-averaged gradient (the oracle) up to summation order (float64:
    relative 1e-10, ``paracheck.oracle.tolerance``). Preconditions: identical modules and
    registration order on every rank; all trainable parameters share one dtype and device;
    ``optimizer_cls`` is *elementwise* (SGD, Adam, AdamW: a parameter's update element depends
    only on the same element of its gradient and state, so stepping a piece equals stepping the
    whole tensor; LAMB-like per-tensor norms are not); trainability fixed at construction.

    Interface (``paracheck check``'s kind ``zero``)::

        zero = Zero1(module, torch.optim.AdamW, params=groups_or_params, bucket_size_mb=25, lr=1e-3)
        loss = loss_fn(zero(x), y); loss.backward(); zero.finish_gradient_synchronization()
        zero.step(); zero.zero_grad(set_to_none=True)

    ``params`` is what an optimizer's first argument would be (default: ``module.parameters()``);
    ``kwargs`` are the optimizer's defaults. ``zero.optimizer`` is a ``torch.optim.Optimizer``
    (``param_groups``, ``add_param_group``, consolidated ``state_dict()`` / ``load_state_dict()``)
    usable by LR schedulers; ``zero.param_groups``, ``add_param_group``, ``state_dict`` and
    ``load_state_dict`` forward to it. Zero1 is deliberately not an ``nn.Module``: its
    ``state_dict`` is the optimizer's; the weights are ``zero.module.state_dict()``. After the
    synchronisation ``p.grad`` is None for every trainable parameter: this rank's averaged shard is
    on the pieces (``full_gradients()`` gathers the whole, for checks).

    Collectives every rank must call: the constructor (broadcast of parameters and buffers from
    the group's first rank), backward (reduce-scatters issued from hooks),
    ``finish_gradient_synchronization()``, ``step()`` (all-gathers), ``state_dict()`` and
    ``full_gradients()``. World size 1 runs the same code with the collectives replaced by copies.
    """

    # One flat buffer of one dtype: a model with parameters of two dtypes is refused (the
    # constructor raises), and the check skips such a case with this note.
    unsupported_case_features = {
        "float32_layer": "Zero1 keeps one flat buffer, so all trainable parameters share one dtype"
    }

    def __init__(
        self,
        module: nn.Module,
        optimizer_cls: type[torch.optim.Optimizer],
        *,
        params=None,
        bucket_size_mb: float = 25.0,
        process_group=None,
        **kwargs,
    ):
        if not isinstance(module, nn.Module):
            raise TypeError(f"module={module!r} must be a torch.nn.Module")
        check_optimizer_cls(optimizer_cls)
        cap_mb = check_bucket_size_mb(bucket_size_mb)
        self.module = module
        self.process_group = process_group
        self.world_size = dist.get_world_size(process_group) if dist.is_initialized() else 1
        self.rank = dist.get_rank(process_group) if dist.is_initialized() else 0
        self.trainable = [p for p in module.parameters() if p.requires_grad]
        if not self.trainable:
            raise ValueError("module has no parameter with requires_grad=True: nothing to shard")
        ref = self.trainable[0]
        names = {id(p): n for n, p in module.named_parameters()}
        for p in self.trainable:
            if p.dtype != ref.dtype or p.device != ref.device:
                raise ValueError(
                    f"parameter {names[id(p)]!r} is {p.dtype} on {p.device}, the first trainable one "
                    f"{ref.dtype} on {ref.device}: Zero1 needs one dtype and device"
                )
            if p.dim() == 0 or p.numel() == 0:
                # A 0-dim parameter's per-element state could not be told from a per-tensor value
                # like Adam's 0-dim "step" when a state dict is sliced into pieces.
                raise ValueError(
                    f"parameter {names[id(p)]!r} has shape {tuple(p.shape)}: Zero1 needs at least one "
                    f"dimension and one element (reshape a scalar parameter to (1,))"
                )
        self._index = {id(p): i for i, p in enumerate(self.trainable)}
        bucket_numel = max(1, int(cap_mb * 2**20) // ref.element_size())
        self.layout: FlatLayout = flat_layout(
            [p.numel() for p in self.trainable], self.world_size, bucket_numel=bucket_numel
        )
        self._broadcast_module()
        self._build_buffers()
        # Reduce-scatters launched from the hooks: Note [Launching off the autograd thread].
        self._off_thread = self.world_size > 1 and uses_launcher(ref, process_group)
        self._drain_queued = False
        self._coalesce_gathers = (
            _COALESCING is not None and self.world_size > 1 and on_nccl(ref, process_group)
        )
        self._sync_enabled = True
        self._reset_round()
        self._fresh = [True] * len(self.layout.buckets)
        self._has_grad = [False] * len(self.trainable)
        ref = weakref.ref(self)
        self._hooks = [
            p.register_post_accumulate_grad_hook(functools.partial(_hook, ref, i))
            for i, p in enumerate(self.trainable)
        ]
        self.optimizer = Zero1Optimizer(
            self, module.parameters() if params is None else params, optimizer_cls, **kwargs
        )

    # -- construction --------------------------------------------------------------------------
    def _broadcast_module(self) -> None:
        if self.world_size == 1:
            return
        src = dist.get_global_rank(self.process_group, 0) if self.process_group is not None else 0
        with torch.no_grad():
            for t in itertools.chain(self.module.parameters(), self.module.buffers()):
                dist.broadcast(t.detach(), src=src, group=self.process_group)

    def _build_buffers(self) -> None:
        ref = self.trainable[0]
        kw = {"dtype": ref.dtype, "device": ref.device}
        self._param_flat, self._grad_flat, self._grad_shard = [], [], []
        self._where = [None] * len(self.trainable)
        with torch.no_grad():
            for b, bucket in enumerate(self.layout.buckets):
                # Bucket by bucket: re-pointing p.data frees each original before the next bucket
                # is allocated, so the parameters never exist twice (plus one bucket at most).
                flat = torch.zeros(bucket.padded, **kw)
                for i, off in zip(bucket.params, bucket.offsets):
                    p = self.trainable[i]
                    view = flat[off : off + p.numel()]
                    view.copy_(p.detach().reshape(-1))
                    p.data = view.view_as(p)
                    self._where[i] = (b, off)
                self._param_flat.append(flat)
                grad, shard = self._gradient_buffers(bucket.padded, kw)
                self._grad_flat.append(grad)
                self._grad_shard.append(shard)
        # This rank's pieces: parameter views the wrapped optimizer steps, and their gradient views.
        self.pieces = self.layout.pieces(self.rank)
        self._piece_params, self._piece_grads = [], []
        for pc in self.pieces:
            s = self.layout.shard_numel(pc.bucket)
            self._piece_params.append(self._param_flat[pc.bucket].narrow(0, pc.offset, pc.length))
            self._piece_grads.append(
                self._grad_shard[pc.bucket].narrow(0, pc.offset - self.rank * s, pc.length)
            )
        self._pieces_of = [[] for _ in self.trainable]
        for k, pc in enumerate(self.pieces):
            self._pieces_of[pc.param].append(k)
        # What the wrapped optimizer steps, one tensor per piece: the pieces themselves, or their
        # float32 masters (``MasterWeightsZero1``).
        self._stepped = self._piece_params

    # -- where gradients live (Zero2 overrides these: Note [Zero2 gradient lifetime]) ------------
    def _gradient_buffers(self, padded: int, kw: dict):
        """A bucket's full gradient buffer and this rank's chunk of it: a view, not a buffer
        (Note [Zero1 in-place reduce-scatter])."""
        grad = torch.zeros(padded, **kw)
        s = padded // self.world_size
        return grad, grad.narrow(0, self.rank * s, s)

    def _flat(self, b: int) -> torch.Tensor:
        """Bucket b's full gradient buffer, which the hooks write and the reduce-scatter reads."""
        return self._grad_flat[b]

    def _reduced_chunk(self, b: int) -> torch.Tensor:
        """Where bucket b's reduce-scatter leaves this rank's sum: the shard itself."""
        return self._grad_shard[b]

    def _kept(self, b: int) -> torch.Tensor:
        """Bucket b's accumulated chunk, kept before the round's first write (Note [Zero1 gradient
        accumulation]): a copy, since the chunk is part of the buffer the round overwrites."""
        return self._grad_shard[b].clone()

    def _release(self, b: int) -> None:
        """Bucket b's round is over: its averaged chunk is in the shard."""

    def gradient_bytes(self) -> int:
        """Bytes of gradient storage this rank holds now: its bucket buffers and shards (each
        storage once) and any gradient left on a parameter (accumulated under ``no_sync()``)."""
        seen, total = set(), 0
        tensors = [t for t in self._grad_flat if t is not None] + list(self._grad_shard)
        tensors += [p.grad for p in self.trainable if p.grad is not None]
        for t in tensors:
            storage = t.untyped_storage()
            if storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                total += storage.nbytes()
        return total

    def pieces_of(self, p: torch.Tensor) -> list[torch.Tensor]:
        """The tensors this rank steps for parameter ``p``: its pieces, or their masters (Note
        [Zero1 master weights]); empty for a frozen parameter or one that lies wholly in other
        ranks' chunks. ValueError for a trainable tensor not in the module."""
        i = self._index.get(id(p))
        if i is None:
            if p.requires_grad:
                raise ValueError(
                    f"parameter of shape {tuple(p.shape)} requires grad but is not a trainable "
                    f"parameter of the wrapped module at construction: Zero1 cannot synchronise it"
                )
            return []
        return [self._stepped[k] for k in self._pieces_of[i]]

    # -- module protocol -----------------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    forward = __call__

    @contextlib.contextmanager
    def no_sync(self):
        """Backward passes inside only accumulate local gradients in ``p.grad``."""
        previous = self._sync_enabled
        self._sync_enabled = False
        try:
            yield
        finally:
            self._sync_enabled = previous

    def _reset_round(self) -> None:
        self._fired = [False] * len(self.trainable)
        self._pending = [len(b.params) for b in self.layout.buckets]
        self._next = 0
        self._inflight = []
        # Per bucket: written this round yet, and the accumulated chunk kept aside before the first
        # write (Note [Zero1 gradient accumulation]; None when the chunk was fresh).
        self._started = [False] * len(self.layout.buckets)
        self._saved = [None] * len(self.layout.buckets)

    def _grad_ready(self, i: int, p) -> None:
        if self._sync_enabled:
            if self._off_thread and not self._drain_queued:
                # Backward returns with every launch it queued made (Note [Launching off the
                # autograd thread]).
                self._drain_queued = True
                torch.autograd.Variable._execution_engine.queue_callback(
                    functools.partial(_drain_launches, weakref.ref(self))
                )
            self._take_grad(i, p)
            self._launch_ready()

    def _take_grad(self, i: int, p) -> None:
        if self._fired[i]:
            raise RuntimeError(
                f"trainable parameter #{i} received a second gradient before finish_gradient_synchronization(): "
                f"call it after every backward outside no_sync()"
            )
        b, off = self._where[i]
        self._start_bucket(b)
        self._flat(b)[off : off + p.numel()].copy_(p.grad.reshape(-1))
        p.grad = None
        self._fired[i] = True
        self._pending[b] -= 1

    def _start_bucket(self, b: int) -> None:
        """Called before every write into bucket b's gradient buffer: the round's first one keeps a
        non-fresh chunk aside, since the chunk is part of that buffer (Note [Zero1 gradient accumulation])."""
        if self._started[b]:
            return
        self._started[b] = True
        if not self._fresh[b]:
            self._saved[b] = self._kept(b)

    def _launch_ready(self) -> None:
        while self._next < len(self.layout.buckets) and self._pending[self._next] == 0:
            self._launch(self._next)

    def _launch(self, b: int) -> None:
        bucket = self.layout.buckets[b]
        self._start_bucket(b)
        for i, off in zip(bucket.params, bucket.offsets):
            if not self._fired[i]:  # unused on this rank: contributes zeros
                self._flat(b)[off : off + self.trainable[i].numel()].zero_()
        # In place: the output is this rank's chunk of the input (Note [Zero1 in-place reduce-scatter]).
        # One rank: the chunk is the whole buffer, already holding the "sum".
        handle = None
        if self.world_size > 1:
            chunk, flat = self._reduced_chunk(b), self._flat(b)
            handle = launch(
                self._off_thread,
                _reduce_scatter_tensor,
                chunk,
                flat,
                group=self.process_group,
                async_op=True,
            )
        self._fresh[b] = False
        self._inflight.append((b, handle))
        self._next = b + 1

    def finish_gradient_synchronization(self) -> None:
        """Complete the reduce-scatters of this backward; afterwards each piece's ``.grad`` is this
        rank's chunk of the rank-averaged gradient (Note [Zero1 data flow]). A collective."""
        if not self._sync_enabled:
            return
        # A gradient accumulated under no_sync() whose parameter the last backward did not touch
        # is still in p.grad: its bucket cannot have been launched, so take it now.
        for i, p in enumerate(self.trainable):
            if not self._fired[i] and p.grad is not None:
                self._take_grad(i, p)
        for b in range(self._next, len(self.layout.buckets)):
            self._launch(b)
        self._reduce_presence()
        self._settle_all()
        self._attach_piece_grads()
        self._reset_round()

    def _reduce_presence(self) -> None:
        """Which parameters some rank had a gradient for (Note [Gradients that exist on some ranks
        only]): one all-reduce of one flag per parameter, read back (a device sync) only where
        this rank lacked one. Where it had every gradient every count is >= 1 and the host does
        not wait (Note [Zero1 presence flags])."""
        if self._off_thread:
            # The reduce-scatters first, on every rank: Note [Launching off the autograd thread].
            drain()
        absent = [i for i, fired in enumerate(self._fired) if not fired]
        ref = self.trainable[0]
        flags = presence_flags(len(self.trainable), absent, dtype=ref.dtype, device=ref.device)
        if self.world_size > 1:
            dist.all_reduce(flags, group=self.process_group)
        if absent:
            for i, count in enumerate(flags.tolist()):
                if count:
                    self._has_grad[i] = True
        else:
            self._has_grad = [True] * len(self.trainable)

    def _settle_all(self) -> None:
        """Settle every bucket of the round: one multi-tensor divide by W for the buckets with
        nothing kept aside and nothing to copy (the common case), ``_settle`` for the others."""
        plain = [
            (b, h)
            for b, h in self._inflight
            if self._saved[b] is None and self._reduced_chunk(b) is self._grad_shard[b]
        ]
        for _, handle in plain:
            if handle is not None:
                handle.wait()
        if plain:
            self._average([self._grad_shard[b] for b, _ in plain])
        done = {b for b, _ in plain}
        for b, handle in self._inflight:
            if b not in done:
                self._settle(b, handle)
        for b in done:
            self._release(b)

    def _average(self, chunks: list[torch.Tensor]) -> None:
        """Divide reduced sums by W in place: one multi-tensor launch, the same on every path so
        that every path rounds alike (on CUDA ``div_`` by a scalar multiplies by the reciprocal;
        the multi-tensor divide divides)."""
        torch._foreach_div_(chunks, self.world_size)

    def _settle(self, b: int, handle) -> None:
        """Wait for bucket b's reduce-scatter; its shard becomes the new sum / W, plus what the
        step's earlier synchronisations left (Note [Zero1 gradient accumulation])."""
        if handle is not None:
            handle.wait()
        chunk = self._reduced_chunk(b)
        self._average([chunk])
        if self._saved[b] is not None:
            chunk.add_(self._saved[b])
        if chunk is not self._grad_shard[b]:
            self._grad_shard[b].copy_(chunk)
        self._release(b)

    def _attach_piece_grads(self) -> None:
        for k, pc in enumerate(self.pieces):
            self._stepped[k].grad = self._piece_grads[k] if self._has_grad[pc.param] else None

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Reset gradients: the pieces' (None, or zeros where there was one) and any local ``p.grad``."""
        for p in self.trainable:
            p.grad = None
        if set_to_none:
            self._has_grad = [False] * len(self.trainable)
        else:
            for g in self._grad_shard:
                g.zero_()
        self._fresh = [True] * len(self.layout.buckets)
        self._attach_piece_grads()

    def step(self, closure=None, **kwargs):
        return self.optimizer.step(closure, **kwargs)

    def _all_gather_parameters(self) -> None:
        if self.world_size == 1:
            return
        coalesce = self._coalesce_gathers and not watched()
        handles = []
        # One launch for every bucket where that pays (Note [Zero1 coalesced all-gathers]).
        with _COALESCING(self.process_group, async_ops=True) if coalesce else _NO_CM as cm:
            for b, flat in enumerate(self._param_flat):
                s = self.layout.shard_numel(b)
                shard = flat.narrow(0, self.rank * s, s)
                handles.append(
                    _all_gather_into_tensor(flat, shard, group=self.process_group, async_op=True)
                )
        for h in [cm] if coalesce else handles:
            h.wait()

    def _gather_buckets(self, shards: list[torch.Tensor]) -> list[torch.Tensor]:
        """Every bucket whole, from each rank's chunk of it (``shards[b]``): a collective."""
        fulls = []
        for b, shard in enumerate(shards):
            full = torch.empty(
                self.layout.buckets[b].padded, dtype=shard.dtype, device=shard.device
            )
            if self.world_size == 1:
                full.copy_(shard)
            else:
                _all_gather_into_tensor(full, shard, group=self.process_group)
            fulls.append(full)
        return fulls

    def full_gradients(self) -> list[torch.Tensor | None]:
        """The rank-averaged gradient of every trainable parameter (None where no rank had one),
        gathered from the shards: for checks, not for training (a collective; allocates the model)."""
        fulls = self._gather_buckets(self._grad_shard)
        out = []
        for i, p in enumerate(self.trainable):
            b, off = self._where[i]
            out.append(
                fulls[b][off : off + p.numel()].view_as(p).clone() if self._has_grad[i] else None
            )
        return out

    def _gather_object(self, obj) -> list:
        if self.world_size == 1:
            return [obj]
        out = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.process_group)
        return out

    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """Clip the synchronised gradients of the parameters in ``param_groups`` to the global
        2-norm ``max_norm``, as ``torch.nn.utils.clip_grad_norm_`` over all of them in one process
        does: each rank holds its pieces' reduced gradients only, so it sums their squares and one
        all-reduce adds the ranks' sums. Call it after ``finish_gradient_synchronization()``.
        Returns the norm. A collective."""
        grads = [
            piece.grad
            for g in self.param_groups
            for p in g["params"]
            for piece in self.pieces_of(p)
            if piece.grad is not None
        ]
        like = self._param_flat[0] if self._param_flat else None
        return clip_by_global_norm(grads, grads, max_norm, like, self.process_group)

    # -- optimizer forwarding ------------------------------------------------------------------
    @property
    def param_groups(self) -> list[dict]:
        return self.optimizer.param_groups

    def add_param_group(self, param_group: dict) -> None:
        self.optimizer.add_param_group(param_group)

    def state_dict(self) -> dict:
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        self.optimizer.load_state_dict(state_dict)
