"""The launch plan of the Triton RMSNorm (``paracheck.kernels.rmsnorm``): block sizes, warps,
program counts and cache hints, a pure function of the shape and the device (Note [tiles and
programs])."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import torch

from paracheck.kernels._rmsnorm_kernels import triton


@dataclass(frozen=True)
class LaunchPlan:
    block_d: int
    fwd_rows: int
    fwd_warps: int
    bwd_rows: int
    bwd_warps: int
    bwd_programs: int
    red_block_p: int
    red_block_n: int
    bwd_reverse: bool = False  # Note [reverse walk]
    x_evict: str = ""  # eviction policies, Note [cache hints]
    y_evict: str = ""
    bwd_load_evict: str = ""


def _pow2_at_most(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)


def _clamp(v: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, v))


def gpu_plan(
    n_rows: int,
    n_cols: int,
    *,
    n_sms: int,
    fwd_rows: int,
    fwd_warps: int,
    bwd_rows: int,
    bwd_warps: int,
    bwd_per_sm: int,
    **hints: str,
) -> LaunchPlan:
    """A GPU plan from its free parameters; the persistent grid has as many tiles per program."""
    block_d = triton.next_power_of_2(n_cols)
    n_tiles = -(-n_rows // bwd_rows)
    waves = -(-n_tiles // (bwd_per_sm * n_sms))
    programs = -(-n_tiles // waves)
    # One pass over the partials when they fit: BLOCK_P x BLOCK_N = 4096 values per program.
    red_block_p = min(triton.next_power_of_2(programs), 1024)
    red_block_n = _clamp(4096 // red_block_p, 1, block_d)
    return LaunchPlan(
        block_d,
        fwd_rows,
        fwd_warps,
        bwd_rows,
        bwd_warps,
        programs,
        red_block_p,
        red_block_n,
        **hints,
    )


# Note [reverse walk]: the backward may walk the rows last to first. The forward wrote y and read
# x first to last, so the rows it touched last are the likeliest to still be in the L2 when the
# backward starts; in training, the dy a preceding backward kernel wrote last is too. Which order
# is faster is measured per width (``experiments/rmsnorm_experiments.py --what reverse``); the
# results do not depend on it except through the order of the dweight partial sums.

_REVERSE_MAX_BLOCK = 4096  # Note [reverse walk]: the widest (padded) rows walked last to first

# Tensors up to this size (per tensor) are treated as L2-resident between forward and backward.
_L2_RESIDENT_BYTES = 32 * 2**20


@functools.lru_cache(maxsize=1024)
def launch_plan(
    n_rows: int, n_cols: int, *, interpreted: bool, n_sms: int, elem_bytes: int = 4
) -> LaunchPlan:
    """Block sizes, warps, program counts and cache hints (Note [tiles and programs]); pure."""
    block_d = triton.next_power_of_2(n_cols)
    rows_cap = triton.next_power_of_2(n_rows)
    if interpreted:
        # ~32k elements per tile: numpy does the work, per-program overhead is amortised.
        rows = min(_pow2_at_most(32768 // block_d), rows_cap)
        programs = min(-(-n_rows // rows), 2)
        # The GPU's row order for this width (below), so CI runs both orders' code.
        return LaunchPlan(
            block_d,
            rows,
            1,
            rows,
            1,
            programs,
            triton.next_power_of_2(programs),
            block_d,
            bwd_reverse=block_d <= _REVERSE_MAX_BLOCK,
        )
    # GPU, chosen from a sweep on an H200 (float32, triton 3.6; scripts/bench_rmsnorm.py
    # --sweep): tiles of >= 4096 elements, so narrow rows come several to a program.
    # Forward: 32 values per thread. Backward: 16-32 per thread for each of x, dy and their
    # prefetched successors; 2 programs per SM up to d = 4096, 1 beyond (registers).
    rows = min(max(1, 4096 // block_d), 64, rows_cap)
    fwd_warps = _clamp(rows * block_d // 1024, 4, 32)
    bwd_rows = rows
    if block_d == 1024 and elem_bytes == 2:
        # 2-byte elements, same tiles: half the bytes per thread, so twice the forward's warps
        # and half the backward's (4096x1024 bf16, 9 reps: 20.4 -> 17.7 us fwd+bwd).
        fwd_warps, bwd_warps, per_sm = 2 * fwd_warps, 4, 2
    elif block_d <= 1024:
        bwd_warps, per_sm = 8, 2
    elif block_d == 2048:
        # Tiles of 4 rows, one program per SM: more bytes in flight per SM (4096x2048: 2.79
        # against 2.72 TB/s fwd+bwd for 2-row tiles at 2 per SM, 7 interleaved rounds;
        # 16384x1600 equal, 3.21).
        bwd_rows, bwd_warps, per_sm = min(4, rows_cap), 16, 1
    elif block_d == 4096:
        bwd_warps, per_sm = 4, 2
    else:
        bwd_warps, per_sm = _clamp(block_d // 512, 16, 32), 1
    # Note [cache hints]: x is read by the forward and again by the backward. When the
    # tensors fit in L2 (~60 MB on an H200) it pays to keep x there (evict_last) and to let y
    # and the backward's last-use loads go first; beyond that only evict_last on x helped.
    small = n_rows * n_cols * elem_bytes <= _L2_RESIDENT_BYTES
    hints = dict(
        x_evict="evict_last",
        y_evict="evict_first" if small else "",
        bwd_load_evict="evict_first" if small else "",
    )
    # The reverse walk (Note [reverse walk]) measured faster up to d = 4096 (4096x4096 3.04 ->
    # 3.12 TB/s, 4096x2048 2.83 -> 2.88, 16384x1600 3.21 -> 3.25, 4096x1024 equal; 7 interleaved
    # rounds), slower at 4096x8192 (3.22 -> 3.16), where x is far larger than the L2.
    plan = gpu_plan(
        n_rows,
        n_cols,
        n_sms=n_sms,
        fwd_rows=rows,
        fwd_warps=fwd_warps,
        bwd_rows=bwd_rows,
        bwd_warps=bwd_warps,
        bwd_per_sm=per_sm,
        **hints,
    )
    return dataclasses.replace(plan, bwd_reverse=block_d <= _REVERSE_MAX_BLOCK)


@functools.lru_cache(maxsize=16)
def sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 1
    return torch.cuda.get_device_properties(device).multi_processor_count
