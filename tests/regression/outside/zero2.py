# ruff: noqa: B007  (written outside paracheck; kept as its author wrote it)
"""ZeRO-2 wrapper: replicated parameters, dim-0 sharded gradients and optimizer state.

Every trainable parameter of the module (R rows) gets a shard of ceil(R/W) rows on each rank
(fewer or none on the last ranks). finish_gradient_synchronization() all-reduces presence flags
(so a parameter no rank used keeps grad None), then for every present parameter reduce-scatters
its (padded) full gradient, divides by W, accumulates into the shard's .grad and frees the full
.grad. step() steps the local optimizer over this rank's shards (hyper-parameters read from
param_groups at every step) and all-gathers the updated rows into the replicated parameters.
state_dict() is consolidated (all-gathered), in torch's format with global indices.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn


def _ws():
    return dist.get_world_size() if dist.is_initialized() else 1


def _rank():
    return dist.get_rank() if dist.is_initialized() else 0


class _Shard:
    def __init__(self, p, world, rank):
        self.p = p
        self.scalar = p.dim() == 0
        full = p.detach().reshape(1) if self.scalar else p.detach()
        self.rows = full.shape[0]
        self.rest = tuple(full.shape[1:])
        self.chunk = -(-self.rows // world)
        self.lo = min(rank * self.chunk, self.rows)
        self.hi = min((rank + 1) * self.chunk, self.rows)
        self.piece = nn.Parameter(full[self.lo : self.hi].clone())
        self.world = world

    def padded(self, t):
        out = torch.zeros((self.world * self.chunk,) + self.rest, dtype=t.dtype)
        out[: self.rows].copy_(t.reshape((self.rows,) + self.rest))
        return out

    def local_padded(self, t):
        out = torch.zeros((self.chunk,) + self.rest, dtype=t.dtype)
        out[: self.hi - self.lo].copy_(t)
        return out

    def gather(self, local):
        inp = self.local_padded(local)
        full = torch.empty((self.world * self.chunk,) + self.rest, dtype=inp.dtype)
        if self.world == 1:
            full.copy_(inp)
        else:
            dist.all_gather_into_tensor(full, inp)
        return full[: self.rows].reshape(self.p.shape)


class ZeRO2(torch.optim.Optimizer):
    def __init__(self, module, optimizer_cls, *, params=None, bucket_size_mb=None, **kwargs):
        self.module = module
        self.world, self.rank = _ws(), _rank()
        with torch.no_grad():
            seen = set()
            for t in list(module.parameters()) + list(module.buffers()):
                if id(t) not in seen:
                    seen.add(id(t))
                    if self.world > 1:
                        dist.broadcast(t.data, 0)
        self._trainable = [p for p in module.parameters() if p.requires_grad]
        self._shards = {id(p): _Shard(p, self.world, self.rank) for p in self._trainable}
        self._optimizer_cls = optimizer_cls
        self._local = None
        self._pending_groups = []
        if params is None:
            params = module.parameters()
        super().__init__(params, dict(kwargs))
        self._local = optimizer_cls([self._local_group(g) for g in self.param_groups], **kwargs)

    # --------------------------------------------------------------- groups
    def _local_group(self, g):
        d = {k: v for k, v in g.items() if k != "params"}
        d["params"] = [self._shards[id(p)].piece for p in g["params"] if id(p) in self._shards]
        return d

    def add_param_group(self, param_group):
        super().add_param_group(param_group)
        if getattr(self, "_local", None) is not None:
            self._local.add_param_group(self._local_group(self.param_groups[-1]))

    # --------------------------------------------------------------- training
    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish_gradient_synchronization(self):
        flags = torch.tensor([0.0 if p.grad is None else 1.0 for p in self._trainable])
        if self.world > 1 and len(flags):
            dist.all_reduce(flags)
        for p, f in zip(self._trainable, flags.tolist()):
            if f == 0:
                continue
            sh = self._shards[id(p)]
            g = p.grad if p.grad is not None else torch.zeros_like(p)
            full = sh.padded(g)
            p.grad = None
            del g
            out = torch.empty((sh.chunk,) + sh.rest, dtype=full.dtype)
            if self.world == 1:
                out.copy_(full)
            else:
                dist.reduce_scatter_tensor(out, full)
            del full
            out = out[: sh.hi - sh.lo].div(self.world)
            if sh.piece.grad is None:
                sh.piece.grad = out.clone()
            else:
                sh.piece.grad.add_(out)

    def _unsynced(self):
        return any(p.grad is not None for p in self._trainable)

    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self._unsynced():
            self.finish_gradient_synchronization()
        for g, lg in zip(self.param_groups, self._local.param_groups):
            for k, v in g.items():
                if k != "params":
                    lg[k] = v
        self._local.step()
        with torch.no_grad():
            for g in self.param_groups:
                for p in g["params"]:
                    sh = self._shards.get(id(p))
                    if sh is not None:
                        p.copy_(sh.gather(sh.piece.detach()))
        return loss

    def zero_grad(self, set_to_none: bool = True):
        for p in self._trainable:
            sh = self._shards[id(p)]
            for t in (p, sh.piece):
                if t.grad is not None:
                    if set_to_none:
                        t.grad = None
                    else:
                        t.grad.detach_()
                        t.grad.zero_()

    @torch.no_grad()
    def full_gradients(self):
        # One entry per trainable parameter, in module order.
        out = []
        for p in self._trainable:
            sh = self._shards.get(id(p))
            if sh is None or sh.piece.grad is None:
                out.append(None)
            else:
                out.append(sh.gather(sh.piece.grad))
        return out

    # --------------------------------------------------------------- state
    @torch.no_grad()
    def state_dict(self):
        state = {}
        groups = []
        idx = 0
        for g, lg in zip(self.param_groups, self._local.param_groups):
            ids = []
            for p in g["params"]:
                sh = self._shards.get(id(p))
                ids.append(idx)
                if sh is not None:
                    st = self._local.state.get(sh.piece, {})
                    has = torch.tensor([1.0 if st else 0.0])
                    if self.world > 1:
                        dist.all_reduce(has, op=dist.ReduceOp.MAX)
                    if has.item():
                        # every rank with a non-empty shard has the same keys; ranks with an
                        # empty shard stepped nothing: ask rank 0 (never empty) for the keys
                        keys = [sorted(st.keys())]
                        if self.world > 1:
                            dist.broadcast_object_list(keys, 0)
                        entry = {}
                        for k in keys[0]:
                            v = st.get(k)
                            kind = [isinstance(v, torch.Tensor) and v.dim() > 0]
                            if self.world > 1:
                                dist.broadcast_object_list(kind, 0)
                            if kind[0]:
                                entry[k] = sh.gather(v).clone()
                            else:
                                obj = [v]
                                if self.world > 1:
                                    dist.broadcast_object_list(obj, 0)
                                entry[k] = obj[0]
                        state[idx] = entry
                idx += 1
            d = {k: v for k, v in g.items() if k != "params"}
            d["params"] = ids
            groups.append(d)
        return {"state": state, "param_groups": groups}

    @torch.no_grad()
    def load_state_dict(self, sd):
        idx = 0
        for g, sg in zip(self.param_groups, sd["param_groups"]):
            for k, v in sg.items():
                if k != "params":
                    g[k] = v
        for g in self.param_groups:
            for p in g["params"]:
                sh = self._shards.get(id(p))
                st = sd["state"].get(idx, sd["state"].get(str(idx)))
                if sh is not None and st:
                    loc = {}
                    for k, v in st.items():
                        if isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape == p.shape:
                            full = v.reshape((sh.rows,) + sh.rest)
                            loc[k] = full[sh.lo : sh.hi].clone().to(sh.piece.dtype)
                        elif isinstance(v, torch.Tensor):
                            loc[k] = v.clone()
                        else:
                            loc[k] = v
                    self._local.state[sh.piece] = loc
                idx += 1
        for g, lg in zip(self.param_groups, self._local.param_groups):
            for k, v in g.items():
                if k != "params":
                    lg[k] = v
