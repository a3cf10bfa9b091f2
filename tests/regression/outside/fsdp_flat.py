# ruff: noqa: B007  (written outside paracheck; kept as its author wrote it)
"""FSDP1-style wrapper: one flat, padded parameter per (module, dtype) unit.

* Every trainable parameter is owned by the first module (in ``named_modules`` order) that
  registers it; a unit is that module's owned parameters of one dtype, flattened and padded to
  a multiple of the world size. Each rank keeps only its contiguous chunk (an ``nn.Parameter``).
* Before a module's forward, every unit it needs is all-gathered (a custom autograd Function,
  so gradients flow back to the unit); the module's parameters become views into the gathered
  flat tensor and are dropped after the module's forward.
* Saved-tensor hooks replace any saved tensor living in a gathered buffer by a recipe, and
  re-gather in backward when autograd unpacks it: gathered weights die with the forward.
* Backward accumulates each unit's full flat gradient locally (no communication); the finish
  call reduce-scatters it (sum, then / world size) into the shard's ``.grad``. ``no_sync`` is
  therefore a no-op: the full gradient just keeps accumulating.
* Frozen parameters are left on the module, replicated (broadcast from rank 0).
"""

from __future__ import annotations

import contextlib
import weakref

import torch
import torch.distributed as dist
import torch.nn as nn


def _ws():
    return dist.get_world_size() if dist.is_initialized() else 1


def _rank():
    return dist.get_rank() if dist.is_initialized() else 0


class _Unit:
    def __init__(self, params, dtype, world, rank, compute_dtype=None):
        self.params = params  # list of original Parameters (already broadcast)
        self.dtype = dtype
        self.compute_dtype = compute_dtype or dtype
        self.shapes = [p.shape for p in params]
        self.numels = [p.numel() for p in params]
        self.offsets = []
        off = 0
        for n in self.numels:
            self.offsets.append(off)
            off += n
        self.numel = off
        self.chunk = -(-off // world) if off else 0
        self.padded = self.chunk * world
        flat = torch.zeros(self.padded, dtype=dtype)
        for p, o, n in zip(params, self.offsets, self.numels):
            flat[o : o + n].copy_(p.detach().reshape(-1))
        self.shard = nn.Parameter(flat[rank * self.chunk : (rank + 1) * self.chunk].clone())
        self.full_grad = None  # float32/own dtype accumulation buffer, size padded

    def gather_plain(self, dtype=None):
        """All-gather this unit (no autograd); returns the padded flat tensor."""
        dtype = dtype or self.compute_dtype
        out = torch.empty(self.padded, dtype=dtype)
        src = self.shard.detach().to(dtype)
        if _ws() == 1:
            out.copy_(src)
        else:
            dist.all_gather_into_tensor(out, src.contiguous())
        return out


class _Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, shard, unit):
        ctx.unit = unit
        buf = unit.gather_plain()
        return buf  # padded flat, compute dtype

    @staticmethod
    def backward(ctx, grad):
        unit = ctx.unit
        acc_dtype = torch.float32 if unit.compute_dtype != unit.dtype else unit.dtype
        g = grad.to(acc_dtype)
        if unit.full_grad is None:
            unit.full_grad = g.clone()
        else:
            unit.full_grad.add_(g)
        return None, None


