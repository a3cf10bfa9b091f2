"""correct

ZeRO-1 wrapper that owns the module: ZeRO1(module, optimizer_cls, *, params=None,
bucket_size_mb=None, **kwargs). Each trainable parameter belongs to the least loaded rank by
bytes. finish_gradient_synchronization() all-reduces presence flags, then per dtype reduce-scatters
one buffer of W equal chunks (chunk r holds rank r's parameters' gradients, zero-padded to the
largest chunk), divides by W, adds the result to this rank's accumulated gradients and frees every
.grad (so the next backward adds only its own part). step() steps the wrapped optimizer over this
rank's parameters with those gradients and broadcasts every parameter from its owner. state_dict()
is this rank's shard under global indices.
"""

import contextlib

import torch
import torch.distributed as dist


class OwnerZeRO1:
    def __init__(self, module, optimizer_cls, *, params=None, bucket_size_mb=None, **kwargs):
        self.module = module
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.optimizer_cls, self.kwargs = optimizer_cls, kwargs
        with torch.no_grad():
            for t in [*module.parameters(), *module.buffers()]:
                dist.broadcast(t.data, src=0)
        self.trainable = [p for p in module.parameters() if p.requires_grad]
        loads = [0] * self.world_size
        self.owner = {}
        for p in self.trainable:
            r = min(range(self.world_size), key=lambda k: (loads[k], k))
            self.owner[p] = r
            loads[r] += p.numel() * p.element_size()
        self.acc = {}
        self.param_groups, self.local_opt, self.local_index = [], None, []
        groups = list(module.parameters() if params is None else params)
        if groups and not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        for g in groups:
            self.add_param_group(g)

    def add_param_group(self, param_group):
        group = dict(param_group)
        ps = group["params"]
        group["params"] = [ps] if isinstance(ps, torch.Tensor) else list(ps)
        for k, v in self.kwargs.items():
            group.setdefault(k, v)
        self.param_groups.append(group)
        local = {k: v for k, v in group.items() if k != "params"}
        local["params"] = [p for p in group["params"] if self.owner.get(p) == self.rank]
        if not local["params"]:
            self.local_index.append(None)
        elif self.local_opt is None:
            self.local_opt = self.optimizer_cls([local], **self.kwargs)
            self.local_index.append(0)
        else:
            self.local_opt.add_param_group(local)
            self.local_index.append(len(self.local_opt.param_groups) - 1)

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        yield  # gradients accumulate in .grad until the finish call

    def _average(self, summed):
        return summed / self.world_size

    def _missing(self, p):
        return None  # a parameter no rank has a gradient for stays without one

    @torch.no_grad()
    def finish_gradient_synchronization(self):
        if not self.trainable:
            return
        flags = torch.tensor([float(p.grad is not None or p in self.acc) for p in self.trainable])
        dist.all_reduce(flags)
        present = {p: f > 0 for p, f in zip(self.trainable, flags.tolist())}
        for dtype in sorted({p.dtype for p in self.trainable}, key=str):
            owned = [
                [p for p in self.trainable if p.dtype == dtype and self.owner[p] == r]
                for r in range(self.world_size)
            ]
            length = max(sum(p.numel() for p in ps) for ps in owned)
            send = torch.zeros(self.world_size * length, dtype=dtype)
            for r, ps in enumerate(owned):
                offset = r * length
                for p in ps:
                    if p.grad is not None:
                        send[offset : offset + p.numel()] = p.grad.reshape(-1)
                    offset += p.numel()
            mine = torch.empty(length, dtype=dtype)
            dist.reduce_scatter_tensor(mine, send)
            mine = self._average(mine)
            offset = 0
            for p in owned[self.rank]:
                part = mine[offset : offset + p.numel()].view_as(p)
                offset += p.numel()
                if present[p]:
                    self.acc[p] = self.acc[p] + part if p in self.acc else part.clone()
                elif self._missing(p) is not None:
                    self.acc[p] = self._missing(p)
        for p in self.trainable:
            p.grad = None

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self.local_opt is not None:
            for group, li in zip(self.param_groups, self.local_index):
                if li is not None:
                    local = self.local_opt.param_groups[li]
                    local.update({k: v for k, v in group.items() if k != "params"})
                    for p in local["params"]:
                        p.grad = self.acc.get(p)
            self.local_opt.step()
        for p in self.trainable:
            dist.broadcast(p.data, src=self.owner[p])
        return loss

    def _clear(self):
        self.acc = {}

    def zero_grad(self, set_to_none=True):
        self._clear()
        for p in self.module.parameters():
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                p.grad.detach_()
                p.grad.zero_()

    def _global(self):
        return [p for g in self.param_groups for p in g["params"]]

    def state_dict(self):
        index = {p: i for i, p in enumerate(self._global())}
        state = {}
        if self.local_opt is not None:
            for p, s in self.local_opt.state.items():
                state[index[p]] = {k: v.clone() if torch.is_tensor(v) else v for k, v in s.items()}
        groups, start = [], 0
        for g in self.param_groups:
            d = {k: v for k, v in g.items() if k != "params"}
            d["params"] = list(range(start, start + len(g["params"])))
            start += len(g["params"])
            groups.append(d)
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict):
        for g, saved in zip(self.param_groups, state_dict["param_groups"]):
            g.update({k: v for k, v in saved.items() if k != "params"})
        if self.local_opt is None:
            return
        params = self._global()
        self.local_opt.state.clear()
        for i, s in state_dict["state"].items():
            p = params[int(i)]
            if self.owner.get(p) == self.rank:
                self.local_opt.state[p] = {
                    k: v.clone() if torch.is_tensor(v) else v for k, v in s.items()
                }
