"""Every property, declared once (``PROPERTIES``): its name, what a failure of it means and what
usually fixes it (the report's words), what must hold and the planted bugs it catches (the
documents' table), the ``--properties`` name that selects it and the check that judges it.

A name of ``PROPERTIES`` is what a failure reports (``Divergence.property``; ``raised``, ``died``,
``memory-cap`` and ``hang`` for a rank's failure), in the order a case that breaks several
reports them. A name ``--properties`` selects (``selectors()``) is a row's own name, or the
family name of several rows: ``equivalence`` (compared by
``paracheck.check.properties.equivalence.compare``, which also reports the worst relative error)
and ``state``. Which kinds check a selected name, by default or on request, is said by the kinds'
rows (``paracheck.check.kinds.KINDS``), which also build the ``--properties`` help and the
documents' table of properties from these rows.

Each check takes the ``paracheck.check.kinds.Evidence`` of a case and returns a ``Divergence`` or
None. It imports the module that judges only when called, by name (a unit test imports each one).

A row also carries the traits the driver reads (``paracheck.check.run``): the ``Divergence.what``
it reports (``reported_as``: a divergence of the optimizer ``state`` is an ``optimizer-state``
failure), whether its check runs the target again (``reruns``: checked after the others), and
whether it is judged on the partition a sharding target declares (``needs_partition``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

__all__ = [
    "PARTITIONED",
    "PROPERTIES",
    "RERUNS",
    "Property",
    "Words",
    "checks",
    "reported_property",
    "selectors",
]


@dataclass(frozen=True)
class Words:
    """A failure's words: what it means, in a phrase (the first line of a report), and what
    usually fixes it."""

    meaning: str
    hint: str


@dataclass(frozen=True)
class Property:
    """One property: its report's words, its documents' words, how it is selected and checked."""

    name: str
    meaning: str  # what a failure of it means, in a phrase: the first line of a report
    hint: str  # what usually fixes it
    holds: str  # what must hold (the documents' table)
    catches: str  # planted bugs it catches (the documents' table)
    oracle: str = "no"  # whether it compares with the oracle: "yes", "no", "the float64 one"
    # The --properties name that checks it: "" its own; None: every case (a rank's failure).
    selected_by: str | None = ""
    # Judges a case's Evidence (paracheck.check.kinds); None: compared by ``equivalence``, or
    # checked by the selector's other row.
    check: Callable | None = None
    # The words of a failure in a kind's own terms (a sharding kind's owners and zero_grad()),
    # and of a training loop's case (a loss other than the rank mean).
    for_kinds: Mapping[str, Words] = field(default_factory=dict)
    for_loops: Words | None = None
    # The ``Divergence.what`` values a failure of it is reported under, besides its own name (a
    # parameter or buffer differing after construction is ``initial-state`` whatever this says).
    reported_as: tuple[str, ...] = ()
    # Judged on the partition a sharding target declares (``partition.owners``, or pieces and
    # layout): without one, the driver notes what was not judged (Note [Traffic judges a declared
    # design] in paracheck.check.properties.traffic).
    needs_partition: bool = False
    # Judged under a rounding tolerance (a selftest's margin is its error over that tolerance);
    # False: an exact rule (bitwise agreement, counts, bytes, bucket layouts).
    toleranced: bool = False

    @property
    def selector(self) -> str | None:
        """The ``--properties`` name that selects it (None: every case)."""
        return self.name if self.selected_by == "" else self.selected_by

    @property
    def reruns(self) -> bool:
        """Whether its check runs the target again on the World (``_rerun``): the driver checks it
        after the properties judged on what the ranks returned."""
        return bool(getattr(self.check, "reruns", False))


# -- the checks ---------------------------------------------------------------------------------


def _calling(reference: str, call: Callable) -> Callable:
    """A check that calls the function ``reference`` ("module:function") as ``call`` says."""
    module, _, fn = reference.partition(":")

    def check(e):
        return call(getattr(importlib.import_module(module), fn), e)

    check.reference = reference  # type: ignore[attr-defined]  # resolved by a unit test
    return check


def _driver(reference: str) -> Callable:
    """A check of what the ranks returned against the oracle's trajectory."""
    return _calling(reference, lambda fn, e: fn(e.case, e.traj, e.ranks, e.kind))


