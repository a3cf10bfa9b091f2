"""bug: no-sync: the gradients of the backward passes inside no_sync() are never averaged

The pending-sum DDP whose hook lets the gradient through to .grad inside no_sync() ("nothing is
communicated there") instead of keeping it aside, so the finish call reduces only the synchronised
backward's gradient and the earlier micro-batches' gradients stay this rank's own.
"""

from corpus.ddp_delta import DeltaDDP


class NoSyncDroppedDDP(DeltaDDP):
    def _stash(self, p, grad):
        if not self.syncing:
            return grad
        return super()._stash(p, grad)
