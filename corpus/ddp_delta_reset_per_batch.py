"""bug: accumulation: the pending sums are cleared once per batch, not after each finish

The pending-sum DDP clearing its pending gradients in on_train_batch_start() rather than in
finish_gradient_synchronization(): with a finish after every backward, the second finish of a step
reduces the first micro-batch's gradient again.
"""

from corpus.ddp_delta import DeltaDDP


class ResetPerBatchDDP(DeltaDDP):
    def on_train_batch_start(self):
        self.pending = {}

    def _clear_pending(self):
        pass
