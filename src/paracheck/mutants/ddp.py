"""Broken DDP variants. Each differs from a correct one by one realistic bug, named in its
docstring's first line: a subclass that overrides one small step of the correct variant (marked
``BUG``), or a step rebuilt from the correct variant's source with the bug's line edited
(``edited``); everything else is inherited from the correct variant."""

from __future__ import annotations

import functools
import random
import weakref

import torch
import torch.distributed as dist

from paracheck.ddp.bucketed import BucketedDDP, _fill_and_reduce
from paracheck.ddp.flat import FlatDDP
from paracheck.ddp.naive import NaiveDDP
from paracheck.ddp.overlapped import OverlappedDDP
from paracheck.ddp.plan import MB, Bucket, BucketPlan, plan_buckets
from paracheck.mutants._edit import edited

__all__ = [
    "NoDivideDDP",
    "VectorsNotAveragedDDP",
    "LastBucketNeverReducedDDP",
    "OversizedParamDroppedDDP",
    "NoInitialBroadcastDDP",
    "BuffersNotBroadcastDDP",
    "MissingWaitDDP",
    "PartialCopyBackDDP",
    "SkipNoneGradDDP",
    "StaleAccumulatorDDP",
    "HooksRegisteredTwiceDDP",
    "FlagsAveragedDDP",
    "PresenceFromHooksDDP",
    "ReadinessPerStepDDP",
    "HandlesPerStepDDP",
    "RoundStartsInForwardDDP",
    "BucketCapIgnoredDDP",
    "BucketCapInBytesDDP",
    "MixedDtypeBucketDDP",
    "FlatBufferFirstDtypeDDP",
    "ReducedInBfloat16DDP",
    "ArrivalOrderDDP",
    "CastAfterCommunicatingDDP",
]


class NoDivideDDP(FlatDDP):
    """FlatDDP that forgets to divide the summed gradients by the world size."""

    def _average(self, summed: torch.Tensor) -> torch.Tensor:
        return summed  # BUG: no .div_(world_size)


class VectorsNotAveragedDDP(NaiveDDP):
    """NaiveDDP that only reduces matrices: 1-D parameters (biases) keep their local gradients."""

    def _params_to_reduce(self) -> list:
        # BUG: meant to skip scalars, skips every bias
        return [p for p in super()._params_to_reduce() if p.dim() >= 2]


class LastBucketNeverReducedDDP(BucketedDDP):
    """BucketedDDP that reduces a bucket only once it is full: the last, partly filled bucket is
    never reduced (its gradients are divided by the world size all the same)."""

    def _reduce(self, k: int, fill: tuple):
        b = self.plan.buckets[k]
        if k == len(self.plan.buckets) - 1 and b.nbytes < self.plan.cap_bytes:
            return _fill_and_reduce(*fill, self._sent[k], reduce=False)  # BUG: "not full yet"
        return super()._reduce(k, fill)


def _plan_dropping_oversized(numels, element_sizes, *, bucket_size_mb, keys=None) -> BucketPlan:
    cap = bucket_size_mb * MB
    keep = [
        i for i in range(len(numels)) if numels[i] * element_sizes[i] <= cap
    ]  # BUG: `continue` on too-big
    sub = plan_buckets(
        [numels[i] for i in keep],
        [element_sizes[i] for i in keep],
        bucket_size_mb=bucket_size_mb,
        keys=None if keys is None else [keys[i] for i in keep],
    )
    buckets = tuple(
        Bucket(tuple(keep[j] for j in b.params), b.offsets, b.numel, b.nbytes, b.key)
        for b in sub.buckets
    )
    return BucketPlan(buckets, sub.cap_bytes)


class OversizedParamDroppedDDP(BucketedDDP):
    """BucketedDDP whose planner skips a parameter larger than the cap instead of giving it a
    bucket of its own: that parameter is never reduced and keeps its local gradient. The planner
    is the bug; the hook override is not: a parameter without a slot has nothing for the hook to
    do, where BucketedDDP's hook would raise on the missing view instead of letting the wrong
    gradient through."""

    planner = staticmethod(_plan_dropping_oversized)

    def _grad_ready(self, i: int) -> None:
        if self._bucket_of[i] is not None:  # a dropped parameter has no bucket, hence no hook work
            super()._grad_ready(i)


