"""bug: buffer: only the parameters are broadcast at construction, not the buffers

Ranks that construct different buffers (running statistics, masks) keep them.
"""

import torch
import torch.distributed as dist

from corpus.ddp_flat import FlatDDP


class ParamsOnlyDDP(FlatDDP):
    @torch.no_grad()
    def _broadcast_initial(self, module):
        for p in module.parameters():
            dist.broadcast(p.data, src=0)
