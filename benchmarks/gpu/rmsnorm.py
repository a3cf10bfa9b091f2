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
    """Effective bandwidth (x, y, dy, dx counted once) by CUDA events, L2 flushed by a read."""

    params = [SHAPES]
    param_names = ["shape"]
    setup_cache = measure
    timeout = 900

    def setup(self, results, shape):
        self.r = require(results, key(*_shape(shape)))

    def track_bandwidth(self, results, shape):
        return self.r["tbps"]["triton"]

    track_bandwidth.unit = "TB/s"

    def track_vs_f_rms_norm(self, results, shape):
        return self.r["triton_vs_torch"]

    track_vs_f_rms_norm.unit = "ratio"

    def track_fraction_of_copy(self, results, shape):
        return self.r["triton_fraction_of_copy"]

    track_fraction_of_copy.unit = "ratio"
