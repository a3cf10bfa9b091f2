"""Broken DDP variants. Each differs from a correct one by one realistic bug, named in its
docstring's first line; everything else is inherited from the correct variant."""

from __future__ import annotations

import functools
import weakref

import torch
import torch.distributed as dist

from paracheck.ddp.bucketed import BucketedDDP
from paracheck.ddp.flat import FlatDDP
from paracheck.ddp.naive import NaiveDDP
from paracheck.ddp.overlapped import OverlappedDDP
from paracheck.ddp.plan import MB, Bucket, BucketPlan, plan_buckets

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
]


class NoDivideDDP(FlatDDP):
    """FlatDDP that forgets to divide the summed gradients by the world size."""

    def finish_gradient_synchronization(self) -> None:
        if self.world_size == 1 or not self._sync_enabled or not self.trainable:
            return
        params = self.trainable
        flags = self._presence(params)
        flat = torch.cat([self._local_or_zero(p).reshape(-1) for p in params] + [flags])
        dist.all_reduce(flat, group=self.process_group)
        n = flat.numel() - len(params)
        self._scatter_back(params, flat[:n], flat[n:])  # BUG: no .div_(world_size)


class VectorsNotAveragedDDP(NaiveDDP):
    """NaiveDDP that only reduces matrices: 1-D parameters (biases) keep their local gradients."""

    def finish_gradient_synchronization(self) -> None:
        if self.world_size == 1 or not self._sync_enabled:
            return
        flags = self._presence(self.trainable)
        dist.all_reduce(flags, group=self.process_group)
        for p, flag in zip(self.trainable, flags.tolist()):
            if flag == 0 or p.dim() < 2:  # BUG: meant to skip scalars, skips every bias
                continue
            if p.grad is None:
                p.grad = self._local_or_zero(p)
            dist.all_reduce(p.grad, group=self.process_group)
            p.grad.div_(self.world_size)