def _rerun(reference: str, call: Callable | None = None) -> Callable:
    """A check that runs the target again on the World (called as ``call`` says, or with the
    world, the target, the case, the ranks' records and the timeout)."""
    check = _calling(
        reference,
        call or (lambda fn, e: fn(e.world, e.target, e.case, e.ranks, timeout=e.timeout)),
    )
    check.reruns = True  # type: ignore[attr-defined]  # read by Property.reruns
    return check


def _state(props: frozenset[str]) -> Callable:
    def call(fn, e):
        # Ranks on GPUs (nccl) run other kernels than the oracle (paracheck.oracle.tolerance).
        same = getattr(e.world, "backend", "gloo") != "nccl"
        return fn(e.case, e.traj, e.ranks, props, same_operations=same)

    return _calling("paracheck.check.properties.state:check_state", call)


_BALANCE = _calling(
    "paracheck.check.properties.balance:check_balance",
    lambda fn, e: fn(e.case, e.traj, e.ranks, e.row.state_layout, stepped=e.stepped_balance),
)
_BUCKET_STRUCTURE = _calling(
    "paracheck.check.properties.bucket_structure:check_bucket_structure",
    lambda fn, e: fn(e.case, e.ranks),
)
_REDUCE_DTYPE = _calling(
    "paracheck.check.properties.reduce_dtype:check_reduce_dtype",
    lambda fn, e: fn(
        e.case, e.ranks, getattr(e.target, "reduce_dtype", None), fsdp=e.row.shards_parameters
    ),
)
_FLOAT64_BOUND = _calling(
    "paracheck.check.properties.float64_bound:check_float64_bound",
    lambda fn, e: fn(
        e.case,
        e.traj,
        e.ranks,
        e.kind,
        device_type=e.ranks_on.partition(":")[0],
        judged_from=e.judged_from,
        measured=e.measured,
    ),
)


# -- the rows ---------------------------------------------------------------------------------

# A sharded optimizer's or a ZeRO wrapper's failures in its own terms: its owners, broadcasts and
# zero_grad(), not a DDP's finish_gradient_synchronization().
_SHARDED_GRADIENTS = Words(
    "the gradients step() was given differ from the oracle's average over ranks",
    "zero_grad() must clear the .grad of every parameter given to the optimizer, on every rank, "
    "not only those of the parameters this rank owns (a stale gradient adds into the next step's)",
)
_ZERO_GRADIENTS = Words(
    "a gradient after the wrapper's synchronisation differs from the oracle's average over ranks",
    "the gradient each owner steps must be the sum over ranks divided by the world size "
    "(reduce-scatter, or reduce to the owner), and zero_grad() must clear every parameter of the "
    "module, not only this rank's shard",
)
_OWNED_PARAMETERS = Words(
    "parameters after a step differ from the oracle's",
    "each parameter must be stepped by its owner alone, with its group's hyper-parameters, then "
    "broadcast from that owner (src: the owner's global rank) to every rank after every step, "
    "the groups added by add_param_group included",
)

