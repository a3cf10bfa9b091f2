"""The value of a case (``paracheck.cases``): ``Case``, frozen, picklable and JSON-able, and the
constants its fields draw from."""

from __future__ import annotations

import importlib
import json
import math
import re
from dataclasses import asdict, dataclass, field, replace

import torch

from paracheck.cases._compile import check_compiled
from paracheck.cases._optimizer import GroupSpec, OptimizerSpec
from paracheck.workloads import model_spec_from_dict, model_spec_to_dict
from paracheck.workloads.mlp import MLPSpec
from paracheck.workloads.user import UserModel

__all__ = ["AUTOCAST_DTYPES", "DELAY_POINTS", "DTYPES", "IGNORE_INDEX", "LOSSES", "Case"]


# Note [Loss semantics]
#   What one optimizer step minimises, over the step's micro-batches (x, y) of every rank, with
#   CE the cross-entropy over the valid tokens (targets other than IGNORE_INDEX):
#     rank-mean   sum_m mean_r CE_mean(r, m): a wrapper's contract (Case's docstring);
#     token-mean  sum_{r,m} CE_sum(r, m) / T, T the number of valid tokens in the whole step: the
#                 global token mean, independent of how the tokens fall on ranks and micro-batches;
#     batch-mean  mean_{r,m} CE_mean(r, m), over the W * M micro-batches the step has (M is
#                 ``micro_batches(case, step)``: fewer in a partial last window).
#   A loop that normalises each micro-batch by its own tokens computes batch-mean where token-mean
#   is declared; one that divides by the accumulation it was configured with, not by the
#   micro-batches it got, computes batch-mean wrongly in a partial last window.
LOSSES = ("rank-mean", "token-mean", "batch-mean")
# Where a case's drawn delay holds one rank back (Note [Schedule perturbation] in
# ``paracheck.check.ranks.fsdp``): before each of its all-gathers, before each of its
# reduce-scatters, after each forward of a leaf module.
DELAY_POINTS = ("all-gather", "reduce-scatter", "forward")
IGNORE_INDEX = -100
# The bucket cap of a case that names none: torch DistributedDataParallel's default.
DEFAULT_BUCKET_MB = 25.0

# A field only a subclass of Case has -> that class, as "module:Class" (imported where a case is
# read): a tensor-parallel case (Note [A tensor-parallel case] in paracheck.tp).
CASE_CLASSES = {"tensor_parallel": "paracheck.tp:TPCase"}

DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16}
AUTOCAST_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class Case:
    """One data-parallel training run: model, world, data, optimizer and protocol.

    Data-parallel semantics (what every target must compute): rank r's loss at micro-step m is the
    mean over its local batch ``batch_for(case, step, m, r)``; gradients are summed over micro-steps
    and averaged over ranks; the optimizer then steps once. Unequal ``batch_sizes`` make that differ
    from the full-batch mean: this is what DDP computes, so it is what the oracle computes.

    Gradients between steps: ``optimizer.zero_grad()`` clears only the parameters of its groups, so
    a parameter whose group is added later keeps accumulating its (synchronised) gradient across
    steps until then; with ``zero_grad_module`` the target's ``zero_grad()`` clears every parameter
    of the model (a ZeRO wrapper that owns the module). Protocols that leave the result unchanged:
    ``closure`` (the step's work runs inside ``optimizer.step(closure)``) and ``reload_at_step``
    (k >= 1: before step k the optimizer is saved with ``state_dict()``, a fresh one is built over
    the same parameters and groups, and it loads that dict).

    Protocol of one step (``paracheck.check.ranks._common.train_micro_steps``): by default
    ``finish_gradient_synchronization()`` follows every backward; with ``no_sync`` the backward
    passes before the last run inside ``no_sync()``; with ``finish_once`` every micro-step's
    backward runs synchronised and ``finish_gradient_synchronization()`` is called once, after
    the last (the usual training loop). ``double_backward``: each micro-step's loss is
    backpropagated twice (``backward(retain_graph=True)`` then ``backward()``), so its gradient
    counts twice. ``unbounded_bucket``: the constructor gets ``bucket_size_mb=None`` (one
    unbounded bucket) and ``bucket_size_mb`` is ignored. The three were added last, with defaults,
    so older cases still load.

    ``clip_norm``: after the step's gradients are synchronised and before ``step()``, the
    gradients of the parameters in the optimizer's groups are clipped to this global norm, as
    ``torch.nn.utils.clip_grad_norm_`` over all of them in one process would (Note [Clipping
    the global norm] in ``paracheck.check.ranks._common``).

    Precision (Note [Precision of a case]): ``dtype`` is the parameters' dtype; ``autocast``
    (None, ``"bfloat16"`` or ``"float16"``, float32 parameters only) runs every forward under
    ``torch.autocast`` in that dtype; ``loss_scale`` (a power of two, with ``autocast="float16"``)
    scales every loss with ``torch.amp.GradScaler(init_scale=loss_scale)`` (``build_grad_scaler``):
    the gradients are unscaled (``unscale_``) after synchronisation, before clipping and before
    ``scaler.step(optimizer)``, which skips the step wherever a gradient is not finite.

    Loss semantics (Note [Loss semantics]): ``loss`` is ``"rank-mean"`` (above: each micro-step's
    loss is the mean over its batch, summed over micro-steps and averaged over ranks),
    ``"token-mean"`` (the step minimises the mean over every valid token of every rank's every
    micro-batch) or ``"batch-mean"`` (the mean over ranks and micro-batches of each micro-batch's
    mean); the last two are a training loop's (the ``loop`` kind) and need the language model.
    ``padded``: targets are padded with ``IGNORE_INDEX`` (each row keeps a valid prefix, at least
    one token); ``empty_micro``: besides, the last rank's first micro-batch of step 0 is all
    padding (token-mean only). ``last_window``: the last step has this many micro-batches instead
    of ``accumulation`` (a partial last accumulation window).

    ``autocast_cache``: autocast keeps one cast of each leaf parameter per forward (torch's
    default); False casts at every use, as it does for a parameter that is not a leaf (one an
    FSDP gathers): a tied weight's contributions are then summed in the parameter's dtype, not
    in the autocast dtype (Note [Cases an FSDP is checked on]).

    ``master_weights`` (bfloat16 parameters only): the optimizer steps float32 copies of the
    parameters, not the parameters (Note [Master weights]). ``masters_from_float32`` (with
    ``master_weights``): the masters start as the model built in float32 and the parameters as
    those masters rounded, where otherwise the masters start as the bfloat16 parameters: what a
    fully sharded wrapper given the float32 model and ``compute_dtype=torch.bfloat16`` trains
    (Note [Compute dtype of an FSDP]). ``prefetch`` (k >= 0): a fully sharded wrapper whose
    constructor takes ``prefetch`` is built with ``prefetch=k`` (at most k module calls'
    parameters gathered ahead of the running one; what the case computes is unchanged).
    ``delay_at`` (one of ``DELAY_POINTS``, or None): rank ``delay_rank`` sleeps ``delay_s``
    seconds at each such point of its forward and backward passes (Note [Schedule
    perturbation]); what the case computes is unchanged, only when each rank gets there.

    ``user_model`` (a ``UserModel``, or None): the model, batches and loss are the user's
    (``--model``, ``--batch``, ``--loss-fn``: Note [A user's model] in
    ``paracheck.workloads.user``), built from the same seeds the generated ones are (the model
    from ``init_seed``, each batch from its step, micro-step and rank), and ``model`` is unused.
    Added last, and left out of the JSON where None: every case without it, its hash and every
    derandomised sequence are what they were.
    """

    model: object = field(default_factory=MLPSpec)
    world_size: int = 2
    batch_sizes: tuple[int, ...] = (2, 2)
    steps: int = 2
    accumulation: int = 1
    no_sync: bool = False
    optimizer: OptimizerSpec = field(
        default_factory=lambda: OptimizerSpec(groups=(GroupSpec(params=()),))
    )
    bucket_size_mb: float | None = None
    seed: int = 0
    rank_dependent_init: bool = False
    set_to_none: bool = True
    dtype: str = "float64"
    merged_ranks: int = 1
    closure: bool = False
    reload_at_step: int | None = None
    zero_grad_module: bool = False
    finish_once: bool = False
    double_backward: bool = False
    unbounded_bucket: bool = False
    clip_norm: float | None = None
    autocast: str | None = None
    loss_scale: float | None = None
    loss: str = "rank-mean"
    padded: bool = False
    empty_micro: bool = False
    last_window: int | None = None
    autocast_cache: bool = True
    master_weights: bool = False
    masters_from_float32: bool = False
    prefetch: int = 0
    delay_at: str | None = None
    delay_rank: int = 0
    delay_s: float = 0.0
    user_model: UserModel | None = None
    # Note [Resuming at another world size] (paracheck.check.properties.reshard): saved after
    # ``reshard_at_step`` steps, the training goes on in a fresh world of ``reshard_world_size``.
    reshard_at_step: int | None = None
    reshard_world_size: int = 1
    # Note [Compiled cases] (paracheck.cases._compile): the wrapper called through torch.compile
    # with the named setting (None: eagerly).
    compiled: str | None = None

    def __post_init__(self):
        if self.world_size < 1:
            raise ValueError(f"world_size={self.world_size} must be >= 1")
        object.__setattr__(self, "batch_sizes", tuple(int(b) for b in self.batch_sizes))
        if len(self.batch_sizes) != self.world_size:
            raise ValueError(
                f"batch_sizes={self.batch_sizes} must have world_size={self.world_size} entries"
            )
        if any(b < 1 for b in self.batch_sizes):
            raise ValueError(f"batch_sizes={self.batch_sizes} must all be >= 1")
        if self.steps < 1 or self.accumulation < 1:
            raise ValueError(
                f"steps={self.steps} and accumulation={self.accumulation} must be >= 1"
            )
        if self.merged_ranks < 1:
            raise ValueError(f"merged_ranks={self.merged_ranks} must be >= 1")
        if self.bucket_size_mb is not None and not self.bucket_size_mb > 0:
            raise ValueError(
                f"bucket_size_mb={self.bucket_size_mb} must be > 0 (or None: no cap given)"
            )
        if self.reload_at_step is not None and not 1 <= self.reload_at_step < self.steps:
            raise ValueError(
                f"reload_at_step={self.reload_at_step} must be None or in 1..steps-1={self.steps - 1}"
            )
        if self.reshard_at_step is not None and not 1 <= self.reshard_at_step < self.steps:
            raise ValueError(
                f"reshard_at_step={self.reshard_at_step} must be None or in "
                f"1..steps-1={self.steps - 1}"
            )
        if self.reshard_world_size < 1:
            raise ValueError(f"reshard_world_size={self.reshard_world_size} must be >= 1")
        check_compiled(self.compiled)
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype={self.dtype!r} must be one of {sorted(DTYPES)}")
        if self.clip_norm is not None:
            if not self.clip_norm > 0:
                raise ValueError(f"clip_norm={self.clip_norm!r} must be None or > 0")
            if self.closure:
                raise ValueError(
                    "clip_norm with closure=True: the step's gradients are computed inside "
                    "step(closure), where no clipping call can go; choose one"
                )
        if self.autocast is not None:
            if self.autocast not in AUTOCAST_DTYPES:
                raise ValueError(
                    f"autocast={self.autocast!r} must be None or one of {sorted(AUTOCAST_DTYPES)}"
                )
            if self.dtype != "float32":
                raise ValueError(
                    f"autocast={self.autocast!r} with dtype={self.dtype!r}: autocast casts float32 "
                    "parameters only (it leaves float64 alone); use dtype='float32'"
                )
        if self.loss_scale is not None:
            scale = float(self.loss_scale)
            if not (scale > 0 and math.frexp(scale)[0] == 0.5):
                raise ValueError(f"loss_scale={self.loss_scale!r} must be None or a power of two")
            if self.autocast != "float16":
                raise ValueError(
                    f"loss_scale={self.loss_scale!r} with autocast={self.autocast!r}: loss "
                    "scaling is for float16 compute (autocast='float16')"
                )
            if self.closure:
                raise ValueError(
                    "loss_scale with closure=True: GradScaler.step() takes no closure; choose one"
                )
        if self.master_weights and self.dtype != "bfloat16":
            raise ValueError(
                f"master_weights=True with dtype={self.dtype!r}: master weights are float32 "
                "copies of parameters narrower than float32; use dtype='bfloat16'"
            )
        if self.prefetch < 0:
            raise ValueError(f"prefetch={self.prefetch} must be >= 0")
        if self.delay_at is not None:
            if self.delay_at not in DELAY_POINTS:
                raise ValueError(
                    f"delay_at={self.delay_at!r} must be None or one of {list(DELAY_POINTS)}"
                )
            if not 0 <= self.delay_rank < self.world_size:
                raise ValueError(
                    f"delay_rank={self.delay_rank} must be a rank of world_size={self.world_size}"
                )
            if not 0 < self.delay_s <= 1:
                raise ValueError(f"delay_s={self.delay_s!r} must be in (0, 1] seconds")
        if self.masters_from_float32 and not self.master_weights:
            raise ValueError(
                "masters_from_float32=True needs master_weights=True: it says where the masters "
                "start"
            )
        if self.finish_once and self.no_sync:
            raise ValueError(
                "finish_once=True and no_sync=True are two accumulation protocols: choose one"
            )
        if self.loss not in LOSSES:
            raise ValueError(f"loss={self.loss!r} must be one of {list(LOSSES)}")
        lm = getattr(self.model, "kind", None) == "lm" and self.user_model is None
        if (self.loss != "rank-mean" or self.padded) and not lm:
            raise ValueError(
                f"loss={self.loss!r}, padded={self.padded}: token losses and padding need the "
                "language model (an LMSpec)"
            )
        if self.empty_micro and not (self.padded and self.loss == "token-mean"):
            raise ValueError(
                "empty_micro=True needs padded=True and loss='token-mean' (the mean of an empty "
                "micro-batch is not defined)"
            )
        if self.last_window is not None and not 1 <= self.last_window < self.accumulation:
            raise ValueError(
                f"last_window={self.last_window} must be None or in 1..accumulation-1="
                f"{self.accumulation - 1}"
            )

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def bucket_mb(self) -> float:
        """The bucket cap a target is given, in MB: ``bucket_size_mb``, or torch DDP's 25 MB where
        the case names none (``unbounded_bucket`` aside, which passes None: one bucket)."""
        return DEFAULT_BUCKET_MB if self.bucket_size_mb is None else self.bucket_size_mb

    def with_world_size(self, w: int) -> Case:
        """The same case on ``w`` ranks: batch sizes repeated or cut, and a rank held back kept
        among them (the last one where the world shrank below it)."""
        sizes = (self.batch_sizes * w)[:w]
        return replace(
            self, world_size=w, batch_sizes=sizes, delay_rank=min(self.delay_rank, w - 1)
        )

    def describe(self) -> str:
        """The case in one line, every field that differs from its default named
        (``paracheck.cases._describe``)."""
        from paracheck.cases._describe import describe

        return describe(self)

    # -- JSON -------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        d = asdict(self)
        d["model"] = model_spec_to_dict(self.model)
        if self.user_model is None:
            del d["user_model"]  # a case without it is the JSON it always was
        if self.reshard_at_step is None:  # the same: a case that is not resumed
            del d["reshard_at_step"], d["reshard_world_size"]
        if self.compiled is None:  # the same: a case run eagerly
            del d["compiled"]
        return d

    def to_json(self, indent: int | None = None) -> str:
        text = json.dumps(self.to_dict(), indent=indent, sort_keys=False)
        if indent:
            # Keep lists of scalars on one line: readable cases, not one number per line.
            text = re.sub(
                r"\[\s*([^\[\]{}]*?)\s*\]",
                lambda m: "[" + re.sub(r"\s*\n\s*", " ", m.group(1)) + "]",
                text,
            )
        return text

    @classmethod
    def from_dict(cls, d: dict) -> Case:
        d = dict(d)
        if cls is Case:  # a case of a class with fields of its own: that class reads it
            for name, path in CASE_CLASSES.items():
                if name in d:
                    module, _, attr = path.partition(":")
                    return getattr(importlib.import_module(module), attr).from_dict(d)
        d["model"] = model_spec_from_dict(d["model"])
        opt = dict(d["optimizer"])
        opt["groups"] = tuple(
            GroupSpec(**{**g, "params": tuple(g["params"]), "betas": tuple(g["betas"])})
            for g in opt["groups"]
        )
        d["optimizer"] = OptimizerSpec(**opt)
        d["batch_sizes"] = tuple(d["batch_sizes"])
        if d.get("user_model") is not None:
            d["user_model"] = UserModel.from_dict(d["user_model"])
        return cls(**d)

    @classmethod
    def from_json(cls, text: str) -> Case:
        return cls.from_dict(json.loads(text))
