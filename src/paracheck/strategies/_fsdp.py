"""Cases for fully sharded wrappers (the ``fsdp`` kind): the DDP cases without the features a
wrapper that all-gathers per module call cannot take part in (Note [Cases an FSDP is checked on])."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import strategies as st

from paracheck.cases import DELAY_POINTS
from paracheck.check.features import without_all
from paracheck.strategies._core import cases
from paracheck.strategies._reshard import resumed_sometimes

__all__ = ["FSDP_COMPUTE_OFF", "FSDP_OFF", "fsdp_cases"]

# Note [Cases an FSDP is checked on]
#   A sharded module's forward is a collective (its all-gather), so every rank must run the same
#   modules: a branch used on some ranks only (unused-some-ranks) hangs any FSDP, torch's too,
#   and is not drawn. The optimizer is the case's, over the wrapper's parameters, driven by the
#   harness: the features of a sharded optimizer's own interface (step(closure), a state reload,
#   a clip by the wrapper) are not drawn yet, nor is loss scaling; neither is zero_grad() on the
#   module (the wrapper's parameters are the module's). Bucket caps mean nothing to it.
#   A gathered parameter is not a leaf, and autocast caches the cast of leaves only: a tied
#   weight used twice is cast twice and its two contributions summed in float32, where one cached
#   cast would sum them in bfloat16 or float16. The cases say so (``Case.autocast_cache=False``),
#   and the oracle casts at every use too: the same casts in the same places.
FSDP_OFF = (
    "unused-some-ranks",
    "closure",
    "reload",
    "clip",
    "loss-scaling",
    "zero-grad-module",
)
# A wrapper with a compute dtype casts parameters, not buffers or a layer's own float32 casts:
# those features compute in float32 beside bfloat16 activations (Note [Compute dtype of an FSDP]
# in ``paracheck.cases``), and are turned off where the case gets master weights.
FSDP_COMPUTE_OFF = ("buffer", "float32-layer")


# Note [Schedule perturbation]'s draw: where, which rank (taken modulo the world size) and how
# long; None first, so a failure shrinks to the unperturbed case where it needs no delay.
DELAYS = st.one_of(
    st.none(),
    st.tuples(st.sampled_from(DELAY_POINTS), st.integers(0, 3), st.sampled_from((0.002, 0.01))),
)


def _delayed(case, delay):
    if delay is None:
        return case
    at, rank, seconds = delay
    return replace(case, delay_at=at, delay_rank=rank % case.world_size, delay_s=seconds)


def fsdp_cases(**kwargs):
    """``paracheck.strategies.cases`` with ``FSDP_OFF`` turned off (mapped, not filtered), a
    prefetch depth of 0, 1 or 2 (shrinking to 0; used where the wrapper takes ``prefetch``), and
    a delay drawn on one rank (Note [Schedule perturbation] in ``paracheck.check.ranks.fsdp``)."""
    drawn = st.tuples(cases(**kwargs), st.integers(0, 2), DELAYS).map(
        lambda cpd: _delayed(
            replace(
                without_all(cpd[0], FSDP_OFF),
                autocast_cache=cpd[0].autocast is None,
                prefetch=cpd[1],
            ),
            cpd[2],
        )
    )
    # Drawn last, so that the draws before are those of the plain FSDP cases (Note [Resuming at
    # another world size] in paracheck.check.properties.reshard), among the world sizes of
    # ``cases`` (its defaults where none are given).
    sizes = (
        {"world_sizes": kwargs["world_sizes"]}
        if kwargs.get("world_sizes") is not None
        else {
            "min_world_size": kwargs.get("min_world_size", 1),
            "max_world_size": kwargs.get("max_world_size", 4),
        }
    )
    return drawn.flatmap(lambda case: resumed_sometimes(case, **sizes))
