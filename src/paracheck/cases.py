"""A case: everything one equivalence check needs, as a frozen, picklable, JSON-able value.

The driver sends a ``Case`` (never a model) to every rank; each rank and the oracle rebuild the
same model and the same batches from it. See Note [Determinism] below.

Note [Determinism]
    Every tensor a case needs is drawn from a private ``torch.Generator`` seeded by a pure function
    of (case.seed, purpose, step, micro-step, rank). No process touches the global RNG on the
    case's behalf, so a rank that ran a hundred earlier cases builds bitwise the same model and
    batches as a fresh process and as the oracle.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import warnings
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch

from paracheck.workloads import build_model, model_spec_from_dict, model_spec_to_dict
from paracheck.workloads.mlp import MLPSpec

__all__ = [
    "Case",
    "GroupSpec",
    "OptimizerSpec",
    "batch_for",
    "build_optimizer",
    "build_scheduler",
    "IGNORE_INDEX",
    "LOSSES",
    "micro_batches",
    "step_loss",
    "valid_tokens",
    "step_scheduler",
    "init_seed",
    "AUTOCAST_DTYPES",
    "DTYPES",
    "DELAY_POINTS",
    "SCHEDULERS",
    "build_grad_scaler",
    "forward_context",
]

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

DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16}
AUTOCAST_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
_OPTIMIZERS = ("sgd", "adam", "adamw")


@dataclass(frozen=True)
class GroupSpec:
    """One parameter group: indices into ``list(model.parameters())`` and its hyper-parameters.

    ``add_at_step`` is None for a group given to the constructor; k >= 1 means
    ``optimizer.add_param_group`` is called just before step k (0-based), mid-training.
    """

    params: tuple[int, ...]
    lr: float = 0.05
    weight_decay: float = 0.0
    momentum: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    add_at_step: int | None = None

    def options(self, name: str) -> dict:
        if name == "sgd":
            return {"lr": self.lr, "momentum": self.momentum, "weight_decay": self.weight_decay}
        return {"lr": self.lr, "betas": tuple(self.betas), "weight_decay": self.weight_decay}


@dataclass(frozen=True)
class OptimizerSpec:
    """An optimizer (``sgd``, ``adam``, ``adamw``) over parameter groups.

    ``lr_decay`` multiplies every group's lr after each step, as an LR scheduler would, through
    ``optimizer.param_groups`` (a sharded optimizer must honour that). ``as_generator`` passes a
    single group's parameters as a generator instead of a list.

    ``scheduler`` (None, ``"step"`` or ``"lambda"``, ``SCHEDULERS``) is a torch LR scheduler built on
    the optimizer right after construction and stepped after every ``optimizer.step()``; it reads
    and writes ``param_groups`` (``lr``, ``initial_lr``). ``groups_as_generators`` passes every
    group as a dict whose ``params`` is a generator (consumed once).
    """

    name: str = "sgd"
    groups: tuple[GroupSpec, ...] = ()
    lr_decay: float = 1.0
    as_generator: bool = False
    scheduler: str | None = None
    groups_as_generators: bool = False

    def __post_init__(self):
        if self.name not in _OPTIMIZERS:
            raise ValueError(f"optimizer name={self.name!r} must be one of {_OPTIMIZERS}")
        object.__setattr__(self, "groups", tuple(self.groups))
        if self.scheduler is not None and self.scheduler not in SCHEDULERS:
            raise ValueError(
                f"scheduler={self.scheduler!r} must be None or one of {sorted(SCHEDULERS)}"
            )
        if self.scheduler == "lambda" and any(g.add_at_step is not None for g in self.groups):
            raise ValueError(
                "scheduler='lambda' with a group added by add_param_group: LambdaLR cannot step a "
                "group added after it was built (torch raises); use scheduler='step'"
            )

    @property
    def cls(self) -> type[torch.optim.Optimizer]:
        return {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[
            self.name
        ]


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
        lm = getattr(self.model, "kind", None) == "lm"
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

    def with_world_size(self, w: int) -> Case:
        """The same case on ``w`` ranks: batch sizes repeated or cut, and a rank held back kept
        among them (the last one where the world shrank below it)."""
        sizes = (self.batch_sizes * w)[:w]
        return replace(
            self, world_size=w, batch_sizes=sizes, delay_rank=min(self.delay_rank, w - 1)
        )

    # -- JSON -------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        d = asdict(self)
        d["model"] = model_spec_to_dict(self.model)
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
        d["model"] = model_spec_from_dict(d["model"])
        opt = dict(d["optimizer"])
        opt["groups"] = tuple(
            GroupSpec(**{**g, "params": tuple(g["params"]), "betas": tuple(g["betas"])})
            for g in opt["groups"]
        )
        d["optimizer"] = OptimizerSpec(**opt)
        d["batch_sizes"] = tuple(d["batch_sizes"])
        return cls(**d)

    @classmethod
    def from_json(cls, text: str) -> Case:
        return cls.from_dict(json.loads(text))


def _mix(*parts: int) -> int:
    # A pure 63-bit mix (splitmix-style) so seeds for different purposes never collide in practice.
    h = 0x9E3779B97F4A7C15
    for p in parts:
        h ^= (p + 0x9E3779B97F4A7C15 + (h << 6) + (h >> 2)) & 0xFFFFFFFFFFFFFFFF
        h = (h * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    return h & 0x7FFFFFFFFFFFFFFF


def init_seed(case: Case, rank: int) -> int:
    """Seed of rank ``rank``'s initial model: identical on all ranks unless ``rank_dependent_init``."""
    return _mix(case.seed, 1, rank if case.rank_dependent_init else 0)


