"""The specification: data-parallel training computed in ONE process.

This package imports neither ``torch.distributed`` nor triton (a test enforces it). Every
component of paracheck, and every user target, is checked for equality with it.
"""

from paracheck.oracle.train import StepRecord, Trajectory, train

__all__ = ["StepRecord", "Trajectory", "train"]
