"""Triton RMSNorm forward+backward on one GPU, fp32, against F.rms_norm in the same run."""

from paracheck.bench.asvtools import key, measure_rmsnorm, require

SHAPES = ["4096x1024", "4096x2048", "4096x4096", "4096x8192", "16384x1600"]


def _shape(s):
    rows, d = s.split("x")
    return int(rows), int(d)


def measure(*_):
    return measure_rmsnorm(shapes=[_shape(s) for s in SHAPES])


measure.timeout = 900


class RMSNorm:
    """Effective bandwidth (x, y, dy, dx counted once) by CUDA events, L2 flushed by a read,
    recorded in lower-is-better forms as asv's regression list assumes: seconds per TB moved,
    and the kernel's time relative to ``F.rms_norm``'s and to a copy of the same bytes."""

    params = [SHAPES]
    param_names = ["shape"]
    setup_cache = measure
    timeout = 900

    def setup(self, results, shape):
        self.r = require(results, key(*_shape(shape)))

    def track_seconds_per_tb(self, results, shape):
        return 1.0 / self.r["tbps"]["triton"]

    track_seconds_per_tb.unit = "s/TB (1 / effective bandwidth; lower is better)"

    def track_time_vs_f_rms_norm(self, results, shape):
        return 1.0 / self.r["triton_vs_torch"]

    track_time_vs_f_rms_norm.unit = "time ratio triton / F.rms_norm (lower is better)"

    def track_time_vs_copy(self, results, shape):
        return 1.0 / self.r["triton_fraction_of_copy"]

    track_time_vs_copy.unit = "time ratio triton / copy of the same bytes (lower is better)"