def build_case_model(case: Case, rank: int, device="cpu", *, masters: bool = False):
    """Rank ``rank``'s model of ``case``, in ``case.dtype``; with ``case.masters_from_float32``
    built in float32 and then rounded (or, with ``masters``, left in float32: the masters)."""
    if not case.masters_from_float32:
        return build_model(
            case.model, seed=init_seed(case, rank), dtype=case.torch_dtype, device=device
        )
    model = build_model(case.model, seed=init_seed(case, rank), dtype=torch.float32, device=device)
    return model if masters else model.to(case.torch_dtype)


def batch_for(case: Case, step: int, micro: int, rank: int, device="cpu"):
    """(inputs, targets) of rank ``rank`` at (step, micro-step); see Note [Determinism].

    With ``merged_ranks = m`` rank r receives the concatenation of the batches that ranks
    r*m .. r*m+m-1 of an m-times larger world would have received: the metamorphic relation
    "W ranks with equal local batches equal one rank fed all of them" is then a comparison of two
    cases (``paracheck.check.properties.world_size_relation``).
    """
    if case.merged_ranks > 1:
        parts = [
            _batch(case, step, micro, rank * case.merged_ranks + j, case.batch_sizes[rank], device)
            for j in range(case.merged_ranks)
        ]
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
    return _batch(case, step, micro, rank, case.batch_sizes[rank], device)


def _batch(case: Case, step: int, micro: int, rank: int, n: int, device):
    g = torch.Generator().manual_seed(_mix(case.seed, 2, step, micro, rank))
    spec: Any = case.model  # an MLPSpec, ToySpec or LMSpec
    if spec.kind == "lm":
        x = torch.randint(0, spec.vocab_size, (n, spec.context_length + 1), generator=g)
        inputs, targets = x[:, :-1], x[:, 1:].clone()
        if case.padded:
            t = spec.context_length
            valid = torch.randint(1, t + 1, (n,), generator=g)
            if case.empty_micro and step == 0 and micro == 0 and rank == case.world_size - 1:
                valid.zero_()
            targets[torch.arange(t).expand(n, t) >= valid[:, None]] = IGNORE_INDEX
        return inputs.to(device), targets.to(device)
    x = torch.randn(n, spec.in_features, generator=g, dtype=torch.float64)
    y = torch.randn(n, spec.out_features, generator=g, dtype=torch.float64)
    return x.to(device=device, dtype=case.torch_dtype), y.to(device=device, dtype=case.torch_dtype)


def micro_batches(case: Case, step: int) -> int:
    """How many micro-batches each rank has in ``step``: ``accumulation``, or ``last_window`` in the
    last step."""
    if case.last_window is not None and step == case.steps - 1:
        return case.last_window
    return case.accumulation


def valid_tokens(case: Case, step: int) -> int:
    """The valid (not ``IGNORE_INDEX``) targets of ``step`` over every rank and micro-batch."""
    return sum(
        int((batch_for(case, step, m, r)[1] != IGNORE_INDEX).sum())
        for r in range(case.world_size)
        for m in range(micro_batches(case, step))
    )


