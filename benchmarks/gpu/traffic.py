"""Exact communication and optimizer state per rank and step on 2 NCCL ranks, 'small' LM."""

from paracheck.bench.asvtools import key, measure_steps, require

SIZE = "small"
VARIANTS = [
    "naive",
    "flat",
    "overlapped",
    "bucketed",
    "torch-ddp",
    "sharded",
    "zero1",
    "torch-zero",
]


def measure(*_):
    return measure_steps(device="cuda", models=[SIZE], variants=VARIANTS, steps=1, warmup=1)


measure.timeout = 1800


class StepTraffic:
    """Collectives, bus bytes and optimizer-state bytes of one steady-state step."""

    params = [VARIANTS]
    param_names = ["variant"]
    setup_cache = measure
    timeout = 1800

    def setup(self, results, variant):
        self.r = require(results, key(SIZE, variant))

    def track_collectives(self, results, variant):
        return self.r["account"]["collectives"]

    track_collectives.unit = "collectives"

    def track_bus_bytes(self, results, variant):
        return self.r["account"]["bus_bytes"]

    track_bus_bytes.unit = "bytes"

    def track_optimizer_state(self, results, variant):
        return self.r["account"]["optimizer_state_bytes"]

    track_optimizer_state.unit = "bytes"
