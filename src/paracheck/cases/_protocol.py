"""The training protocol of a case (``paracheck.cases``): seeds, the model, the batches and the
loss of every rank, each a pure function of the case.

Note [Determinism]
    Every tensor a case needs is drawn from a private ``torch.Generator`` seeded by a pure function
    of (case.seed, purpose, step, micro-step, rank). No process touches the global RNG on the
    case's behalf, so a rank that ran a hundred earlier cases builds bitwise the same model and
    batches as a fresh process and as the oracle.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from paracheck.cases._case import IGNORE_INDEX
from paracheck.workloads import build_model
from paracheck.workloads.user import build_user_model, user_batch, user_loss

if TYPE_CHECKING:
    from paracheck.cases._case import Case

__all__ = [
    "batch_for",
    "build_case_model",
    "init_seed",
    "loss_fn",
    "micro_batches",
    "step_loss",
    "valid_tokens",
]


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
    built in float32 and then rounded (or, with ``masters``, left in float32: the masters). A
    case's ``user_model`` is built by the user's builder (Note [A user's model])."""
    if case.user_model is not None:
        dtype = torch.float32 if case.masters_from_float32 else case.torch_dtype
        model = build_user_model(case.user_model, init_seed(case, rank), dtype, device)
        return model if masters or not case.masters_from_float32 else model.to(case.torch_dtype)
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
    if case.user_model is not None:
        seed = _mix(case.seed, 2, step, micro, rank)
        return user_batch(case.user_model, seed, n, case.torch_dtype, device)
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
    if case.user_model is not None:
        return user_loss(case.user_model, output, target)
    spec: Any = case.model  # an MLPSpec, ToySpec or LMSpec
    if spec.kind == "lm":
        return torch.nn.functional.cross_entropy(output.flatten(0, 1).float(), target.flatten())
    return torch.nn.functional.mse_loss(output.to(target.dtype), target)