_ROWS = (
    Property(
        "raised",
        "your code raised on a rank",
        "the exception is raised in the target's code (its frame is shown first); replay the case "
        "to debug it in one process per rank",
        holds="no rank raises",
        catches="buckets of two dtypes in one buffer, a wrapped optimizer given no parameters, "
        "gathered parameters freed before backward",
        selected_by=None,
    ),
    Property(
        "died",
        "a rank process died",
        "look for os._exit, a crash in an extension (the signal is shown), memory exhaustion, or "
        "(gloo::EnforceNotMet) a collective whose tensor differs in size between ranks",
        holds="no rank process dies",
        catches="a parameter whose local gradient is None skipped (gloo: the ranks' collectives "
        "differ in size)",
        selected_by=None,
    ),
    Property(
        "memory-cap",
        "a rank exceeded its memory cap: a resource failure, not a wrong result",
        "the rank's resident memory passed the cap (--rank-memory GB; by default an equal share of "
        "the machine's memory) within this case, on a fresh process: look for tensors kept across "
        "steps (a list appended every step, a loss history that holds the autograd graph); raise "
        "the cap if the case really needs the memory",
        holds="no rank's own resident memory passes `--rank-memory` GB within a case (a resource "
        "failure, not a wrong result)",
        catches="a tensor kept in a list every step",
        selected_by=None,
    ),
    Property(
        "hang",
        "the ranks hang: they did not all finish (they disagree on the collectives they issue, or one "
        "never returns)",
        "every rank must issue the same collectives in the same order, with the same sizes and "
        "the same source rank (a partition computed the same way on every rank); decide what to "
        "communicate "
        "from what every rank knows (all-reduce a presence flag), never from one rank's local state "
        "(such as its gradient being None)",
        holds="every rank finishes every case",
        catches="skipping a parameter whose local grad is None",
        selected_by=None,
    ),
    Property(
        "structure",
        "a rank recorded a different number of steps or parameters than the oracle",
        "the target must train every parameter of the module it wraps, for every step",
        holds="every rank records as many steps and parameters as the oracle",
        catches="a step or a parameter left out",
        oracle="yes",
        selected_by="equivalence",
    ),
    Property(
        "initial-state",
        "ranks do not start from rank 0's parameters and buffers",
        "broadcast every parameter and every buffer from rank 0 in the constructor",
        holds="every rank's parameters and buffers after construction equal rank 0's, bitwise",
        catches="no initial broadcast, buffers not broadcast",
        oracle="yes",
        selected_by="equivalence",
        reported_as=("buffer",),
    ),
    Property(
        "gradients",
        "gradients not averaged over ranks: a synchronised .grad differs from the oracle's average",
        "after finish_gradient_synchronization(), every trainable parameter's .grad must be the "
        "sum over ranks divided by the world size, on every rank (None where no rank had one)",
        holds="after synchronisation, every rank's `.grad` equals the oracle's average (None where "
        "no rank had one)",
        catches="no divide, 1-D params skipped, bucket copied back partly, readiness reset per "
        "step instead of per backward (finish once after k backwards), zero_grad of the local "
        "shard only",
        oracle="yes",
        selected_by="equivalence",
        reported_as=("grad",),
        for_kinds={
            "sharded": _SHARDED_GRADIENTS,
            "zero": _ZERO_GRADIENTS,
            "zero2": _ZERO_GRADIENTS,
        },
        # A training loop's step is judged whole: its gradients are what it hands
        # ``optimizer.step()``, the declared loss's gradient over every rank's micro-batches.
        for_loops=Words(
            "the gradients optimizer.step() was given differ from the declared loss's gradient "
            "over every rank's micro-batches",
            "normalise the loss as declared (--loss token-mean: each micro-batch's summed loss "
            "over the valid tokens of the whole step on every rank, then sum the gradients over "
            "ranks; batch-mean: the mean over ranks and micro-batches), synchronise before "
            "clipping, unscale before clipping",
        ),
        toleranced=True,
    ),
    Property(
        "float64-bound",
        "a synchronised gradient is further from the exact (float64) gradient than rounding in "
        "the case's precision can move it",
        "the gradient must be the average over ranks of the local gradients the case's program "
        "computes: compute the forward and backward in the precision asked, and reduce in the "
        "gradients' dtype or wider",
        holds="in the cases below float64 (MLP and toy workloads), every synchronised gradient is "
        "within a bound derived from the case's precision of the exact float64 gradient at the "
        "same parameters (`check/properties/float64_bound.py`, "
        "Note [A bound against the float64 gradient])",
        catches="float32 gradients summed in bfloat16, no divide",
        oracle="the float64 one",
        check=_FLOAT64_BOUND,
        toleranced=True,
    ),
    Property(
        "bucket-structure",
        "the all-reduce calls do not respect bucket_size_mb",
        "pack gradients into buckets of at most bucket_size_mb * 2**20 bytes (a larger "
        "parameter alone), reduce each gradient exactly once, and do not split buckets "
        "further than the cap requires",
        holds="per synchronisation, the all-reduce calls respect `bucket_size_mb`: none above cap "
        "+ largest parameter plus presence flags, no gradient reduced twice, at least the buckets "
        "the cap needs, at most what greedy packing makes "
        "(`check/properties/bucket_structure.py`)",
        catches="cap ignored, MB read as bytes",
        check=_BUCKET_STRUCTURE,
    ),
    Property(
        "parameters",
        "parameters after a step differ from the oracle's",
        "the update is wrong although the gradients were right: check the optimizer's groups "
        "and hyper-parameters, and (sharded) the broadcast of updated parameters from their owner",
        holds="every rank equals the oracle's trajectory after every step",
        catches="wrong broadcast source, lost hyper-parameters, scheduler lr not reaching the "
        "wrapped optimizer, generator groups consumed, closure ignored, state not loaded",
        oracle="yes",
        selected_by="equivalence",
        reported_as=("param",),
        for_kinds={
            "sharded": _OWNED_PARAMETERS,
            "zero": _OWNED_PARAMETERS,
            "zero2": _OWNED_PARAMETERS,
        },
        toleranced=True,
    ),
    Property(
        "master-weights",
        "a float32 master weight differs from the oracle's: the update was not applied to a "
        "float32 copy of the parameter",
        "keep a float32 master of every bfloat16 parameter the optimizer steps, step the masters "
        "on the gradients cast to float32, then copy each master into its parameter; "
        "master_params() returns them, one per parameter of param_groups",
        holds="with masters declared (`master_params()`) on bfloat16 parameters, every float32 "
        "master after every step equals the oracle's master step on the target's own gradients, "
        "within float32 rounding; every parameter is its master rounded (one of the two bfloat16 "
        "values around it: any rounding rule)",
        catches="masters kept in bfloat16, masters not saved by `state_dict()`, parameters "
        "gathered before the masters were rounded into them",
        oracle="yes",
        selected_by="equivalence",
        reported_as=("master",),
        toleranced=True,
    ),
    Property(
        "optimizer-state",
        "optimizer state differs from the oracle's",
        "the state every rank's state_dict() returns (its own shard, or every shard "
        "consolidated) must equal the oracle's, keyed as a single-process optimizer keys it; "
        "ranks returning the same parameter's state must agree",
        holds="the union over ranks of what `state_dict()` returns equals the oracle's state "
        "(per-rank shards or consolidated; ranks returning one parameter's state agree)",
        catches="state lost across steps",
        oracle="yes",
        selected_by="state",
        check=_state(frozenset({"state"})),
        reported_as=("state",),
        toleranced=True,
    ),
    Property(
        "state-consolidated",
        "the consolidated optimizer state differs from the oracle's",
        "consolidate every rank's shard into state_dict(), on every rank",
        holds="every rank's `state_dict()` holds every parameter's state",
        catches="state_dict of the local shard only",
        oracle="yes",
        check=_state(frozenset({"state-consolidated"})),
        toleranced=True,
    ),
    Property(
        "rank-agreement",
        "ranks disagree: their parameters after a step are not bitwise identical",
        "every rank must apply the same update to the same values (reduce, then update; "
        "broadcast from one owner)",
        holds="ranks hold bitwise identical parameters after every step",
        catches="ranks diverging silently",
        selected_by="equivalence",
    ),
    Property(
        "memory",
        "a rank holds other optimizer-state bytes than its declared partition implies, or "
        "(no partition declared) two ranks step the same parameter's state",
        "each rank must hold and step optimizer state for the parameters it owns, and only those",
        holds="optimizer-state bytes per rank equal the analytic values of the partition the "
        "design declares; with none declared, no two ranks step one parameter's state "
        "(`check/properties/memory.py`, Note [State stepped on two ranks])",
        catches="every rank keeps state for every parameter",
        needs_partition=True,
        check=_driver("paracheck.check.properties.memory:check_memory"),
    ),
    Property(
        "balance",
        "the partition breaks its balance bound or does not own every parameter exactly once",
        "partition the trainable parameters by size (frozen ones weigh nothing), every one "
        "owned by exactly one rank",
        holds="the partition owns every trainable parameter exactly once, within its balance "
        "bound (`check/properties/balance.py`, Note [Balance bound])",
        catches="partition by count instead of size",
        needs_partition=True,
        check=_BALANCE,
    ),
    Property(
        "traffic",
        "a step's collectives differ from the analytic communication model",
        "communicate only trainable parameters, once per step, with the collectives the "
        "design calls for",
        holds="with a declared partition, the bytes per collective equal the analytic values of "
        "the design (`check/properties/traffic.py`, Note [Traffic judges a declared design])",
        catches="frozen parameters broadcast every step",
        needs_partition=True,
        check=_driver("paracheck.check.properties.traffic:check_traffic"),
    ),
    Property(
        "grads-sharded",
        "a ZeRO-2 rank keeps more gradient than its shard after the synchronisation",
        "after finish_gradient_synchronization(), keep only this rank's reduce-scattered piece of "
        "each gradient: free (set to None, or resize to 0) the full-size gradients and buffers",
        holds="once the step's gradients are synchronised, no reduce-scatter's full tensor holds "
        "bytes, and the ranks' `.grad` storage together is at most the model's gradients plus "
        "padding (`check/properties/placement.py`)",
        catches="full bucket buffer kept, gradients zeroed instead of freed",
        check=_driver("paracheck.check.properties.placement:check_grads_sharded"),
    ),
    Property(
        "params-sharded",
        "an FSDP rank holds whole parameters where it should hold only its shards",
        "between the layers' gathers, keep each parameter as this rank's shard only: free the "
        "gathered tensor after the layer's forward and backward, and keep no view of it",
        holds="after each step the ranks' parameter storage together is at most the parameters "
        "plus padding, vectors and frozen parameters replicated (`check/properties/placement.py`)",
        catches="a shard that is a view of the whole parameter",
        check=_driver("paracheck.check.properties.placement:check_params_sharded"),
    ),
    Property(
        "reduced-once",
        "a gradient was communicated more than once per synchronised backward, or inside no_sync()",
        "reduce each parameter's gradient once per synchronised backward (sum a tied weight's "
        "uses locally first) and keep gradients local inside no_sync()",
        holds="per synchronisation window, the gradient bytes reduced are at most one padded "
        "reduction of every trainable gradient per synchronised backward, and nothing inside "
        "`no_sync()` (`check/properties/reduced_once.py`)",
        catches="tied weight reduced at each use, reduce-scatter inside no_sync",
        check=_driver("paracheck.check.properties.reduced_once:check_reduced_once"),
    ),
    Property(
        "freed",
        "whole parameters gathered during a step are still held after its backward",
        "free every gathered parameter after its layer's forward and again after its backward "
        "(drop every reference, or resize its storage to zero)",
        holds="no all-gather's full tensor holds bytes once the step's gradients are synchronised "
        "(`check/properties/freed.py`)",
        catches="gathered weights never freed, a gather cached across steps",
        check=_driver("paracheck.check.properties.freed:check_freed"),
    ),
    Property(
        "gathered-layers",
        "more modules' parameters were gathered at once than the prefetch depth allows",
        "gather at most prefetch modules ahead of the running one, and free each module's "
        "parameters after use (Note [Gathered layers and the prefetch depth])",
        holds="built with a prefetch depth, no more gathered storages alive at once than (depth + "
        "1) modules' parameters (`check/properties/gathered_layers.py`)",
        catches="prefetch beyond the declared depth",
        check=_driver("paracheck.check.properties.gathered_layers:check_gathered_layers"),
    ),
    Property(
        "gather-dtype",
        "parameters were all-gathered in another dtype than the compute dtype",
        "cast each shard to the compute dtype before its all-gather, not the gathered "
        "parameter after it (Note [Gathering in the compute dtype])",
        holds="with a compute dtype, no floating-point all-gather in another dtype "
        "(`check/properties/gather_dtype.py`)",
        catches="cast after communication",
        check=_driver("paracheck.check.properties.gather_dtype:check_gather_dtype"),
    ),
    Property(
        "reduce-dtype",
        "gradients were communicated in another dtype than the one the target declares",
        "cast the gradients to the declared dtype before the all-reduce (not after it), and "
        "reduce every gradient in it (Note [Declared reduction dtype])",
        holds="in a target that declares a reduction dtype (which adds it to its properties), "
        "every gradient is reduced in that dtype (an FSDP: in the cases with a compute dtype), read from the "
        "collectives (`check/properties/reduce_dtype.py`)",
        catches="cast after communicating",
        check=_REDUCE_DTYPE,
    ),
    Property(
        "reshard",
        "training saved at one world size and resumed at another does not go on as the oracle's",
        "state_dict() must hold every parameter's state (consolidated), keyed as a single-process "
        "optimizer keys it, and load_state_dict() must give each rank of any world size the state "
        "of what it owns now: every piece at its offset in the parameter, every key (moments, "
        "step counts, masters), the saved groups' hyper-parameters",
        holds="saved after k steps at world size W and loaded into a fresh world of W' (drawn, "
        "another than W where one is drawn), parameters, gradients, optimizer state and masters "
        "after every step equal the oracle's (`check/properties/reshard.py`, "
        "Note [Resuming at another world size])",
        catches="a piece past the first bucket read at the wrong offset, state not restored "
        "when the number of ranks changes, Adam's moments or step count dropped on load, the "
        "saved groups' hyper-parameters ignored, state loaded on rank 0 only, masters rebuilt "
        "from the parameters",
        oracle="yes",
        check=_rerun(
            "paracheck.check.properties.reshard:check_reshard",
            # Why a resumed case was not judged is left in the evidence, for the report.
            lambda fn, e: fn(
                e.world, e.target, e.case, e.ranks, timeout=e.timeout, measured=e.measured
            ),
        ),
    ),
    Property(
        "world-size-relation",
        "W ranks fed equal batches do not train like one rank fed all of them",
        "average the summed gradients over the world size, and reduce every trainable "
        "parameter's gradient",
        holds="W ranks with equal batches equal one rank fed their concatenation",
        catches="no divide",
        check=_rerun("paracheck.check.properties.world_size_relation:check_world_size_relation"),
        toleranced=True,
    ),
    Property(
        "bucket-size-independence",
        "the result depends on bucket_size_mb",
        "every bucket, the last partly filled one included, must be reduced and copied back "
        "whatever the cap",
        holds="a bucketed target's result does not depend on the bucket size",
        catches="last partial bucket never reduced",
        check=_rerun(
            "paracheck.check.properties.bucket_size_independence:check_bucket_size_independence"
        ),
        toleranced=True,
    ),
    Property(
        "compile-ledger",
        "under torch.compile a synchronisation issued other collectives than eagerly",
        "make every gradient hook and no_sync() flag take effect in compiled code: register hooks "
        "outside code Dynamo traces (a branch on torch.compiler.is_compiling() is folded away), "
        "and read the sync flag when the gradients are ready, not while tracing forward",
        holds="in a compiled case, every rank's synchronisation windows issue the collectives "
        "(kind and payload bytes, inside and outside no_sync()) of the same case run eagerly "
        "(`check/properties/compiled.py`, Note [A sync compiled away])",
        catches="hooks that do not fire under compile, every micro-step synchronised only when "
        "compiled",
        oracle="no",
        check=_rerun("paracheck.check.properties.compiled:check_compile_ledger"),
    ),
    Property(
        "repeatability",
        "two runs of the same case differ bitwise: the result cannot be reproduced",
        "reduce in an order fixed by the ranks and buckets, not by when contributions arrive; "
        "wait for every communication before reading its buffer; avoid atomics and "
        "nondeterministic kernels (torch.use_deterministic_algorithms)",
        holds="two runs of the same case give bitwise the same parameters, gradients and "
        "optimizer state on every rank (`check/properties/repeatability.py`)",
        catches="contributions summed in the order they arrive",
        check=_rerun("paracheck.check.properties.repeatability:check_repeatability"),
    ),
)

