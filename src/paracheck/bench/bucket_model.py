"""The bucket-size model of a bucketed data-parallel step, fitted to a measured bucket sweep, and
the bucket size it predicts best (``paracheck report`` draws it over the sweep).

Note [Bucket-size model]
    S bytes of gradient in buckets of b bytes make S / b buckets. Each costs a fixed overhead o
    (launching its collective, the Python of its hooks, one synchronisation: host time, or
    latency on the wire): o * S / b in all. The buckets' all-reduces overlap the backward that
    produces the next buckets, except the last one's, which starts when the backward ends: its b
    bytes at the all-reduce's bandwidth w are exposed, b / w. The rest of the step, c, does not
    depend on b. So

        t(b) = c + b / w + o * S / b,     smallest at  b* = sqrt(o * S * w)

    (dt/db = 1/w - o S / b^2). The fit is least squares, linear in (c, 1/w, o S) on the basis
    (1, b, 1/b), over the sweep's medians; S need not be known. A fit whose 1/w or o S is not
    positive has no interior optimum (the sweep did not reach the sizes where one of the two
    terms shows): it says so and predicts no best size. The model leaves out what a sweep may
    also show (a bucket past the transport's own chunking, allocator effects), and its residual
    says how much of the measured curve it explains.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = ["BucketFit", "fit_bucket_model"]


@dataclass(frozen=True)
class BucketFit:
    """``t(b) = c_ms + per_mb_ms * b + overhead_ms_mb / b`` (b in MB, t in ms; per_mb_ms = 1/w,
    overhead_ms_mb = o * S), fitted to ``n`` points with root-mean-square residual ``rms_ms``."""

    c_ms: float
    per_mb_ms: float
    overhead_ms_mb: float
    rms_ms: float
    n: int

    @property
    def best_mb(self) -> float | None:
        """sqrt(o S w) in MB: the bucket size the model puts the shortest step at; None where the
        fit has no interior optimum (Note [Bucket-size model])."""
        if self.per_mb_ms <= 0 or self.overhead_ms_mb <= 0:
            return None
        return math.sqrt(self.overhead_ms_mb / self.per_mb_ms)

    def predict(self, b_mb: float) -> float:
        """The model's step time in ms at a bucket of ``b_mb`` MB."""
        return self.c_ms + self.per_mb_ms * b_mb + self.overhead_ms_mb / b_mb


def fit_bucket_model(points) -> BucketFit:
    """Least-squares fit of Note [Bucket-size model] to ``points``, (bucket MB, step ms) pairs;
    a bucket size measured more than once contributes every measurement. ValueError with fewer
    than three distinct positive bucket sizes (three coefficients)."""
    pts = [(float(b), float(t)) for b, t in points]
    bad = [b for b, _ in pts if not b > 0]
    if bad:
        raise ValueError(f"bucket sizes must be > 0 MB, got {bad[0]!r}")
    if len({b for b, _ in pts}) < 3:
        raise ValueError(
            f"points={pts!r}: the model has three coefficients and needs at least three "
            "distinct bucket sizes"
        )
    b = torch.tensor([p[0] for p in pts], dtype=torch.float64)
    t = torch.tensor([p[1] for p in pts], dtype=torch.float64)
    basis = torch.stack([torch.ones_like(b), b, 1.0 / b], dim=1)
    # Columns scaled to unit norm: b and 1/b span many orders of magnitude over a sweep.
    norms = basis.norm(dim=0)
    coef = torch.linalg.lstsq(basis / norms, t.unsqueeze(1)).solution.squeeze(1) / norms
    rms = ((basis @ coef - t).square().mean().sqrt()).item()
    c, per_mb, overhead = (float(x) for x in coef)
    return BucketFit(c, per_mb, overhead, rms, len(pts))
