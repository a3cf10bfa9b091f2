"""Forward, backward and fused-AdamW step of one LM on one GPU, fp32 (TF32) and bf16 autocast."""

from paracheck.bench.asvtools import key, measure_lm, require

SIZES = ["small", "medium", "large", "xl"]
AUTOCAST = [False, True]


def measure(*_):
    return measure_lm(device="cuda", models=SIZES)


measure.timeout = 1800


class LMPhases:
    """Median time of each phase over 5 steps after 2 warm-up steps, device synchronised."""

    params = [SIZES, AUTOCAST]
    param_names = ["size", "autocast"]
    setup_cache = measure
    timeout = 1800

    def setup(self, results, size, autocast):
        self.r = require(results, key(size, autocast))

    def track_forward(self, results, size, autocast):
        return self.r["forward"]

    track_forward.unit = "seconds"

    def track_backward(self, results, size, autocast):
        return self.r["backward"]

    track_backward.unit = "seconds"

    def track_step(self, results, size, autocast):
        return self.r["step"]

    track_step.unit = "seconds"
