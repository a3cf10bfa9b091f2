"""gloo all-reduce of float32 tensors: time and bus bandwidth by world size and size."""

from paracheck.bench.asvtools import key, measure_allreduce, require

WORLD_SIZES = [2, 4]
SIZES_MB = [1, 10, 100]


def measure(*_):
    return measure_allreduce(device="cpu", sizes_mb=SIZES_MB, world_sizes=WORLD_SIZES)


measure.timeout = 900


class AllReduce:
    """Median time (slowest rank) and its inverse bus bandwidth, time / (2(W-1)/W x bytes), in
    seconds per GB: both lower is better, as asv's regression list assumes of every benchmark
    (bus bandwidth itself, higher is better, would be listed as a regression when it improves)."""

    params = [WORLD_SIZES, SIZES_MB]
    param_names = ["world_size", "size_mb"]
    setup_cache = measure
    timeout = 900

    def setup(self, results, world_size, size_mb):
        self.r = require(results, key(world_size, size_mb))

    def track_time(self, results, world_size, size_mb):
        return self.r["median"]

    track_time.unit = "seconds"  # lower is better

    def track_seconds_per_bus_gb(self, results, world_size, size_mb):
        return 1e9 / self.r["busbw"] if self.r["busbw"] else float("nan")

    track_seconds_per_bus_gb.unit = "s/GB (1 / bus bandwidth; lower is better)"
