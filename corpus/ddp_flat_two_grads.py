"""bug: core: the first parameter is left out of the flat buffer (the loop starts at index 1)
    shows: gradients, parameters, rank-agreement, world-size-relation
    match: layers.0.weight
bug: core: bias gradients are all-reduced but never divided by the world size
    shows: gradients, parameters, world-size-relation
    match: bias
bug: unused-some-ranks: the average is copied only into gradients a rank has, so a rank that did not use a parameter keeps None where the other ranks' average is due (and with accumulation, a later micro-step's all-reduce sums the others' average with that rank's zeros: halved)
    shows: gradients, parameters
    match: expected a gradient, got None|'branch.weight'.*every element is 1/2 times

Two wrong gradients of the same property: a flat DDP whose weights go in one buffer (averaged)
and whose biases go in another (summed: the division was written for the first buffer only),
and whose loop over the weights starts at 1, a leftover of skipping an embedding.
"""

import torch
import torch.distributed as dist
import torch.nn as nn


class OffByOneFlatDDP(nn.Module):
    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module
        self.world_size = dist.get_world_size()
        with torch.no_grad():
            for t in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(t.data, src=0)
        trainable = [p for p in module.parameters() if p.requires_grad]
        self.weights = [p for p in trainable if p.dim() > 1]
        self.biases = [p for p in trainable if p.dim() <= 1]

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @staticmethod
    def _flat(params):
        return torch.cat(
            [(p.grad if p.grad is not None else torch.zeros_like(p)).view(-1) for p in params]
        )

    @staticmethod
    def _unflat(params, flat):
        offset = 0
        for p in params:
            if p.grad is not None:
                p.grad.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()

    @torch.no_grad()
    def finish_gradient_synchronization(self):
        weights = self.weights[1:]
        if weights:
            flat = self._flat(weights)
            dist.all_reduce(flat)
            flat /= self.world_size
            self._unflat(weights, flat)
        if self.biases:
            flat = self._flat(self.biases)
            dist.all_reduce(flat)
            self._unflat(self.biases, flat)