class NoInitialBroadcastDDP(FlatDDP):
    """FlatDDP without the initial broadcast: ranks that start from different weights stay apart."""

    def _broadcast_state(self) -> None:
        pass  # BUG: "every rank seeds the same RNG anyway"


class BuffersNotBroadcastDDP(FlatDDP):
    """FlatDDP that broadcasts parameters but not buffers at construction."""

    def _state_tensors(self) -> list[torch.Tensor]:
        return list(self.module.parameters())  # BUG: self.module.buffers() forgotten


class MissingWaitDDP(BucketedDDP):
    """BucketedDDP that never waits for its all-reduces (they were launched during backward, "so
    they are done by now"): the division and the optimizer race with communication still in
    flight."""

    def _wait(self, k: int) -> None:
        pass  # BUG: the handle is never waited for


class PartialCopyBackDDP(FlatDDP):
    """FlatDDP whose copy-back loop stops one parameter short: the last parameter of the flat
    buffer keeps its local, unaveraged gradient."""

    def _scatter_back(self, params, flat: torch.Tensor, flags: torch.Tensor) -> None:
        super()._scatter_back(params[:-1], flat, flags[:-1])  # BUG: off by one at the end


class SkipNoneGradDDP(NaiveDDP):
    """NaiveDDP without presence flags that skips parameters whose *local* gradient is None: when
    a data-dependent branch is used on some ranks only, ranks issue different numbers of
    all-reduces and the job hangs (or pairs collectives of different tensors)."""

    def _params_to_reduce(self) -> list:
        # BUG: a local decision about a collective
        return [p for p in self.trainable if p.grad is not None]


class StaleAccumulatorDDP(FlatDDP):
    """FlatDDP that accumulates gradients into a persistent flat buffer with ``+=`` and never
    clears it: ``.grad`` already holds the earlier micro-steps (and steps), so gradients that were
    reduced once are added and reduced again."""

    _acc = None

    def _flatten(self, params) -> torch.Tensor:
        flat = super()._flatten(params)
        if self._acc is None:
            self._acc = torch.zeros_like(flat)
        self._acc += flat  # BUG: never zeroed after the all-reduce
        return self._acc


def _prediv_hook(ref, k: int, param: torch.Tensor) -> None:
    ddp = ref()
    if ddp is not None:
        ddp._prediv_ready(k)


class HooksRegisteredTwiceDDP(OverlappedDDP):
    """OverlappedDDP that pre-divides each gradient by the world size in its hook (as torch DDP
    does) and registers hooks by walking ``named_parameters(remove_duplicate=False)``: a tied
    parameter gets two hooks and is divided twice.

    More than one override: OverlappedDDP divides after the all-reduce, where a second hook on a
    parameter is harmless (its hook only marks the parameter ready), so the bug exists only in
    the pre-dividing design, which this class adds (``_prediv_ready``, ``_launch``, ``_average``,
    ``finish_gradient_synchronization``) before the one buggy line, the hook registration in
    ``__init__``. Putting pre-division into OverlappedDDP for the mutant's sake would cost the
    correct variant a division per parameter in its hooks."""

    def __init__(self, module, *, process_group=None):
        super().__init__(module, process_group=process_group)
        for h in self._hooks:
            h.remove()
        position = {id(p): k for k, p in enumerate(self._order)}
        ref = weakref.ref(self)
        self._hooks = [
            p.register_post_accumulate_grad_hook(
                functools.partial(_prediv_hook, ref, position[id(p)])
            )
            for _, p in module.named_parameters(remove_duplicate=False)  # BUG: one hook per *name*
            if p.requires_grad
        ]
        self._divided = [False] * len(self._order)

    def _prediv_ready(self, k: int) -> None:
        if not self._sync_enabled:
            return
        self._order[k].grad.div_(self.world_size)
        self._divided[k] = True
        if not self._ready[k]:
            self._grad_ready(k)

    def _launch(self, k: int) -> None:
        p = self._order[k]
        if not self._divided[k] and p.grad is not None:
            p.grad.div_(self.world_size)
        super()._launch(k)

    def _average(self, p) -> None:
        pass  # divided before the all-reduce

    def finish_gradient_synchronization(self) -> None:
        super().finish_gradient_synchronization()
        self._divided = [False] * len(self._order)