def step_loss(case: Case, output: torch.Tensor, target: torch.Tensor, step: int) -> torch.Tensor:
    """A rank's share of ``step``'s loss from one micro-batch under ``case.loss`` (Note [Loss
    semantics]): its gradient, summed over the rank's micro-batches and then over ranks (token-mean)
    or averaged over ranks (the others), is the step's gradient."""
    if case.loss == "rank-mean":
        return loss_fn(case, output, target)
    # In the logits' dtype, as a loop computes it (bfloat16 logits in float32).
    logits = output.flatten(0, 1)
    if logits.dtype not in (torch.float32, torch.float64):
        logits = logits.float()
    if case.loss == "token-mean":
        ce = torch.nn.functional.cross_entropy(logits, target.flatten(), reduction="sum")
        return ce / valid_tokens(case, step)
    ce = torch.nn.functional.cross_entropy(logits, target.flatten())
    return ce / micro_batches(case, step)


def loss_fn(case: Case, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The per-rank loss: a mean over the local batch (MSE, or cross-entropy for the LM), computed
    outside autocast in the targets' dtype (float32 for the LM's logits), whatever dtype the
    forward produced."""
    spec: Any = case.model  # an MLPSpec, ToySpec or LMSpec
    if spec.kind == "lm":
        return torch.nn.functional.cross_entropy(output.flatten(0, 1).float(), target.flatten())
    return torch.nn.functional.mse_loss(output.to(target.dtype), target)


# Note [Precision of a case]
#   What a case's precision fixes is where every cast happens, so that the oracle (one process,
#   the CPU) applies the same casts in the same places as the ranks: parameters and gradients of
#   ``dtype``; each forward under ``torch.autocast(device_type, autocast)`` (matmuls and linears in
#   bfloat16 or float16, the loss in float32: ``loss_fn``); gradients synchronised in their own
#   dtype (a float32 parameter's gradient is float32 however the forward computed); and with
#   ``loss_scale``, losses multiplied by the scaler's scale before backward and gradients divided
#   by it after synchronisation (a power of two: exact both ways). The scaler never grows within a
#   case (``GROWTH_INTERVAL`` steps) and backs off to ``loss_scale * BACKOFF``: a case whose loss
#   scale is 2**40 overflows float16 in its first backward on every rank (every step it runs is
#   skipped, and the next runs at 2**8), one at 2**8 does not overflow on these models; so whether a
#   step is skipped is never decided by a value within rounding of float16's largest (65504), where
#   a rank and the oracle summing in another order could decide differently.
GROWTH_INTERVAL = 2**10
BACKOFF = 2.0**-32


# Note [Master weights]
#   Mixed-precision training keeps the model's parameters in bfloat16 for the forward and the
#   backward, and lets the optimizer step float32 copies of them, the master weights (ZeRO's and
#   Megatron's "fp32 master params"): an update smaller than half a bfloat16 ulp of its parameter
#   (lr 1e-3 on a weight of 0.5: the ulp is 2**-8) would be rounded away every step if the
#   bfloat16 parameter itself were stepped, and a model with its learning rate at such values stops
#   learning. With ``Case.master_weights`` the oracle does what such an optimizer does: its
#   optimizer holds one float32 master per parameter (every piece of optimizer state is float32
#   too); before each step a master's gradient is its parameter's synchronised gradient in
#   float32 (exact), and after it each parameter is its master rounded to bfloat16
#   (``paracheck.oracle.train.train``). A sharding target declares master weights with a
#   ``master_params()`` method (``paracheck.check.targets.Target.master_weights``), and its masters
#   are compared with the oracle's after every step (Note [Comparing master weights]).


# Note [Compute dtype of an FSDP]
#   ``FSDP(module, compute_dtype=torch.bfloat16)`` over a float32 module keeps the float32
#   parameters, sharded, as what the optimizer steps, and runs every forward and backward on
#   their bfloat16 copies: the float32 shards are the master weights, and the bfloat16
#   parameters exist only while a module runs. That is ``Case.master_weights`` with the masters
#   starting as the float32 model (``masters_from_float32``): the oracle builds the model in
#   float32, keeps those as its masters and computes with them rounded to bfloat16 (one
#   rounding, float32 -> bfloat16, as the wrapper's cast is). The inputs are the case's, in
#   bfloat16 (a wrapper that casts its floating inputs to ``compute_dtype`` changes nothing).
#   Where the wrapper reduces the bfloat16 gradients (in bfloat16, or upcast to float32 first:
#   torch's ``MixedPrecisionPolicy`` offers both) rounds the mean differently, never what it
#   is: the gradients are compared at bfloat16's tolerance, and the float32 masters' update is
#   judged on the wrapper's own gradients (Note [Comparing master weights]). A buffer or a layer
#   kept in float32 is computed in float32 beside bfloat16 activations, which neither the
#   wrapper nor torch's casts; such cases are not drawn (``paracheck.check.run``).


def forward_context(case: Case, device="cpu"):
    """The context every forward of ``case`` runs in: ``torch.autocast`` with ``case.autocast`` on
    ``device``'s type, or nothing."""
    if case.autocast is None:
        return contextlib.nullcontext()
    return torch.autocast(
        torch.device(device).type,
        dtype=AUTOCAST_DTYPES[case.autocast],
        cache_enabled=case.autocast_cache,
    )


