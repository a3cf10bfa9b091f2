"""Written outside paracheck, correct: true ZeRO-1 (kind `zero`) as a wrapper that owns the module:
ZeRO1(module, optimizer_cls, *, params=None, bucket_size_mb=None, **kwargs).

Per (parameter group, dtype) one flat space of the trainable parameters, padded to a multiple of
the world size; rank r owns elements [r*chunk, (r+1)*chunk). finish_gradient_synchronization()
reduce-scatters every local .grad (None as zeros, presence flags all-reduced), divides by the world
size and accumulates into this rank's gradient chunk, then frees .grad (so later backward passes
add only their own contribution). step() steps one piece per (parameter, owned range) with the
wrapped optimizer, then all-gathers the chunks into the parameters. state_dict() is consolidated
per parameter (global indices), load_state_dict() slices it back."""

from contextlib import contextmanager

import torch
import torch.distributed as dist


def _rs(out, inp, ws):
    dist.reduce_scatter_tensor(out, inp, op=dist.ReduceOp.SUM)


def _ag(out, inp, ws):
    dist.all_gather_into_tensor(out, inp)


class _Space:
    def __init__(self, gi, dtype, params, rank, ws):
        self.gi, self.dtype, self.params = gi, dtype, params
        self.offsets, o = [], 0
        for p in params:
            self.offsets.append(o)
            o += p.numel()
        self.n = o
        self.padded = -(-o // ws) * ws if o else ws
        self.chunk = self.padded // ws
        self.lo = rank * self.chunk
        self.hi = self.lo + self.chunk
        self.pieces = []  # (param index in space, a, b) with [a, b) in the param's flat coordinates
        for i, (p, off) in enumerate(zip(params, self.offsets)):
            a, b = max(self.lo, off), min(self.hi, off + p.numel())
            if a < b:
                self.pieces.append((i, a - off, b - off))
        self.acc = torch.zeros(self.chunk, dtype=dtype, device=params[0].device)
        self.present = torch.zeros(len(params), dtype=torch.bool)


class ZeRO1:
    def __init__(self, module, optimizer_cls, *, params=None, bucket_size_mb=None, **kwargs):
        self.module = module
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.ws = dist.get_world_size() if dist.is_initialized() else 1
        self.optimizer_cls, self.defaults = optimizer_cls, dict(kwargs)
        self.bucket_size_mb = bucket_size_mb
        with torch.no_grad():
            if self.ws > 1:
                for t in list(module.parameters()) + list(module.buffers()):
                    dist.broadcast(t.data, src=0)
        if params is None:
            params = module.parameters()
        groups = list(params)
        if groups and not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        self.param_groups, self.spaces, self.inner = [], [], None
        self._piece_tensors = {}  # (space index, piece index) -> tensor
        self._sync = True
        for g in groups:
            self.add_param_group(g)

    # -- module side
    def __call__(self, *a, **k):
        return self.module(*a, **k)

    def forward(self, *a, **k):
        return self.module(*a, **k)

    @contextmanager
    def no_sync(self):
        old, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = old

    # -- groups
    def add_param_group(self, group):
        group = dict(group)
        ps = group["params"]
        ps = [ps] if isinstance(ps, torch.Tensor) else list(ps)
        group["params"] = ps
        for k, v in self.defaults.items():
            group.setdefault(k, v)
        gi = len(self.param_groups)
        self.param_groups.append(group)
        seen, train = set(), []
        for p in ps:
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                train.append(p)
        inner_params = []
        dtypes = []
        for p in train:
            if p.dtype not in dtypes:
                dtypes.append(p.dtype)
        for dt in dtypes:
            sp = _Space(gi, dt, [p for p in train if p.dtype == dt], self.rank, self.ws)
            si = len(self.spaces)
            self.spaces.append(sp)
            for k, (i, a, b) in enumerate(sp.pieces):
                t = sp.params[i].detach().reshape(-1)[a:b].clone()
                self._piece_tensors[(si, k)] = t
                inner_params.append(t)
        hp = {k: v for k, v in group.items() if k != "params"}
        ig = dict(hp, params=inner_params)
        if self.inner is None:
            self.inner = self.optimizer_cls([ig], **self.defaults)
        else:
            self.inner.add_param_group(ig)

    # -- gradients
    def _local_flat(self, sp):
        flat = torch.zeros(sp.padded, dtype=sp.dtype, device=sp.acc.device)
        flags = torch.zeros(len(sp.params), dtype=torch.float64)
        for i, (p, off) in enumerate(zip(sp.params, sp.offsets)):
            if p.grad is not None:
                flat[off : off + p.numel()] = p.grad.reshape(-1)
                flags[i] = 1
        return flat, flags

    def _reduce(self, sp, flat, flags):
        out = torch.empty(sp.chunk, dtype=sp.dtype, device=flat.device)
        if self.ws > 1:
            _rs(out, flat, self.ws)
            dist.all_reduce(flags)
        else:
            out.copy_(flat)
        sp.acc += out / self.ws
        sp.present |= flags > 0

    def finish_gradient_synchronization(self):
        if not self._sync:
            return
        for sp in self.spaces:
            flat, flags = self._local_flat(sp)
            self._reduce(sp, flat, flags)
            for p in sp.params:
                p.grad = None

    def full_gradients(self):
        out = {}
        full = {}
        for sp in self.spaces:
            buf = torch.empty(sp.padded, dtype=sp.dtype, device=sp.acc.device)
            if self.ws > 1:
                _ag(buf, sp.acc.contiguous(), self.ws)
            else:
                buf.copy_(sp.acc)
            for i, (p, off) in enumerate(zip(sp.params, sp.offsets)):
                if sp.present[i]:
                    full[id(p)] = buf[off : off + p.numel()].view_as(p).clone()
        for name, p in self.module.named_parameters():
            if id(p) in full:
                out[name] = full[id(p)]
        return out

    def zero_grad(self, set_to_none=True):
        for g in self.param_groups:
            for p in g["params"]:
                if p.grad is not None:
                    if set_to_none:
                        p.grad = None
                    else:
                        p.grad.detach_()
                        p.grad.zero_()
        for sp in self.spaces:
            sp.acc.zero_()
            if set_to_none:
                sp.present.zero_()

    # -- optimizer
    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for g, ig in zip(self.param_groups, self.inner.param_groups):
            for k, v in g.items():
                if k != "params":
                    ig[k] = v
        for si, sp in enumerate(self.spaces):
            for k, (i, a, b) in enumerate(sp.pieces):
                t = self._piece_tensors[(si, k)]
                off = sp.offsets[i]
                t.grad = (
                    sp.acc[off + a - sp.lo : off + b - sp.lo].clone() if sp.present[i] else None
                )
        self.inner.step()
        for si, sp in enumerate(self.spaces):
            self._gather(si, sp)
        return loss

    def _shard(self, si, sp):
        shard = torch.zeros(sp.chunk, dtype=sp.dtype, device=sp.acc.device)
        for k, (i, a, b) in enumerate(sp.pieces):
            off = sp.offsets[i]
            shard[off + a - sp.lo : off + b - sp.lo] = self._piece_tensors[(si, k)]
        return shard

    def _gather(self, si, sp):
        shard = self._shard(si, sp)
        full = torch.empty(sp.padded, dtype=sp.dtype, device=shard.device)
        if self.ws > 1:
            _ag(full, shard, self.ws)
        else:
            full.copy_(shard)
        for p, off in zip(sp.params, sp.offsets):
            p.data.copy_(full[off : off + p.numel()].view_as(p))

    # -- state
    def _global_index(self):
        idx, i = {}, 0
        for g in self.param_groups:
            for p in g["params"]:
                idx.setdefault(id(p), i)
                i += 1
        return idx

    def state_dict(self):
        gidx = self._global_index()
        mine = []
        for si, sp in enumerate(self.spaces):
            for k, (i, a, b) in enumerate(sp.pieces):
                st = self.inner.state.get(self._piece_tensors[(si, k)])
                if st:
                    p = sp.params[i]
                    mine.append(
                        (
                            gidx[id(p)],
                            a,
                            b,
                            {kk: (v.clone() if torch.is_tensor(v) else v) for kk, v in st.items()},
                        )
                    )
        parts = [None] * self.ws
        if self.ws > 1:
            dist.all_gather_object(parts, mine)
        else:
            parts = [mine]
        flat = [p for g in self.param_groups for p in g["params"]]
        state = {}
        for part in parts:
            for gi, a, b, st in part:
                p = flat[gi]
                d = state.setdefault(gi, {})
                for kk, v in st.items():
                    if torch.is_tensor(v) and v.dim() > 0:
                        if kk not in d:
                            d[kk] = torch.zeros(p.numel(), dtype=v.dtype, device=v.device)
                        d[kk][a:b] = v
                    else:
                        d[kk] = v
        for gi, d in state.items():
            p = flat[gi]
            for kk, v in d.items():
                if torch.is_tensor(v) and v.dim() == 1 and v.numel() == p.numel():
                    d[kk] = v.view_as(p)
        groups, i = [], 0
        for g in self.param_groups:
            dd = {k: v for k, v in g.items() if k != "params"}
            dd["params"] = list(range(i, i + len(g["params"])))
            i += len(g["params"])
            groups.append(dd)
        return {"state": dict(sorted(state.items())), "param_groups": groups}

    def load_state_dict(self, sd):
        for g, sg in zip(self.param_groups, sd["param_groups"]):
            g.update({k: v for k, v in sg.items() if k != "params"})
        gidx = self._global_index()
        for si, sp in enumerate(self.spaces):
            for k, (i, a, b) in enumerate(sp.pieces):
                st = sd["state"].get(gidx[id(sp.params[i])])
                t = self._piece_tensors[(si, k)]
                if st is None:
                    self.inner.state.pop(t, None)
                    continue
                self.inner.state[t] = {
                    kk: (
                        v.reshape(-1)[a:b].clone()
                        if torch.is_tensor(v) and v.dim() > 0
                        else (v.clone() if torch.is_tensor(v) else v)
                    )
                    for kk, v in st.items()
                }
