"""A catalogue of deliberately broken implementations that paracheck's properties must catch.

Each entry is a realistic bug, importable like any user target. ``paracheck selftest`` checks
every one and reports whether it was killed, after how many examples, and the shrunk case.
"""

from __future__ import annotations

from paracheck.mutants._registry import MUTANTS, Mutant, register

__all__ = ["Mutant", "MUTANTS", "MODEL_MUTANTS", "ModelMutant", "register"]


register(
    "ddp-reduced-in-bf16",
    "paracheck.mutants.ddp:ReducedInBfloat16DDP",
    "ddp",
    "float32/float64 gradients are rounded to bfloat16 and summed in bfloat16 for the all-reduce",
)
register(
    "ddp-arrival-order",
    "paracheck.mutants.ddp:ArrivalOrderDDP",
    "ddp",
    "rank 0 adds each parameter's contributions in the order they arrive (any order, run to run) "
    "and broadcasts the sums: correct within rounding, never reproducible",
    properties=("equivalence", "repeatability"),
)
register(
    "ddp-cast-after-communicating",
    "paracheck.mutants.ddp:CastAfterCommunicatingDDP",
    "ddp",
    "declares a float32 reduction but all-reduces bfloat16 gradients in bfloat16 and casts the "
    "sums to float32 afterwards",
    precision="bf16",
)
register(
    "ddp-no-divide",
    "paracheck.mutants.ddp:NoDivideDDP",
    "ddp",
    "gradients are summed over ranks but never divided by the world size",
)
register(
    "ddp-vectors-not-averaged",
    "paracheck.mutants.ddp:VectorsNotAveragedDDP",
    "ddp",
    "1-D parameters (biases) are never all-reduced and keep their local gradients",
)
register(
    "ddp-last-bucket-never-reduced",
    "paracheck.mutants.ddp:LastBucketNeverReducedDDP",
    "ddp",
    "a bucket is reduced only when full, so the last, partly filled bucket never is",
)
register(
    "ddp-oversized-param-dropped",
    "paracheck.mutants.ddp:OversizedParamDroppedDDP",
    "ddp",
    "the bucket planner skips a parameter larger than the cap, which is then never reduced",
)
register(
    "ddp-no-initial-broadcast",
    "paracheck.mutants.ddp:NoInitialBroadcastDDP",
    "ddp",
    "parameters and buffers are not broadcast from rank 0 at construction",
)
register(
    "ddp-buffers-not-broadcast",
    "paracheck.mutants.ddp:BuffersNotBroadcastDDP",
    "ddp",
    "parameters are broadcast at construction, buffers are not",
)
register(
    "ddp-missing-wait",
    "paracheck.mutants.ddp:MissingWaitDDP",
    "ddp",
    "the async all-reduces launched from backward hooks are never waited for",
)
register(
    "ddp-partial-copy-back",
    "paracheck.mutants.ddp:PartialCopyBackDDP",
    "ddp",
    "averaged values are copied back into all but the last parameter of the flat buffer",
)
register(
    "ddp-skip-none-grad",
    "paracheck.mutants.ddp:SkipNoneGradDDP",
    "ddp",
    "a parameter whose local gradient is None is skipped: ranks with different branches hang",
    expect="hang",
)
register(
    "ddp-accumulation-reduced-twice",
    "paracheck.mutants.ddp:StaleAccumulatorDDP",
    "ddp",
    "a persistent accumulation buffer is never cleared, so reduced gradients are reduced again",
)
register(
    "ddp-hooks-registered-twice",
    "paracheck.mutants.ddp:HooksRegisteredTwiceDDP",
    "ddp",
    "hooks registered per parameter name: a tied parameter is pre-divided twice",
)
register(
    "ddp-flags-averaged",
    "paracheck.mutants.ddp:FlagsAveragedDDP",
    "ddp",
    "presence flags are averaged with the gradients, so a partly used parameter loses its gradient",
)
register(
    "ddp-presence-from-hooks",
    "paracheck.mutants.ddp:PresenceFromHooksDDP",
    "ddp",
    "presence = 'my hook fired in the last backward': accumulated or zeroed gradients can be dropped",
)