class FlagsAveragedDDP(BucketedDDP):
    """BucketedDDP that divides the presence counts by the world size, as it divides the gradients,
    and then drops gradients whose count is below 1: a parameter used on some ranks only loses its
    gradient on the ranks that did not use it."""

    _settle_absent = edited(
        BucketedDDP._settle_absent,
        (
            "counts = flags.tolist()",
            "counts = flags.div_(self.world_size).tolist()  # BUG: counts, not gradients",
        ),
        ("if counts[i] > 0 else None", "if counts[i] >= 1 else None"),
    )


class PresenceFromHooksDDP(BucketedDDP):
    """BucketedDDP that flags a parameter present only if its hook fired in the synchronising
    backward: a gradient from no_sync() micro-steps, from an earlier micro-step, or the zeros of
    ``zero_grad(set_to_none=False)`` is reduced but flagged absent, and dropped (None) where no
    rank used the parameter in that last backward."""

    def _adopt(self, i: int) -> bool:
        has = super()._adopt(i)
        return has and self._ready[i]  # BUG: "present" = "my hook fired", not "I have a gradient"


class ReadinessPerStepDDP(BucketedDDP):
    """BucketedDDP that keeps its per-bucket readiness for the whole step (reset in
    ``finish_gradient_synchronization``) instead of once per backward: a second synchronised
    backward in the same window finds every bucket already sent and only adds its local gradient
    to the averaged one, so the result is avg(g1) + g2_local instead of avg(g1) + avg(g2)."""

    def _grad_ready(self, i: int) -> None:
        if self._reduced_through is not None:
            self._adopt(i)  # BUG: every bucket of this window was sent by its first backward
            return
        super()._grad_ready(i)


class HandlesPerStepDDP(OverlappedDDP):
    """OverlappedDDP that launches only in the first backward of a window: a second backward adds
    into gradients already averaged, and nothing reduces what it added."""

    def _grad_ready(self, k: int) -> None:
        if self._reduced_through is not None:
            return  # BUG: "the window's all-reduces were launched by its first backward"
        super()._grad_ready(k)


class RoundStartsInForwardDDP(BucketedDDP):
    """BucketedDDP that opens a round in *forward* (where torch DDP prepares its reducer) instead
    of at the first hook of each backward: two backward passes of one forward
    (``retain_graph=True``) queue one end-of-backward callback, so the second one's buckets are
    launched by its hooks but never waited for, averaged or flagged."""

    def forward(self, *args, **kwargs):
        self._round_open = False  # BUG: the round boundary is taken to be the forward
        return super().forward(*args, **kwargs)

    def _close_round(self) -> None:
        pass  # (closed by the next forward instead)


def _plan_one_bucket(numels, element_sizes, *, bucket_size_mb, keys=None) -> BucketPlan:
    return plan_buckets(
        numels, element_sizes, bucket_size_mb=None, keys=keys
    )  # BUG: the cap is never passed on


class BucketCapIgnoredDDP(BucketedDDP):
    """BucketedDDP whose planner never receives the cap: one bucket per dtype, whatever
    ``bucket_size_mb`` says (the gradients are right; only the bucket structure shows it)."""

    planner = staticmethod(_plan_one_bucket)


def _plan_cap_in_bytes(numels, element_sizes, *, bucket_size_mb, keys=None) -> BucketPlan:
    cap = None if bucket_size_mb is None else bucket_size_mb / MB  # BUG: MB read as bytes
    return plan_buckets(numels, element_sizes, bucket_size_mb=cap, keys=keys)


class BucketCapInBytesDDP(BucketedDDP):
    """BucketedDDP that compares ``bucket_size_mb`` with byte counts: a cap meant to hold many
    parameters holds about one byte, so every parameter is alone in its bucket (the gradients are
    right; only the bucket structure shows it)."""

    planner = staticmethod(_plan_cap_in_bytes)