def build_grad_scaler(case: Case, device="cpu"):
    """``torch.amp.GradScaler`` for ``case.loss_scale`` on ``device``'s type, or None."""
    if case.loss_scale is None:
        return None
    return torch.amp.GradScaler(
        torch.device(device).type,
        init_scale=float(case.loss_scale),
        backoff_factor=BACKOFF,
        growth_interval=GROWTH_INTERVAL,
    )


def param_groups(case: Case, params: list, *, late: bool = False) -> list[dict]:
    """Groups for the constructor (``late=False``) or for ``add_param_group`` (``late=True``)."""
    opt = case.optimizer
    named = {i for g in opt.groups for i in g.params}
    rest = [i for i in range(len(params)) if i not in named]
    out = []
    for g in opt.groups:
        if (g.add_at_step is not None) != late:
            continue
        # An empty index tuple means "every parameter no other group names".
        idx = g.params or rest
        d = {"params": [params[i] for i in idx], **g.options(opt.name)}
        if late:
            d["add_at_step"] = g.add_at_step
        out.append(d)
    return out


def build_optimizer(case: Case, params: list, optimizer_cls=None, **extra):
    """The case's optimizer over ``params`` (``list(model.parameters())``).

    ``optimizer_cls`` replaces the torch class with a wrapper that takes
    ``(params, optimizer_cls, **kwargs)`` (the CS336 ShardedOptimizer interface).
    """
    groups = param_groups(case, params)
    opt = case.optimizer
    if opt.groups_as_generators:
        groups = [{**g, "params": (p for p in g["params"])} for g in groups]
    if opt.as_generator and len(groups) == 1:
        first = groups[0]
        params_arg: Iterable[Any] = (p for p in first.pop("params"))
        kwargs = first
    else:
        params_arg, kwargs = groups, {}
    if optimizer_cls is None:
        return opt.cls(params_arg, **kwargs)
    return optimizer_cls(params_arg, opt.cls, **kwargs, **extra)


def add_late_groups(case: Case, optimizer, params: list, step: int) -> None:
    for g in param_groups(case, params, late=True):
        if g.pop("add_at_step") == step:
            optimizer.add_param_group(g)


def params_in_groups(case: Case, params: list, step: int) -> list:
    """The parameters of ``params`` that the case's optimizer holds at step ``step`` (its
    constructor's groups and the groups added at or before ``step``), in ``params`` order."""
    groups = param_groups(case, params) + [
        g for g in param_groups(case, params, late=True) if g["add_at_step"] <= step
    ]
    held = {id(p) for g in groups for p in g["params"]}
    return [p for p in params if id(p) in held]


def apply_lr_schedule(case: Case, optimizer) -> None:
    if case.optimizer.lr_decay != 1.0:
        for group in optimizer.param_groups:
            group["lr"] *= case.optimizer.lr_decay


def _warmup(step: int) -> float:
    # Below 1 from the start: LambdaLR changes every lr when it is constructed, before step 0.
    return (step + 1) / 3 if step < 2 else 0.5


# The case's LR schedulers. LambdaLR covers only the groups present when it is built (torch
# raises when it steps a later one), so cases pair it with constructor groups only.
SCHEDULERS = {
    "step": lambda optimizer: torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5),
    "lambda": lambda optimizer: torch.optim.lr_scheduler.LambdaLR(optimizer, _warmup),
}


def step_scheduler(scheduler) -> None:
    """``scheduler.step()``, or nothing for None. A step the GradScaler skipped never called
    ``optimizer.step()``, and torch warns that the schedule went first; it did not (it follows the
    case's steps, as in real training), so that one warning is not shown."""
    if scheduler is None:
        return
    with warnings.catch_warnings():
        # A regular expression, matched at the message's start: the parentheses escaped.
        warnings.filterwarnings(
            "ignore", message=re.escape("Detected call of `lr_scheduler.step()`")
        )
        scheduler.step()


def build_scheduler(case: Case, optimizer):
    """The case's LR scheduler on ``optimizer`` (None without one). Build it right after the
    optimizer; torch raises TypeError when ``optimizer`` is not a ``torch.optim.Optimizer``."""
    name = case.optimizer.scheduler
    return None if name is None else SCHEDULERS[name](optimizer)
