"""Share of NCCL kernel time hidden under compute kernels (torch.profiler), 2 GPUs, 'large' LM."""

from paracheck.bench.asvtools import key, measure_overlap, require

VARIANTS = ["overlapped", "bucketed", "torch-ddp"]


def measure(*_):
    return measure_overlap(model="large", variants=VARIANTS)


measure.timeout = 900


class Overlap:
    """Exposed share (communication kernel time not hidden under compute, 1 - hidden share) and
    communication time per step, mean over ranks: both lower is better, as asv's regression
    list assumes."""

    params = [VARIANTS]
    param_names = ["variant"]
    setup_cache = measure
    timeout = 900

    def setup(self, results, variant):
        self.r = require(results, key(variant))

    def track_exposed_share(self, results, variant):
        return 1.0 - self.r["share"]

    track_exposed_share.unit = "fraction exposed (lower is better)"

    def track_comm_time(self, results, variant):
        return self.r["comm_ms_per_step"] / 1e3

    track_comm_time.unit = "seconds"