register(
    "ddp-readiness-per-step",
    "paracheck.mutants.ddp:ReadinessPerStepDDP",
    "ddp",
    "bucket readiness is reset per step, not per backward: a second backward before finish is never reduced",
)
register(
    "ddp-handles-per-step",
    "paracheck.mutants.ddp:HandlesPerStepDDP",
    "ddp",
    "handles are kept per step and only the first backward launches: later backward passes are not reduced",
)
register(
    "ddp-round-starts-in-forward",
    "paracheck.mutants.ddp:RoundStartsInForwardDDP",
    "ddp",
    "a round is opened by forward: a second backward of one forward is launched but never waited for or averaged",
)
register(
    "ddp-bucket-cap-ignored",
    "paracheck.mutants.ddp:BucketCapIgnoredDDP",
    "ddp",
    "the planner never receives bucket_size_mb: one bucket per dtype, whatever the cap",
)
register(
    "ddp-bucket-cap-in-bytes",
    "paracheck.mutants.ddp:BucketCapInBytesDDP",
    "ddp",
    "bucket_size_mb is compared with byte counts: every parameter alone in its bucket",
)
register(
    "ddp-mixed-dtype-bucket",
    "paracheck.mutants.ddp:MixedDtypeBucketDDP",
    "ddp",
    "buckets ignore dtypes: float32 and float64 gradients share one flat buffer of the first's dtype",
    expect="raise",
)
register(
    "ddp-flat-buffer-first-dtype",
    "paracheck.mutants.ddp:FlatBufferFirstDtypeDDP",
    "ddp",
    "the flat buffer takes the first parameter's dtype: float64 gradients truncated to float32",
)

# Further catalogues register themselves on import.
from paracheck.mutants import ddp as _ddp  # noqa: E402,F401

try:  # later catalogues (sharding, ...) are optional until they land
    from paracheck.mutants import sharding as _sharding  # noqa: F401
except ImportError:
    pass
from paracheck.mutants import resharding as _resharding  # noqa: E402,F401

# Mutants only a real model's structure exposes: checked through --model on examples/models.py,
# not by the selftest (whose cases train generated models).
from paracheck.mutants.models import MODEL_MUTANTS, ModelMutant  # noqa: E402

for _name, _fn, _bug in (
    (
        "loop-micro-batch-normalised",
        "micro_batch_normalised",
        "declares the global token mean but averages each micro-batch's own token mean",
    ),
    (
        "loop-local-token-count",
        "local_token_count",
        "declares the global token mean but normalises by the rank's own valid tokens",
    ),
    (
        "loop-averaged-twice",
        "averaged_twice",
        "normalises by the global token count and averages the gradients over ranks too",
    ),
    (
        "loop-last-micro-batch-only",
        "last_micro_batch_only",
        "clears the gradients before every micro-batch: only the last one's gradient is kept",
    ),
    (
        "loop-partial-window-not-rescaled",
        "partial_window_not_rescaled",
        "divides by the configured accumulation, not by the micro-batches of a partial last window",
    ),
    (
        "loop-local-norm-clipped",
        "local_norm_clipped",
        "clips each rank's gradients by their local norm before the all-reduce",
    ),
    (
        "loop-decay-applied-twice",
        "decay_applied_twice",
        "decays the parameters by hand before optimizer.step(), whose optimizer decays them again",
    ),
):
    register(_name, f"paracheck.mutants.loop:{_fn}", "loop", _bug)
register(
    "loop-unscale-skipped-on-one-rank",
    "paracheck.mutants.loop:unscale_skipped_on_one_rank",
    "loop",
    "float16 with a GradScaler: one rank clips its gradients before unscaling them",
    precision="fp16",  # its own declaration (paracheck_autocast), whatever the selftest's dtype
)


