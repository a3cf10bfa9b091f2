"""bug: core: the parameters are iterated twice, so a generator (model.parameters()) is empty the second time

The constructor counts the bytes to shard before handing params to torch.optim.Optimizer, which
then finds the generator exhausted.
"""

from corpus.sharded_greedy import GreedyShardedOptimizer


class GeneratorTwiceShardedOptimizer(GreedyShardedOptimizer):
    def __init__(self, params, optimizer_cls, **kwargs):
        self.total_bytes = sum(
            sum(q.numel() * q.element_size() for q in p["params"])
            if isinstance(p, dict)
            else p.numel() * p.element_size()
            for p in params
        )
        super().__init__(params, optimizer_cls, **kwargs)
