"""Step time of bucketed DDP (and torch DDP beside it) by bucket size, 2 gloo ranks, 'cpu' LM."""

from paracheck.bench.asvtools import key, measure_buckets, require

VARIANTS = ["bucketed", "torch-ddp"]
BUCKETS_MB = [1, 10, 100, 1000]


def measure(*_):
    return measure_buckets(device="cpu", model="cpu", buckets=BUCKETS_MB, variants=VARIANTS)


measure.timeout = 900


class BucketSweep:
    """Median wall time and least CPU time of a step, slowest rank."""

    params = [VARIANTS, BUCKETS_MB]
    param_names = ["variant", "bucket_mb"]
    setup_cache = measure
    timeout = 900

    def setup(self, results, variant, bucket_mb):
        self.r = require(results, key(variant, bucket_mb))

    def track_wall(self, results, variant, bucket_mb):
        return self.r["median"]

    track_wall.unit = "seconds"

    def track_cpu(self, results, variant, bucket_mb):
        return self.r["cpu_min"]

    track_cpu.unit = "seconds"
