"""Step time of bucketed DDP (and torch DDP beside it) by bucket size, 2 GPUs, 'xl' LM."""

from paracheck.bench.asvtools import key, measure_buckets, require

VARIANTS = ["bucketed", "torch-ddp"]
BUCKETS_MB = [1, 10, 100, 1000]


def measure(*_):
    return measure_buckets(device="cuda", model="xl", buckets=BUCKETS_MB, variants=VARIANTS)


measure.timeout = 1800


class BucketSweep:
    """Median wall time of a step, slowest rank."""

    params = [VARIANTS, BUCKETS_MB]
    param_names = ["variant", "bucket_mb"]
    setup_cache = measure
    timeout = 1800

    def setup(self, results, variant, bucket_mb):
        self.r = require(results, key(variant, bucket_mb))

    def track_wall(self, results, variant, bucket_mb):
        return self.r["median"]

    track_wall.unit = "seconds"
