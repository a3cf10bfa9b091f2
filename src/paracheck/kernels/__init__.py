"""Triton kernels, each equal to its reference in ``paracheck.oracle``.

Importing this package needs torch only: triton is imported if present and kernels are
``triton.jit``-decorated at their first launch (see ``paracheck.kernels.rmsnorm``), so
``TRITON_INTERPRET`` may be set any time before that.
"""

from paracheck.kernels.rmsnorm import (
    MAX_WIDTH,
    RMSNORM_INTERPRETER_TOLERANCES,
    RMSNORM_TOLERANCES,
    RMSNormFunction,
    RMSNormKernels,
    RMSNormTolerance,
    TritonRMSNorm,
    rms_norm,
    rms_norm_tolerance,
    rounding_depth,
    triton_available,
)

__all__ = [
    "MAX_WIDTH",
    "RMSNORM_INTERPRETER_TOLERANCES",
    "RMSNORM_TOLERANCES",
    "RMSNormFunction",
    "RMSNormKernels",
    "RMSNormTolerance",
    "TritonRMSNorm",
    "rms_norm",
    "rms_norm_tolerance",
    "rounding_depth",
    "triton_available",
]
