"""bug: core: bucket_size_mb is turned into bytes with one factor of 1024 too few (a KB cap)

Numerically right, but buckets are 1024 times smaller than asked: nearly one all-reduce per
parameter where the cap allows a few buckets.
"""

from corpus.ddp_bucketed import BucketedDDP


class KilobyteCapDDP(BucketedDDP):
    def __init__(self, module, bucket_size_mb=25.0):
        super().__init__(module, None)
        cap = float("inf") if bucket_size_mb is None else bucket_size_mb * 1024
        self.buckets = self._plan(self.params, cap)
