"""One training step of every variant on 2 NCCL ranks, torch DDP and ZeroRedundancyOptimizer
beside them, CS336 sizes small..xl, batch 4 x 256 tokens per rank, fp32 with TF32 matmuls,
fused AdamW, 25 MB buckets. CUDA memory at the CS336 points (Note [CUDA memory points]), each
(size, variant) above what its ranks held when its job started (Note [Measuring from a clean
state])."""

from paracheck.bench.asvtools import key, measure_steps, require

WORLD = 2
SIZES = ["small", "medium", "large", "xl"]
VARIANTS = [
    "local",
    "naive",
    "flat",
    "overlapped",
    "bucketed",
    "torch-ddp",
    "sharded",
    "zero1",
    "torch-zero",
    "zero2",
    "fsdp",
    "torch-fsdp",
]


def measure(*_):
    return measure_steps(
        device="cuda", models=SIZES, variants=VARIANTS, world_size=WORLD, exact=False
    )


measure.timeout = 3600


class StepTime:
    """Median wall time of 8 steps after 2 warm-up steps (slowest rank, device synchronised)."""

    params = [SIZES, VARIANTS]
    param_names = ["size", "variant"]
    setup_cache = measure
    timeout = 3600

    def setup(self, results, size, variant):
        self.r = require(results, key(size, variant))

    def track_wall(self, results, size, variant):
        return self.r["median"]

    track_wall.unit = "seconds"


class StepCudaMemory:
    """torch.cuda.max_memory_allocated at init, before and after the optimizer step, and overall."""

    params = [SIZES, VARIANTS]
    param_names = ["size", "variant"]
    setup_cache = measure
    timeout = 3600

    def setup(self, results, size, variant):
        self.r = require(results, key(size, variant))

    def track_init(self, results, size, variant):
        return self.r["cuda_memory"]["init"]

    track_init.unit = "bytes"

    def track_before_step(self, results, size, variant):
        return self.r["cuda_memory"]["before_step"]

    track_before_step.unit = "bytes"

    def track_after_step(self, results, size, variant):
        return self.r["cuda_memory"]["after_step"]

    track_after_step.unit = "bytes"

    def track_peak(self, results, size, variant):
        return self.r["cuda_memory"]["peak"]

    track_peak.unit = "bytes"

    def track_left(self, results, size, variant):
        """Bytes the job still held once it released everything: 0 unless the variant leaks."""
        return self.r["left_bytes"]

    track_left.unit = "bytes"
