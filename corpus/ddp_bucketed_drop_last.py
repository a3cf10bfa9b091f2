"""bug: core: the last, partly filled bucket is never reduced

The planner closes a bucket when the next parameter would overflow it, and forgets to close the
bucket still open at the end: those parameters keep this rank's own gradient.
"""

from corpus.ddp_bucketed import BucketedDDP


class DropLastBucketDDP(BucketedDDP):
    @staticmethod
    def _plan(params, cap):
        buckets, current, size = [], [], 0
        for p in params:
            nbytes = p.numel() * p.element_size()
            if current and (size + nbytes > cap or p.dtype != current[0].dtype):
                buckets.append(current)
                current, size = [], 0
            current.append(p)
            size += nbytes
        return buckets