# The properties a check reports, by name, in the order a case that breaks several reports them.
PROPERTIES: dict[str, Property] = {p.name: p for p in _ROWS}


# The --properties names whose check runs the target again, and those judged on a declared
# partition (``paracheck.check.run``).
RERUNS = frozenset(p.selector for p in _ROWS if p.reruns and p.selector is not None)
PARTITIONED = frozenset(p.selector for p in _ROWS if p.needs_partition and p.selector is not None)
# Divergence.what -> the property a failure is reported as (``reported_property``).
_REPORTED = {what: p.name for p in _ROWS for what in p.reported_as}


def reported_property(what: str, step: int) -> str:
    """The property a ``Divergence`` of ``what`` at ``step`` breaks: a parameter or buffer that
    differs after construction (step -1) is the initial state's; any other ``what`` its row's
    (``Property.reported_as``), or the property of that name."""
    if step < 0 and what in ("param", "buffer"):
        return "initial-state"
    return _REPORTED.get(what, what)


def selectors() -> tuple[str, ...]:
    """The names ``--properties`` selects, in ``PROPERTIES`` order of their first row."""
    return tuple(dict.fromkeys(p.selector for p in _ROWS if p.selector is not None))


def checks() -> dict[str, Callable]:
    """The check of every selected name but ``equivalence``, by name."""
    return {p.selector: p.check for p in _ROWS if p.check is not None and p.selector is not None}