class FSDP:
    paracheck_reduce_dtype = "float32"  # only meaningful with a bf16 compute dtype

    def __init__(self, module: nn.Module, compute_dtype=None):
        self.module = module
        self.compute_dtype = compute_dtype
        self.world = _ws()
        self.rank = _rank()
        # broadcast parameters and buffers from rank 0
        seen = set()
        with torch.no_grad():
            for t in list(module.parameters()) + list(module.buffers()):
                if id(t) in seen:
                    continue
                seen.add(id(t))
                if self.world > 1:
                    dist.broadcast(t.data, 0)
        # ownership
        self._all_params = list(module.parameters())  # deduplicated, in order
        owner = {}
        units_by_key = {}
        self.units = []
        for mname, m in module.named_modules(remove_duplicate=True):
            for pname, p in m._parameters.items():
                if p is None or not p.requires_grad or id(p) in owner:
                    continue
                key = (id(m), p.dtype)
                if key not in units_by_key:
                    units_by_key[key] = []
                units_by_key[key].append(p)
                owner[id(p)] = key
        for key, plist in units_by_key.items():
            cd = compute_dtype if compute_dtype is not None else None
            u = _Unit(plist, plist[0].dtype, self.world, self.rank, cd)
            units_by_key[key] = u
            self.units.append(u)
        self._owner = {pid: units_by_key[k] for pid, k in owner.items()}
        self._index_in_unit = {}
        for u in self.units:
            for i, p in enumerate(u.params):
                self._index_in_unit[id(p)] = i
        # references: module -> [(name, param)] and remove managed params from modules
        self._refs = {}
        self._frozen_refs = {}
        for m in module.modules():
            refs, frozen = [], []
            for pname, p in list(m._parameters.items()):
                if p is None:
                    continue
                if id(p) in self._owner:
                    refs.append((pname, p))
                elif compute_dtype is not None and p.dtype != compute_dtype:
                    frozen.append((pname, p))
            if refs or frozen:
                self._refs[m] = refs
                self._frozen_refs[m] = frozen
                for pname, _ in refs:
                    del m._parameters[pname]
                m.register_forward_pre_hook(self._pre_hook)
                m.register_forward_hook(self._post_hook)
        self._live = {}  # storage data_ptr -> (unit, weakref to padded buffer)

    # ---------------------------------------------------------------- interface
    def parameters(self):
        out = []
        for p in self._all_params:
            if id(p) in self._owner:
                u = self._owner[id(p)]
                if self._index_in_unit[id(p)] == 0:
                    out.append(u.shard)
            else:
                out.append(p)
        return iter(out)

    def named_parameters(self):
        return ((str(i), p) for i, p in enumerate(self.parameters()))

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def forward(self, *args, **kwargs):
        with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
            try:
                return self.module(*args, **kwargs)
            finally:
                self._live.clear()

    def finish_gradient_synchronization(self):
        for u in self.units:  # same order, same set on every rank
            if u.full_grad is None:
                continue
            full = u.full_grad
            u.full_grad = None
            out = torch.empty(u.chunk, dtype=full.dtype)
            if self.world == 1:
                out.copy_(full)
            else:
                dist.reduce_scatter_tensor(out, full.contiguous(), op=dist.ReduceOp.SUM)
            del full
            out.div_(self.world)
            out = out.to(u.dtype)
            if u.shard.grad is None:
                u.shard.grad = out
            else:
                u.shard.grad.add_(out)

    @contextlib.contextmanager
    def no_sync(self):
        # gradients are reduced only in the finish call, which is not made inside no_sync
        yield

    @torch.no_grad()
    def gather_full_params(self):
        gathered = {}
        out = []
        for p in self._all_params:
            if id(p) in self._owner:
                u = self._owner[id(p)]
                if id(u) not in gathered:
                    gathered[id(u)] = u.gather_plain(u.dtype)
                i = self._index_in_unit[id(p)]
                o, n = u.offsets[i], u.numels[i]
                out.append(gathered[id(u)][o : o + n].view(u.shapes[i]).clone())
            else:
                out.append(p.detach().clone())
        return out

    @torch.no_grad()
    def full_gradients(self):
        gathered = {}
        out = []
        for p in self._all_params:
            if id(p) in self._owner:
                u = self._owner[id(p)]
                if u.shard.grad is None:
                    out.append(None)
                    continue
                if id(u) not in gathered:
                    buf = torch.empty(u.padded, dtype=u.shard.grad.dtype)
                    if self.world == 1:
                        buf.copy_(u.shard.grad)
                    else:
                        dist.all_gather_into_tensor(buf, u.shard.grad.contiguous())
                    gathered[id(u)] = buf
                i = self._index_in_unit[id(p)]
                o, n = u.offsets[i], u.numels[i]
                out.append(gathered[id(u)][o : o + n].view(u.shapes[i]).clone())
            else:
                out.append(None)
        return out

    # ---------------------------------------------------------------- hooks
    def _pre_hook(self, m, args):
        bufs = {}
        for pname, p in self._refs[m]:
            u = self._owner[id(p)]
            if id(u) not in bufs:
                buf = _Gather.apply(u.shard, u)
                self._live[buf.untyped_storage().data_ptr()] = (u, weakref.ref(buf))
                bufs[id(u)] = buf
            i = self._index_in_unit[id(p)]
            o, n = u.offsets[i], u.numels[i]
            m.__dict__[pname] = bufs[id(u)][o : o + n].view(u.shapes[i])
        for pname, p in self._frozen_refs[m]:
            m.__dict__[pname] = p.detach().to(self.compute_dtype)

    def _post_hook(self, m, args, output):
        for pname, _ in self._refs[m]:
            m.__dict__.pop(pname, None)
        for pname, _ in self._frozen_refs[m]:
            m.__dict__.pop(pname, None)

    def _pack(self, t):
        try:
            ptr = t.untyped_storage().data_ptr()
        except Exception:
            return t
        entry = self._live.get(ptr)
        if entry is not None:
            u, ref = entry
            buf = ref()
            if buf is not None and buf.untyped_storage().data_ptr() == ptr and t.dtype == buf.dtype:
                return ("gathered", u, t.storage_offset(), tuple(t.shape), tuple(t.stride()))
        return t

    def _unpack(self, x):
        if isinstance(x, tuple) and len(x) == 5 and x[0] == "gathered":
            _, u, off, shape, stride = x
            buf = u.gather_plain()
            return buf.as_strided(shape, stride, off)
        return x
