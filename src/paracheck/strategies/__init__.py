"""Public Hypothesis strategies for data-parallel cases, in Hypothesis's house style.

Plural nouns, keyword-only ``min_``/``max_`` bounds validated at use time, shrinking toward the
smallest world, model, bucket and step count. Compose them::

    from hypothesis import given
    from paracheck import strategies as pst

    @given(pst.cases(min_world_size=2, max_world_size=4))
    def test_my_ddp(case): ...
"""

from paracheck.strategies._core import (
    bucket_sizes_mb,
    cases,
    mlp_specs,
    model_specs,
    optimizer_specs,
    world_sizes,
)
from paracheck.strategies._sharding import sharding_cases

__all__ = [
    "bucket_sizes_mb",
    "cases",
    "mlp_specs",
    "model_specs",
    "optimizer_specs",
    "sharding_cases",
    "world_sizes",
]
