"""GPU tier: NCCL ranks, one GPU each, the CS336 LM sizes; skipped (never failed) without GPUs."""