def _plan_ignoring_dtype(numels, element_sizes, *, bucket_size_mb, keys=None) -> BucketPlan:
    return plan_buckets(
        numels, element_sizes, bucket_size_mb=bucket_size_mb
    )  # BUG: keys (dtype, device) dropped


class MixedDtypeBucketDDP(BucketedDDP):
    """BucketedDDP whose planner ignores dtypes: a bucket mixing float32 and float64 parameters
    gets one flat buffer in its first parameter's dtype, whose slices cannot be the gradients of
    the others (assigning them raises)."""

    planner = staticmethod(_plan_ignoring_dtype)


class FlatBufferFirstDtypeDDP(FlatDDP):
    """FlatDDP that flattens every gradient into a buffer of the first parameter's dtype: with a
    float32 first layer, float64 gradients are truncated to float32 before the all-reduce."""

    # BUG: every gradient cast to the first parameter's dtype before the concatenation
    _flatten = edited(
        FlatDDP._flatten,
        (
            "[self._local_or_zero(p).reshape(-1) for p in params]",
            "[self._local_or_zero(p).reshape(-1).to(params[0].dtype) for p in params]",
        ),
    )


class ReducedInBfloat16DDP(FlatDDP):
    """FlatDDP that communicates in bfloat16 to halve its traffic (as a compression hook would):
    every gradient is rounded to 8 significant bits before the all-reduce and summed in
    bfloat16, where the declared gradients, and the oracle's, are float32 or float64."""

    def finish_gradient_synchronization(self) -> None:
        if self.world_size == 1 or not self._sync_enabled or not self.trainable:
            return
        params = self.trainable
        flat = self._flatten(params)
        low = flat.to(torch.bfloat16)  # BUG: reduced in bfloat16
        dist.all_reduce(low, group=self.process_group)
        flat.copy_(low)
        n = flat.numel() - len(params)
        self._scatter_back(params, self._average(flat[:n]), flat[n:])


class ArrivalOrderDDP(FlatDDP):
    """FlatDDP reducing as a parameter server does: rank 0 adds each parameter's contributions in
    the order they arrive and broadcasts the sums. The order changes from run to run (here a
    fresh order per parameter and step, from the operating system's entropy), so the sums round
    differently in each run: within every tolerance of the oracle, identical on every rank, and
    never reproducible bitwise."""

    _order = random.SystemRandom()

    def finish_gradient_synchronization(self) -> None:
        if self.world_size == 1 or not self._sync_enabled or not self.trainable:
            return
        params = self.trainable
        flat = self._flatten(params)
        parts = [torch.empty_like(flat) for _ in range(self.world_size)]
        dist.all_gather(parts, flat, group=self.process_group)
        if dist.get_rank(self.process_group) == 0:
            start = 0
            for length in [p.numel() for p in params] + [len(params)]:
                ranks = list(range(self.world_size))
                self._order.shuffle(ranks)  # BUG: the order contributions arrive in
                piece = flat[start : start + length]
                piece.copy_(parts[ranks[0]][start : start + length])
                for r in ranks[1:]:
                    piece.add_(parts[r][start : start + length])
                start += length
        src = dist.get_global_rank(self.process_group, 0) if self.process_group is not None else 0
        dist.broadcast(flat, src=src, group=self.process_group)
        n = flat.numel() - len(params)
        self._scatter_back(params, self._average(flat[:n]), flat[n:])


class CastAfterCommunicatingDDP(FlatDDP):
    """FlatDDP declaring a float32 reduction (Note [Declared reduction dtype]) that casts after
    communicating: each gradient is all-reduced in its own dtype and only the sums are cast to
    float32, so bfloat16 gradients are summed in bfloat16 (a bit lost per addition) and sent in
    it, where the declaration promises float32 sums."""

    paracheck_reduce_dtype = "float32"

    def finish_gradient_synchronization(self) -> None:
        if self.world_size == 1 or not self._sync_enabled or not self.trainable:
            return
        params = self.trainable
        flat = self._flatten(params)
        dist.all_reduce(flat, group=self.process_group)
        flat = flat.float()  # BUG: the cast belongs before the all-reduce
        n = flat.numel() - len(params)
        self._scatter_back(params, self._average(flat[:n]), flat[n:])
