"""bug: core: each rank sizes the reduce-scatter chunks by its own shard's length, so ranks owning shards of different sizes issue tensors of different sizes
    shows: hang, died, raised

Its state_dict() is the wrapped optimizer's own, keyed by its local indices: a per-rank reading
paracheck accepts (a shard of each rank's own parameters; only the opt-in state-consolidated
property asks for more), so it is no planted bug.

The owner-by-size ZeRO-1 wrapper with the chunk length written as the sum of this rank's own
parameters' sizes ("every chunk is as long as mine": true only when the shards are equal) and a
state_dict() that passes through to the wrapped optimizer.
"""

import torch
import torch.distributed as dist

from corpus.zero1_owner_rs import OwnerZeRO1


class LocalChunkZeRO1(OwnerZeRO1):
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
            length = max(1, sum(p.numel() for p in owned[self.rank]))
            send = torch.zeros(self.world_size * length, dtype=dtype)
            for r, ps in enumerate(owned):
                offset = r * length
                for p in ps:
                    n = min(p.numel(), (r + 1) * length - offset)
                    if p.grad is not None and n > 0:
                        send[offset : offset + n] = p.grad.reshape(-1)[:n]
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
        for p in self.trainable:
            p.grad = None

    def state_dict(self):
        if self.local_opt is None:
            return {"state": {}, "param_groups": []}
        return self.local_opt.state_dict()

    def load_state_dict(self, state_dict):
        if self.local_opt is not None and state_dict.get("param_groups"):
            self.local_opt.load_state_dict(state_dict)
