"""The models and grids of the two benchmark tiers, in one place for asv, the CLI and the gate.

CPU tier (gloo, 2 shared cores, minutes): LMs far below the CS336 sizes, chosen so a step takes
tens of milliseconds and the bucket sweep still cuts the model into several buckets at 1 MB.
GPU tier (NCCL): the CS336 sizes small..xl at batch 4, context 256, fp32 with TF32 matmuls.
"""

from __future__ import annotations

from paracheck.workloads.lm import LM_SIZES, LMSpec

__all__ = [
    "CPU_MODELS",
    "GPU_SIZES",
    "model_for",
    "ALLREDUCE_MB_CPU",
    "ALLREDUCE_MB_GPU",
    "BUCKET_MB",
    "MB",
]

MB = 2**20  # a "MB" throughout the benchmarks: 2**20 bytes, as bucket_size_mb means it

CPU_MODELS: dict[str, LMSpec] = {
    # 1.05 M parameters (4.2 MB fp32): the gate's model, ~40 ms per step on one core.
    "gate": LMSpec(
        vocab_size=1024, context_length=32, d_model=128, d_ff=512, num_layers=4, num_heads=4
    ),
    # 4.2 M parameters (16.8 MB fp32): the CPU tier's model; 1 MB buckets cut it into ~17.
    "cpu": LMSpec(
        vocab_size=2048, context_length=64, d_model=256, d_ff=1024, num_layers=4, num_heads=4
    ),
}
GPU_SIZES = ("small", "medium", "large", "xl")
ALLREDUCE_MB_CPU = (1, 10, 100)
ALLREDUCE_MB_GPU = (1, 10, 100, 1024)
BUCKET_MB = (1, 10, 100, 1000)


def model_for(name: str) -> LMSpec:
    """A CPU model by name (``gate``, ``cpu``) or a CS336 size (vocab 10000, context 256)."""
    if name in CPU_MODELS:
        return CPU_MODELS[name]
    if name in LM_SIZES:
        return LMSpec.size(name, vocab_size=10000, context_length=256)
    raise ValueError(f"model={name!r} must be one of {sorted(CPU_MODELS) + list(LM_SIZES)}")
