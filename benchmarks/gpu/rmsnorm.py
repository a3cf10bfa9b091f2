"""Triton RMSNorm forward+backward on one GPU, in float32 and bfloat16, against F.rms_norm and
Liger-Kernel (where liger_kernel is installed) in the same run: GPU time and back-to-back time."""

from paracheck.bench.asvtools import key, measure_rmsnorm, require

SHAPES = ["4096x1024", "4096x2048", "4096x4096", "4096x8192", "16384x1600", "8192x4096"]
DTYPES = ["float32", "bfloat16"]


def _shape(s):
    rows, d = s.split("x")
    return int(rows), int(d)


def measure(*_):
    return measure_rmsnorm(shapes=[_shape(s) for s in SHAPES], dtypes=DTYPES)


measure.timeout = 1800


class RMSNorm:
    """Effective bandwidth (x, y, dy, dx counted once) by CUDA events, L2 flushed by a read,
    and back-to-back wall time per call, recorded in lower-is-better forms as asv's regression
    list assumes: seconds per TB moved, and the kernel's time relative to ``F.rms_norm``'s,
    Liger-Kernel's and a copy's (GPU time), and to ``F.rms_norm``'s and Liger-Kernel's back to
    back."""

    params = [SHAPES, DTYPES]
    param_names = ["shape", "dtype"]
    setup_cache = measure
    timeout = 1800

    def setup(self, results, shape, dtype):
        self.r = require(results, key(*_shape(shape), dtype))

    def _ratio(self, name):
        value = self.r.get(name)
        if value is None or value != value:  # absent, or NaN: the peer was not measured here
            raise NotImplementedError(f"{name} was not measured (liger_kernel not installed?)")
        return 1.0 / value

    def track_seconds_per_tb(self, results, shape, dtype):
        return 1.0 / self.r["tbps"]["triton"]

    track_seconds_per_tb.unit = "s/TB (1 / effective bandwidth; lower is better)"

    def track_time_vs_f_rms_norm(self, results, shape, dtype):
        return self._ratio("triton_vs_torch")

    track_time_vs_f_rms_norm.unit = "time ratio triton / F.rms_norm (lower is better)"

    def track_time_vs_copy(self, results, shape, dtype):
        return self._ratio("triton_fraction_of_copy")

    track_time_vs_copy.unit = "time ratio triton / copy of the same bytes (lower is better)"

    def track_time_vs_liger(self, results, shape, dtype):
        return self._ratio("triton_vs_liger")

    track_time_vs_liger.unit = "time ratio triton / Liger-Kernel (lower is better)"

    def track_loop_time_vs_f_rms_norm(self, results, shape, dtype):
        return self._ratio("triton_vs_torch_loop")

    track_loop_time_vs_f_rms_norm.unit = (
        "back-to-back time ratio triton / F.rms_norm (lower is better)"
    )

    def track_loop_time_vs_liger(self, results, shape, dtype):
        return self._ratio("triton_vs_liger_loop")

    track_loop_time_vs_liger.unit = (
        "back-to-back time ratio triton / Liger-Kernel (lower is better)"
    )