class LastBucketNeverReducedDDP(BucketedDDP):
    """BucketedDDP that reduces a bucket only once it is full: the last, partly filled bucket is
    never reduced (its gradients are divided by the world size all the same)."""

    def _reduce(self, k: int):
        b = self.plan.buckets[k]
        if k == len(self.plan.buckets) - 1 and b.nbytes < self.plan.cap_bytes:
            return None  # BUG: "not full yet", and nothing flushes it
        return super()._reduce(k)


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
    bucket of its own: that parameter is never reduced and keeps its local gradient."""

    planner = staticmethod(_plan_dropping_oversized)

    def _grad_ready(self, i: int) -> None:
        if self._views[i] is not None:  # a dropped parameter has no slot, hence no hook work
            super()._grad_ready(i)


class NoInitialBroadcastDDP(FlatDDP):
    """FlatDDP without the initial broadcast: ranks that start from different weights stay apart."""

    def _broadcast_state(self) -> None:
        pass  # BUG: "every rank seeds the same RNG anyway"


class BuffersNotBroadcastDDP(FlatDDP):
    """FlatDDP that broadcasts parameters but not buffers at construction."""

    def _broadcast_state(self) -> None:
        if self.world_size == 1:
            return
        with torch.no_grad():
            for t in self.module.parameters():  # BUG: self.module.buffers() forgotten
                dist.broadcast(t.data, src=0, group=self.process_group)


class MissingWaitDDP(BucketedDDP):
    """BucketedDDP whose ``finish_gradient_synchronization()`` waits only for the buckets it
    launches itself: the all-reduces launched during backward (by its hooks, and at its end) are
    never waited for, so the division and the optimizer race with communication still in flight."""

    _launched_in_backward = 0

    def finish_gradient_synchronization(self) -> None:
        self._launched_in_backward = self._next
        super().finish_gradient_synchronization()

    def _wait(self, k: int) -> None:
        if k < self._launched_in_backward:
            return  # BUG: the handle is never waited for
        super()._wait(k)


class PartialCopyBackDDP(FlatDDP):
    """FlatDDP whose copy-back loop stops one parameter short: the last parameter of the flat
    buffer keeps its local, unaveraged gradient."""

    def finish_gradient_synchronization(self) -> None:
        if self.world_size == 1 or not self._sync_enabled or not self.trainable:
            return
        params = self.trainable
        flags = self._presence(params)
        flat = torch.cat([self._local_or_zero(p).reshape(-1) for p in params] + [flags])
        dist.all_reduce(flat, group=self.process_group)
        n = flat.numel() - len(params)
        grads = flat[:n].div_(self.world_size)
        self._scatter_back(
            params[:-1], grads, flat[n:-1]
        )  # BUG: off by one at the end of the buffer


class SkipNoneGradDDP(NaiveDDP):
    """NaiveDDP without presence flags that skips parameters whose *local* gradient is None: when
    a data-dependent branch is used on some ranks only, ranks issue different numbers of
    all-reduces and the job hangs (or pairs collectives of different tensors)."""

    def finish_gradient_synchronization(self) -> None:
        if self.world_size == 1 or not self._sync_enabled:
            return
        for p in self.trainable:
            if p.grad is None:  # BUG: a local decision about a collective
                continue
            dist.all_reduce(p.grad, group=self.process_group)
            p.grad.div_(self.world_size)


class StaleAccumulatorDDP(FlatDDP):
    """FlatDDP that accumulates gradients into a persistent flat buffer with ``+=`` and never
    clears it: ``.grad`` already holds the earlier micro-steps (and steps), so gradients that were
    reduced once are added and reduced again."""

    def finish_gradient_synchronization(self) -> None:
        if self.world_size == 1 or not self._sync_enabled or not self.trainable:
            return
        params = self.trainable
        flat = torch.cat(
            [self._local_or_zero(p).reshape(-1) for p in params] + [self._presence(params)]
        )
        if getattr(self, "_acc", None) is None:
            self._acc = torch.zeros_like(flat)
        self._acc += flat  # BUG: never zeroed after the all-reduce below
        dist.all_reduce(self._acc, group=self.process_group)
        n = flat.numel() - len(params)
        self._scatter_back(params, self._acc[:n] / self.world_size, self._acc[n:])


def _prediv_hook(ref, k: int, param: torch.Tensor) -> None:
    ddp = ref()
    if ddp is not None:
        ddp._prediv_ready(k)


class HooksRegisteredTwiceDDP(OverlappedDDP):
    """OverlappedDDP that pre-divides each gradient by the world size in its hook (as torch DDP
    does) and registers hooks by walking ``named_parameters(remove_duplicate=False)``: a tied
    parameter gets two hooks and is divided twice."""

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
    """BucketedDDP that divides the whole bucket, presence flags included, by the world size and
    then drops gradients whose flag is below 1: a parameter used on some ranks only loses its
    gradient on the ranks that did not use it."""

    def _settle_absent(self, k: int) -> None:
        b = self.plan.buckets[k]
        flags = (
            self._flags[k].div_(self.world_size).tolist()
        )  # BUG: the flags are counts, not gradients
        for j in self._absent[k]:
            i = b.params[j]
            self.trainable[i].grad = self._views[i] if flags[j] >= 1 else None


class PresenceFromHooksDDP(BucketedDDP):
    """BucketedDDP that flags a parameter present only if its hook fired in the synchronising
    backward: a gradient from no_sync() micro-steps, from an earlier micro-step, or the zeros of
    ``zero_grad(set_to_none=False)`` is reduced but flagged absent, and dropped (None) where no
    rank used the parameter in that last backward."""

    def _adopt(self, i: int) -> bool:
        has = super()._adopt(i)
        return has and self._ready[i]  # BUG: "present" = "my hook fired", not "I have a gradient"


class ReadinessPerStepDDP(BucketedDDP):
    """BucketedDDP that resets its per-bucket readiness once per step (in
    ``finish_gradient_synchronization``) instead of once per backward: a second synchronised
    backward in the same window finds every bucket already sent and only adds its local gradient
    to the reduced sum, so the result is (sum_r g1 + g2_local) / W instead of avg(g1) + avg(g2)."""

    def _start_round(self) -> None:
        for k in range(len(self._bucket_buffers)):
            self._wait(k)  # BUG: waits, but keeps the round's readiness: nothing is sent again


class HandlesPerStepDDP(OverlappedDDP):
    """OverlappedDDP that keeps its list of handles per step and launches only in the first
    backward of a window: a second backward adds into gradients whose all-reduce is still in
    flight (or done), and nothing reduces what it added."""

    def _start_round(self) -> None:
        pass  # BUG: "the handles are waited for in finish_gradient_synchronization()"


class RoundStartsInForwardDDP(BucketedDDP):
    """BucketedDDP that settles the previous backward's reduction at the next *forward* (where
    torch DDP prepares its reducer) instead of before the next backward accumulates: two backward
    passes of one forward (``retain_graph=True``) leave the second one unreduced."""

    def __init__(self, module, bucket_size_mb=25.0, *, process_group=None):
        super().__init__(module, bucket_size_mb, process_group=process_group)
        for h in self._pre_hooks:
            h.remove()  # BUG: the round boundary is taken to be the forward
        self.register_forward_pre_hook(
            lambda mod, args: mod._start_round() if mod._launched else None
        )


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

    def finish_gradient_synchronization(self) -> None:
        if self.world_size == 1 or not self._sync_enabled or not self.trainable:
            return
        params = self.trainable
        flags = self._presence(params)
        flat = torch.cat(
            [
                self._local_or_zero(p).reshape(-1).to(params[0].dtype) for p in params
            ]  # BUG: one dtype
            + [flags]
        )
        dist.all_reduce(flat, group=self.process_group)
        n = flat.numel() - len(params)
        grads = flat[:n].div_(self.world_size)
        self._scatter_back(params, grads, flat[n:])