for _name, _cls, _bug, _expect in (
    (
        "fsdp-no-divide",
        "NoDivideFSDP",
        "sharded gradients are summed over ranks, never divided by the world size",
        "diverge",
    ),
    (
        "fsdp-padding-at-front",
        "PaddingAtFrontFSDP",
        "a gathered parameter is unpadded from the front: elements shift where numel % W != 0",
        "diverge",
    ),
    (
        "fsdp-replicated-never-reduced",
        "ReplicatedNeverReducedFSDP",
        "replicated parameters (biases, norm weights) keep their local gradients",
        "diverge",
    ),
    (
        "fsdp-no-sync-dropped",
        "NoSyncDroppedFSDP",
        "inside no_sync() the sharded gradients are dropped instead of kept for the next backward",
        "diverge",
    ),
    (
        "fsdp-accumulation-overwrites",
        "AccumulationOverwritesFSDP",
        "each reduce-scatter overwrites the shard's gradient: only the last micro-batch's is kept",
        "diverge",
    ),
    (
        "fsdp-no-initial-broadcast",
        "NoInitialBroadcastFSDP",
        "each rank shards its own initial parameters: no broadcast from rank 0",
        "diverge",
    ),
    (
        "fsdp-freed-before-backward",
        "FreedBeforeBackwardFSDP",
        "gathered parameters are freed after forward and never gathered again for backward",
        "raise",
    ),
    (
        "fsdp-tied-reduced-twice",
        "TiedReducedTwiceFSDP",
        "a tied weight's gradient is reduce-scattered at each of its uses, twice per backward",
        "diverge",
    ),
    (
        "fsdp-reduce-in-no-sync",
        "ReduceInNoSyncFSDP",
        "gradients are reduce-scattered inside no_sync() too: right values, no saving",
        "diverge",
    ),
    (
        "fsdp-gathered-never-freed",
        "GatheredNeverFreedFSDP",
        "gathered parameters stay referenced after their module's forward, whole, between steps",
        "diverge",
    ),
    (
        "fsdp-cached-gather",
        "CachedGatherFSDP",
        "each parameter is gathered once and the whole tensor reused: stale after the first step",
        "diverge",
    ),
    (
        "fsdp-reversed-chunks",
        "ReversedChunksFSDP",
        "the reduce-scatter input has the ranks' chunks reversed: rank r gets rank W-1-r's sums",
        "diverge",
    ),
    (
        "fsdp-shard-offset-floor",
        "ShardOffsetFloorFSDP",
        "a shard starts at r * (numel // W) under a layout padded to ceil(numel / W) per rank",
        "diverge",
    ),
    (
        "fsdp-all-gather-not-waited",
        "AllGatherNotWaitedFSDP",
        "every all-gather is asynchronous and never waited on: shards read before they arrive",
        "diverge",
    ),
    (
        "fsdp-prefetch-beyond-declared",
        "PrefetchBeyondDeclaredFSDP",
        "each module call prefetches one module more than its prefetch depth declares",
        "diverge",
    ),
    (
        "fsdp-prefetch-not-waited",
        "PrefetchNotWaitedFSDP",
        "a prefetched parameter is used without waiting on its all-gather",
        "diverge",
    ),
    (
        "fsdp-reduce-scatter-not-waited",
        "ReduceScatterNotWaitedFSDP",
        "every reduce-scatter is asynchronous and never waited on: the gradient is read before "
        "the other ranks' parts arrive",
        "diverge",
    ),
    (
        "fsdp-shard-is-a-view",
        "ShardIsAViewFSDP",
        "each shard is a view of a padded copy of the whole parameter: every rank keeps the "
        "whole parameter's storage",
        "diverge",
    ),
    (
        "fsdp-overlap-not-waited",
        "OverlapNotWaitedFSDP",
        "each reduce-scatter overlaps the next module's backward and is read then without a "
        "wait: right unless a rank is late",
        "diverge",
    ),
):
    register(_name, f"paracheck.mutants.fsdp:{_cls}", "fsdp", _bug, _expect)

# Bugs of the compute dtype: they show only in cases that give the wrapper one (bfloat16
# parameters, Note [Compute dtype of an FSDP]).
for _name, _cls, _bug in (
    (
        "fsdp-cast-after-communication",
        "CastAfterGatherFSDP",
        "the float32 shards are all-gathered and the whole parameter cast to the compute dtype "
        "after: right values, twice the gathered bytes",
    ),
    (
        "fsdp-gradients-in-low-precision",
        "LowPrecisionGradientsFSDP",
        "gradients of the compute dtype are summed and reduce-scattered in it, where the "
        "wrapper declares a float32 reduction",
    ),
    (
        "fsdp-shards-in-compute-dtype",
        "ShardsInComputeDtypeFSDP",
        "the module is cast to the compute dtype before sharding: no float32 master weights",
    ),
):
    register(_name, f"paracheck.mutants.fsdp:{_cls}", "fsdp", _bug, precision="bf16")
register(
    "ddp-hooks-compiled-away",
    "paracheck.mutants.compiled:HooksCompiledAwayDDP",
    "ddp",
    "registers its gradient hooks at the first forward in a branch Dynamo folds away: compiled, "
    "no hook fires and every gradient is reduced after backward (the overlap silently gone)",
)
register(
    "ddp-synced-when-compiled",
    "paracheck.mutants.compiled:SyncedWhenCompiledDDP",
    "ddp",
    "no_sync() is honoured only eagerly: the compiled forward turns synchronisation back on, so "
    "compiled accumulation all-reduces every micro-step (the same average)",
)
