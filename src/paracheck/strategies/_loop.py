"""Cases for whole training steps (the ``loop`` kind): a small language model whose targets carry
padding, micro-batches whose valid tokens differ by rank and by micro-batch, and partial last
accumulation windows (Note [Loss semantics] in ``paracheck.cases``)."""

from __future__ import annotations

from hypothesis import strategies as st

from paracheck.cases import AUTOCAST_DTYPES, LOSSES, Case, GroupSpec, OptimizerSpec
from paracheck.strategies._core import (
    _check_bounds,
    _check_precision,
    from_seed,
    precision_settings,
    world_size_draws,
)
from paracheck.workloads.lm import LMSpec

__all__ = ["AUTOCAST_PRECISIONS", "LOOP_LOSSES", "LOOP_PRECISIONS", "loop_cases", "loop_precision"]

LOOP_LOSSES = tuple(loss for loss in LOSSES if loss != "rank-mean")
# A loop computes in the parameters' dtype: the precisions without autocast or a scaler, which a
# loop applies itself (``train_step`` takes neither).
LOOP_PRECISIONS = ("fp64", "fp32", "bf16")
# The precision family of a loop that declares its autocast dtype (Note [A loop's own precision]).
AUTOCAST_PRECISIONS = {"float16": "fp16", "bfloat16": "bf16"}


def loop_precision(precision: str | None, autocast: str | None) -> str | None:
    """The precision a loop's cases are drawn at: ``precision`` as given for a loop without its
    own autocast, the autocast's family (fp16, bf16) for one with it; a ValueError where the two
    disagree."""
    if precision is not None:
        _check_precision(precision)
    if autocast is None:
        if precision is not None and precision not in LOOP_PRECISIONS:
            raise ValueError(
                f"precision={precision!r}: a training loop applies autocast and loss scaling "
                f"itself; a loop without a declared autocast (paracheck_autocast) is checked at "
                f"{', '.join(LOOP_PRECISIONS)}"
            )
        return precision
    if autocast not in AUTOCAST_DTYPES:
        raise ValueError(f"autocast={autocast!r} must be one of {sorted(AUTOCAST_DTYPES)}")
    family = AUTOCAST_PRECISIONS[autocast]
    if precision not in (None, "fp32", family):
        raise ValueError(
            f"precision={precision!r}: the loop declares autocast={autocast!r} "
            f"(paracheck_autocast), so its cases are {family}: give --precision {family} or none"
        )
    return family


@st.composite
def loop_cases(
    draw,
    *,
    world_sizes=None,
    min_world_size: int = 1,
    max_world_size: int = 4,
    max_steps: int = 3,
    max_accumulation: int = 3,
    dtype: str = "float64",
    precision: str | None = None,
    loss: str = "token-mean",
    clip_norm: float | None = None,
    autocast: str | None = None,
    scaler: bool = False,
):
    """Cases for a ``train_step`` that minimises ``loss`` (``"token-mean"`` or ``"batch-mean"``).

    Drawn: world size, rows per rank (different ranks, different token counts), steps,
    accumulation and a partial last window, padding (and, for token-mean, an all-padding
    micro-batch), a one-group SGD/Adam/AdamW optimizer, and a language model of one or two layers.
    ``precision`` is ``fp64``, ``fp32`` or ``bf16`` (bfloat16 parameters; it replaces ``dtype``).
    ``clip_norm``: the step clips the global gradient norm to it (every case). ``autocast``: the
    step runs its forwards under ``torch.autocast`` in this dtype (``"float16"``, ``"bfloat16"``)
    over float32 parameters, and ``scaler``: it takes a GradScaler (float16 only), so every case
    scales its loss, overflowing in its first backward or not (Note [A loop's own precision]).
    """
    if loss not in LOOP_LOSSES:
        raise ValueError(f"loss={loss!r} must be one of {list(LOOP_LOSSES)}")
    precision = loop_precision(precision, autocast)
    if scaler and autocast != "float16":
        raise ValueError(f"scaler=True with autocast={autocast!r}: a GradScaler is for float16")
    if autocast is not None:
        dtype = "float32"
    elif precision is not None:
        dtype = {"fp64": "float64", "fp32": "float32", "bf16": "bfloat16"}[precision]
    _check_bounds("steps", 1, max_steps)
    _check_bounds("accumulation", 1, max_accumulation)
    if world_sizes is not None:
        w = draw(world_size_draws(world_sizes))
    else:
        _check_bounds("world_size", min_world_size, max_world_size)
        w = draw(st.integers(min_world_size, max_world_size))
    padded = draw(st.booleans())
    empty_micro = padded and loss == "token-mean" and draw(st.booleans())
    accumulation = draw(st.integers(1, max_accumulation))
    steps = draw(st.integers(1, max_steps))
    last_window = None
    if accumulation > 1 and draw(st.booleans()):
        last_window = draw(st.integers(1, accumulation - 1))
    rows = tuple(draw(st.lists(st.integers(1, 3), min_size=w, max_size=w)))
    spec = LMSpec(
        vocab_size=draw(st.sampled_from([7, 16])),
        context_length=draw(st.integers(2, 5)),
        d_model=8,
        d_ff=draw(st.sampled_from([8, 12])),
        num_layers=draw(st.integers(1, 2)),
        num_heads=2,
    )
    name = draw(st.sampled_from(("sgd", "adam", "adamw")))
    group = GroupSpec(
        params=(),
        lr=draw(st.sampled_from([0.05, 0.1] if name == "sgd" else [1e-3, 1e-2])),
        weight_decay=draw(st.sampled_from([0.0, 0.1])),
        momentum=draw(st.sampled_from([0.0, 0.9])) if name == "sgd" else 0.0,
    )
    # Adam and AdamW below float32 too: a loop's step is judged on the gradients it handed its
    # optimizer, where the oracle's Adam sees the same signs (Note [Precision from the seed]).
    seed = draw(st.integers(0, 2**16))
    loss_scale = None
    if scaler:
        # The fp16 precision's scales (Note [Precision from the seed]), from the seed as there.
        loss_scale = from_seed(seed, [s for _, _, s in precision_settings("fp16") if s])
    return Case(
        model=spec,
        world_size=w,
        batch_sizes=rows,
        steps=steps,
        accumulation=accumulation,
        optimizer=OptimizerSpec(name=name, groups=(group,)),
        seed=seed,
        dtype=dtype,
        autocast=autocast,
        loss_scale=loss_scale,
        loss=loss,
        padded=padded,
        empty_micro=empty_micro,
        last_window=last_window,
        clip_norm=clip_norm,
    )
