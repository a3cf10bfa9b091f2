"""Cases for tensor-parallel plans (the ``tp`` kind): MLP chains of column-wise and row-wise pairs
(and a replicated last layer in an odd chain: Note [The MLP chain's plan] in ``paracheck.tp``)
on a mesh (dp, tp) of the drawn world size, with sequence parallelism and clipping on or off."""

from __future__ import annotations

from hypothesis import strategies as st

from paracheck.cases import GroupSpec, OptimizerSpec
from paracheck.errors import InvalidArgument
from paracheck.strategies._core import _check_bounds, communicating_first, world_size_draws
from paracheck.tp import TPCase
from paracheck.workloads import MLPSpec

__all__ = ["TP_CLIP_NORMS", "TP_PRECISIONS", "mesh_shapes", "tp_cases"]

# The precisions a tensor-parallel case is drawn at: float64 only, so far (the oracle's bound on
# the order of the ranks' sums is derived for it: Note [Step 0: a derived bound]).
TP_PRECISIONS = ("fp64",)
# None (no clipping), and a norm below every drawn case's first gradient norm measured (so the
# clip scales): the norm of every shard counts in it.
TP_CLIP_NORMS = (None, 0.05)


# Note [Widths a column-wise layer is drawn at]
#   torch's DTensor (2.13, CPU) raises inside its sharding propagation, whatever the plan, on three
#   shapes of a column-wise layer followed by a row-wise one (measured on gloo): fewer output
#   features than ranks (an empty shard: "a and b must have same reduction dim"), a width that
#   is not a multiple of the tensor dimension (the backward's mm of the padded [rows, 4] by the
#   row-wise [3, 1] shard, for width 3 on 2 ranks), and one output feature with a bias (the bias
#   gradient's view of a [rows, 1] tensor sharded on its features, on a mesh of any size). So a
#   column-wise layer is drawn at a multiple of the tensor dimension, and at least 2; the row-wise
#   and replicated layers at any width from 1. Uneven shards are not checked.


def mesh_shapes(world_size: int) -> list[tuple[int, int]]:
    """The (dp, tp) meshes of ``world_size`` ranks, the smallest tensor dimension above 1 first
    (Note [Worlds that communicate first] in ``paracheck.strategies._core``)."""
    divisors = [t for t in range(1, world_size + 1) if world_size % t == 0]
    return [(world_size // t, t) for t in communicating_first(divisors)]


@st.composite
def tp_cases(
    draw,
    *,
    world_sizes=None,
    min_world_size: int = 1,
    max_world_size: int = 4,
    max_steps: int = 3,
    max_accumulation: int = 2,
    max_layers: int = 5,
    max_width: int = 6,
    precision: str | None = None,
    dtype: str = "float64",
) -> TPCase:
    """Cases on a mesh (dp, tp): the world size drawn first (from ``world_sizes``, else from
    ``min_world_size..max_world_size``), then its tensor dimension (``mesh_shapes``), an MLP
    chain of 2..max_layers layers of widths 1..max_width (odd widths shard unevenly), biases on
    or off, 1..3 rows per rank, sequence parallelism on or off, clipping on or off
    (``TP_CLIP_NORMS``), 1..max_steps steps of 1..max_accumulation micro-batches, and a
    one-group SGD, Adam or AdamW optimizer. ``precision``: ``fp64`` (or None) only."""
    if precision not in (None, *TP_PRECISIONS):
        raise InvalidArgument(
            "precision",
            precision,
            f"must be one of {list(TP_PRECISIONS)} for a tensor-parallel plan (its cases are "
            "float64 only)",
        )
    if dtype != "float64":
        raise ValueError(f"dtype={dtype!r}: tensor-parallel cases are float64")
    _check_bounds("steps", 1, max_steps)
    _check_bounds("accumulation", 1, max_accumulation)
    _check_bounds("layers", 2, max_layers, floor=2)
    _check_bounds("width", 1, max_width)
    if world_sizes is not None:
        w = draw(world_size_draws(world_sizes))
    else:
        _check_bounds("world_size", min_world_size, max_world_size)
        w = draw(st.integers(min_world_size, max_world_size))
    _, tp = draw(st.sampled_from(mesh_shapes(w)))
    n = draw(st.integers(2, max_layers))
    # A column-wise layer's width is at least the tensor dimension, and 2 (Note [Widths a
    # column-wise layer is drawn at]); the others from 1.
    widths = tuple(
        tp * draw(st.integers(2 if tp == 1 else 1, max(2, max_width // tp)))
        if i % 2 == 0 and i < n - n % 2
        else draw(st.integers(1, max_width))
        for i in range(n)
    )
    spec = MLPSpec(
        in_features=draw(st.integers(1, max_width)),
        widths=widths,
        bias=draw(st.booleans()),
    )
    name = draw(st.sampled_from(("sgd", "adam", "adamw")))
    group = GroupSpec(
        params=(),
        lr=draw(st.sampled_from([0.05, 0.1] if name == "sgd" else [1e-3, 1e-2])),
        weight_decay=draw(st.sampled_from([0.0, 0.1])),
        momentum=draw(st.sampled_from([0.0, 0.9])) if name == "sgd" else 0.0,
    )
    return TPCase(
        model=spec,
        world_size=w,
        batch_sizes=tuple(draw(st.lists(st.integers(1, 3), min_size=w, max_size=w))),
        steps=draw(st.integers(1, max_steps)),
        accumulation=draw(st.integers(1, max_accumulation)),
        optimizer=OptimizerSpec(name=name, groups=(group,)),
        seed=draw(st.integers(0, 2**16)),
        clip_norm=draw(st.sampled_from(TP_CLIP_NORMS)),
        tensor_parallel=tp,
        sequence_parallel=draw(st.booleans()),
    )
