"""The kinds of target, one row of behaviour each: which rank program trains a case, which
strategy draws the cases, which properties judge what the ranks returned (checked by default, or
opt-in), what the target owns of a training step, how it lays out its optimizer state, what its
constructor is passed, where the gradients its step is judged on and its master weights are read,
and how a case is prepared for it. Code outside this table asks the row (``KINDS[kind].owns``),
never the kind's name. Adding a kind is adding a row here, its rank program under
``paracheck.check.ranks`` and its properties under ``paracheck.check.properties``.

A property a row names is a name ``--properties`` selects, declared with what it means, its
check and its documents' words in ``paracheck.check.properties.catalog`` (``equivalence`` stands
for its family: ``initial-state``, ``gradients``, ``parameters``, ``master-weights``,
``rank-agreement``, ``structure``). ``resolve_properties`` turns the names a user selects
(``paracheck check --properties``, ``Target.properties``) into the set a check runs; the
``--properties`` help (``properties_help``) and the guide's table of properties
(``property_table``) are written from the rows. Every ``"module:function"`` named here is
imported only where it is used (a unit test imports each one).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from paracheck.check.properties.catalog import PROPERTIES, checks

__all__ = [
    "GRADIENTS",
    "KINDS",
    "OPTIMIZER",
    "PARAMETERS",
    "STEP",
    "STUB_RANK_FN",
    "ZERO_FIRST",
    "Constructor",
    "Evidence",
    "Kind",
    "PROPERTY_CHECKS",
    "default_properties",
    "properties_help",
    "property_table",
    "resolve_properties",
    "select_properties",
]

# What a target owns of one training step (``Kind.owns``), besides the model the case builds:
GRADIENTS = "gradients"  # synchronising the gradients after backward
OPTIMIZER = "optimizer"  # the optimizer's step and its state
PARAMETERS = "parameters"  # the parameters, kept as shards between steps and gathered whole
STEP = "step"  # the whole step: forward, backward, synchronisation and update (a training loop)

# Every kind's rank program inside ``stubbed_cuda_timing()`` (``--stub-cuda-timing``): it runs the
# program named by the job's ``stubbed`` field (``Target.job``).
STUB_RANK_FN = "paracheck.check.ranks._cuda_stub:run_stubbed"


@dataclass(frozen=True)
class Constructor:
    """What a kind's rank program passes to a target's constructor, read before any case runs
    (``paracheck.check.interfaces.check_supplied``): ``first``, positionally; ``by_name``, by
    keyword where it takes them; with ``by_names``, every argument is read by its name (Note
    [Readings of a DDP interface]). ``passes`` says it in words, for an error naming an argument
    paracheck cannot supply."""

    first: tuple[str, ...]
    passes: str
    by_name: frozenset[str] = frozenset()
    by_names: bool = False

    @property
    def wraps_optimizer(self) -> bool:
        """``Class(first, optimizer_cls, **kwargs)``: a wrapper of an optimizer class."""
        return self.first[1:2] == ("optimizer_cls",)

    @property
    def wraps_module(self) -> bool:
        """``Class(module, ...)`` taking no optimizer: a module wrapper (a DDP, an FSDP)."""
        return self.first == ("module",)

    @property
    def is_optimizer(self) -> bool:
        """``Class(params, ...)``: an optimizer over the parameters it is given."""
        return self.first[:1] == ("params",)


@dataclass(frozen=True)
class Kind:
    """One kind of target, as every part of a check treats it: the rank program and strategy by
    ``"module:function"`` path (imported where used), the properties that judge it, and the
    behaviour the driver and the rank programs read instead of testing the kind's name. Frozen;
    the rows are ``KINDS``."""

    name: str
    rank_fn: str  # "module:function" the World runs on every rank (returns a RankRecord)
    strategy: str  # "module:function" drawing the cases: strategy(world_sizes=..., dtype=...)
    default: tuple[str, ...]  # properties checked unless others are selected, in check order
    opt_in: tuple[str, ...] = ()  # checked only when selected
    # What the target owns of a step (GRADIENTS, OPTIMIZER, PARAMETERS, STEP); the rank program
    # does the rest with the case's own optimizer (and, for a sharded optimizer, FlatDDP).
    owns: frozenset[str] = frozenset()
    # How the target lays out its optimizer state across ranks: "per-parameter" (each
    # parameter's state whole on its owner: Note [Balance bound]), "flat" (a shard of the flat
    # buffers: Note [Flat layout]), or None (not sharded, or not judged).
    state_layout: str | None = None
    # What its constructor is passed (None: a training step, called and not constructed).
    constructor: Constructor | None = None
    # Where the gradients its step is judged on are read (Note [Comparing an update]):
    # "param.grad" (the parameters' own, after synchronisation), "NAME()" (a method of the
    # wrapper, where it has one), or None (not recorded to judge the step on).
    step_gradients: str | None = None
    # Where it declares float32 master weights (Note [Master weights]): "NAME()" (a method of the
    # target), "NAME=" (a keyword its constructor takes), or None.
    masters: str | None = None
    # The case as this kind's target runs it (None: as drawn); ``prepare_case(case, target)``.
    prepare_case: Callable | None = None
    # Properties that apply only to a target that takes a bucket size (Target.takes_bucket).
    bucket_only: frozenset[str] = frozenset()
    # Whether the equivalence comparison reads each rank's optimizer state along the trajectory
    # (when "state" is selected), and runs whenever "state" is selected.
    compares_state: bool = False
    # Whether the step-0 gradients meet the derived bound (Note [Step 0: a derived bound]): the
    # ranks compute each local gradient by the oracle's operations. A user's loop scales its loss
    # its own way (``paracheck.loop``): its gradients are judged at the dtype's tolerance.
    derived_bound: bool = True
    # ``Target`` fields passed to the strategy as keywords where set (the loop's loss semantics and
    # clip): the target's declarations, never removed from a case as drawn features are.
    options: tuple[str, ...] = ()
    # Every step anchored on the target's and its update applied to the gradients the target
    # recorded (Note [Anchored steps]): a loop computes its gradients its own way, and a loop's
    # or a sharding target's step is then judged alone, at a derived bound (Note [Comparing an
    # update]).
    on_target_gradients: bool = False
    dtype: str = "float64"  # the parameters' dtype where none is chosen
    # "module:function" of the cases a check runs first, as they are (Note [A partition by
    # count], Note [A compiled case under no_sync()]): in a search of the whole contract, and in
    # the table's first row that draws every feature of the case; function(world_sizes=...,
    # precision=...) -> ((why, Case), ...), only those of the sizes drawn; None: none.
    first_cases: str | None = None
    # The optional features (the verdict table's feature rows: ``optional_features``) that no case
    # its strategy draws has, at any world sizes and precision: their rows are "not drawn" without
    # a case drawn to find it (Note [Features a kind never draws]).
    never_draws: frozenset[str] = frozenset()
    # The properties a function building the target (an adapter: ``get_sharded_optimizer``) is
    # checked on unless others are selected (None: the default ones).
    adapter_properties: frozenset[str] | None = None

    @property
    def properties(self) -> tuple[str, ...]:
        return self.default + self.opt_in

    @property
    def syncs_its_groups(self) -> bool:
        """Whether the target synchronises gradients for its own optimizer's groups only (Note
        [Gradients outside the groups] in ``paracheck.check.run``)."""
        return {GRADIENTS, OPTIMIZER} <= self.owns

    @property
    def shards_parameters(self) -> bool:
        """Whether the target keeps its parameters as shards between steps (an FSDP)."""
        return PARAMETERS in self.owns


def _with_masters(case, target):
    """A bfloat16 case with float32 master weights for a target that declares them (Note [Master
    weights])."""
    if target.master_weights and case.dtype == "bfloat16" and not case.master_weights:
        return replace(case, master_weights=True)
    return case


def _prepare_zero(case, target):
    # A ZeRO wrapper owns the module: its zero_grad() clears every parameter (Case).
    if not case.zero_grad_module:
        case = replace(case, zero_grad_module=True)
    return _with_masters(case, target)


def _prepare_fsdp(case, target):
    with_masters = _with_masters(case, target)
    if with_masters is case:
        return case
    # Its float32 shards are the masters of what it computes in (Note [Compute dtype of an FSDP]).
    from paracheck.check.features import without_all
    from paracheck.strategies._fsdp import FSDP_COMPUTE_OFF

    return replace(without_all(with_masters, FSDP_COMPUTE_OFF), masters_from_float32=True)


_OPTIMIZER_KWARGS = "and the optimizer's hyper-parameters (lr, ...) through **kwargs"
ZERO_FIRST = ("module", "optimizer_cls")  # a ZeRO wrapper's first arguments
_ZERO_CONSTRUCTOR = Constructor(
    ZERO_FIRST,
    f"the module and optimizer_cls first, params= and bucket_size_mb=, {_OPTIMIZER_KWARGS}",
    by_name=frozenset({"params", "bucket_size_mb"}),
)

_SHARDING_PROPERTIES = (
    "equivalence",
    "float64-bound",
    "state",
    "memory",
    "balance",
    "traffic",
    "reshard",
)

# Note [Features a kind never draws]
#   A feature row of the verdict table draws only cases that have its feature; where the kind's
#   strategy never draws one, the table finds it out by drawing 60 cases that all lack it
#   (``paracheck.check.table``), 0.3-2.4 s a row, paid by the first target of each kind in a
#   check: 5 rows of a DDP, 5 of each sharding kind, 7 of an FSDP, 14 of a loop. So each row
#   declares what its strategy never draws (``Kind.never_draws``), and the check's plan turns those
#   features off before any case is drawn (``paracheck.check.features.never_drawn_off``): the rows
#   say "not drawn" at once. The declarations are facts about the strategies, tested by drawing
#   each kind's cases at several world sizes and precisions: no declared feature is ever drawn, and
#   every other optional feature is (tests/unit/test_kind_draws.py). A feature a kind draws only
#   at some settings (a parameter used on some ranks needs two) is not declared: the drawing
#   finds it out, as before.
# ``paracheck.strategies.cases`` (the DDP kind's): no scheduler, no groups given as generators, no
# state reload or resumption, every accumulation window whole.
_CASES_NEVER = frozenset({"scheduler", "groups-generators", "reload", "reshard", "partial-window"})
# ``sharding_cases``: none of the DDP protocol's corners (``paracheck.strategies._sharding``).
_SHARDING_NEVER = frozenset(
    {"float32-layer", "finish-once", "double-backward", "unbounded-bucket", "partial-window"}
) | {"compile"}

# ``paracheck.strategies._tp``: an MLP chain of one group, every micro-batch synchronised.
_TP_NEVER = frozenset(
    {
        "unused-some-ranks",
        "unused-always",
        "float32-layer",
        "buffer",
        "no-sync",
        "lr-changes",
        "scheduler",
        "groups-generators",
        "reload",
        "reshard",
        "finish-once",
        "double-backward",
        "unbounded-bucket",
        "partial-window",
        "compile",
    }
)

KINDS: dict[str, Kind] = {
    "ddp": Kind(
        "ddp",
        "paracheck.check.ranks.ddp:run_ddp",
        # ``cases``, compiled in one case of three (Note [Compiled cases]).
        "paracheck.strategies._compiled:compiled_cases",
        default=("equivalence", "float64-bound", "bucket-structure", "compile-ledger"),
        # reduce-dtype: added by a target's declared reduction dtype (Target.reduce_dtype).
        opt_in=("world-size-relation", "bucket-size-independence", "repeatability", "reduce-dtype"),
        owns=frozenset({GRADIENTS}),
        constructor=Constructor(
            ("module",),
            "the module first, a bucket size to an argument named like bucket_size_mb, and rank, "
            "world_size, process_group (or group) and device by name",
            by_names=True,
        ),
        bucket_only=frozenset({"bucket-structure", "bucket-size-independence"}),
        first_cases="paracheck.strategies._first:compiled_no_sync_cases",
        never_draws=_CASES_NEVER,
    ),
    # A sharded optimizer behind paracheck's FlatDDP, which synchronises the gradients first.
    "sharded": Kind(
        "sharded",
        "paracheck.check.ranks.sharded:run_sharded",
        "paracheck.strategies._sharding:sharding_cases",
        default=_SHARDING_PROPERTIES,
        opt_in=("state-consolidated", "repeatability"),
        owns=frozenset({OPTIMIZER}),
        state_layout="per-parameter",
        constructor=Constructor(
            ("params", "optimizer_cls"), f"params and optimizer_cls first, {_OPTIMIZER_KWARGS}"
        ),
        step_gradients="param.grad",
        masters="master_params()",
        prepare_case=_with_masters,
        compares_state=True,
        on_target_gradients=True,
        never_draws=_SHARDING_NEVER,
        first_cases="paracheck.strategies._sharding:count_partition_cases",
        # An adapter's optimizer is judged on its parameters (as the handout's test): its
        # state_dict() is commonly the shard's, its traffic its own; memory and balance need a
        # declared partition.
        adapter_properties=frozenset({"equivalence", "memory", "balance"}),
    ),
    "zero": Kind(
        "zero",
        "paracheck.check.ranks.zero:run_zero",
        "paracheck.strategies._sharding:sharding_cases",
        default=_SHARDING_PROPERTIES,
        opt_in=("state-consolidated", "repeatability"),
        owns=frozenset({GRADIENTS, OPTIMIZER}),
        state_layout="flat",
        constructor=_ZERO_CONSTRUCTOR,
        step_gradients="full_gradients()",
        masters="master_params()",
        prepare_case=_prepare_zero,
        compares_state=True,
        on_target_gradients=True,
        never_draws=_SHARDING_NEVER,
    ),
    # ZeRO-2: the zero kind's interface and properties, and its gradients kept only as shards
    # (Note [Gradients kept as shards] in paracheck.check.properties.placement).
    "zero2": Kind(
        "zero2",
        "paracheck.check.ranks.zero:run_zero2",
        "paracheck.strategies._sharding:sharding_cases",
        default=(*_SHARDING_PROPERTIES, "grads-sharded"),
        opt_in=("state-consolidated", "repeatability"),
        owns=frozenset({GRADIENTS, OPTIMIZER}),
        state_layout="flat",
        constructor=_ZERO_CONSTRUCTOR,
        step_gradients="full_gradients()",
        masters="master_params()",
        prepare_case=_prepare_zero,
        compares_state=True,
        on_target_gradients=True,
        never_draws=_SHARDING_NEVER,
    ),
    # Read whole through a gather method (Note [Reading an FSDP]); its float32 shards are the
    # masters of a compute dtype its constructor takes (Note [Compute dtype of an FSDP]).
    "fsdp": Kind(
        "fsdp",
        "paracheck.check.ranks.fsdp:run_fsdp",
        "paracheck.strategies._fsdp:fsdp_cases",
        default=(
            "equivalence",
            "float64-bound",
            "reduced-once",
            "freed",
            "gather-dtype",
            "gathered-layers",
            "params-sharded",
            "reshard",
        ),
        # reduce-dtype: added by a target's declared reduction dtype (Target.reduce_dtype).
        opt_in=("repeatability", "reduce-dtype"),
        owns=frozenset({GRADIENTS, PARAMETERS}),
        constructor=Constructor(
            ("module",),
            "the module first, and compute_dtype= and prefetch= where it names them",
            by_name=frozenset({"compute_dtype", "prefetch"}),
        ),
        masters="compute_dtype=",
        prepare_case=_prepare_fsdp,
        # FSDP_OFF (Note [Cases an FSDP is checked on]) on top of the DDP kind's cases, which it
        # resumes at another world size (``resumed_sometimes``).
        never_draws=(_CASES_NEVER - {"reshard"}) | {"unused-some-ranks", "clip", "compile"},
    ),
    "loop": Kind(
        "loop",
        "paracheck.check.ranks.loop:run_loop",
        # ``loop_cases``, its model compiled in one case of ten (Note [Compiled loops]).
        "paracheck.strategies._compiled:compiled_loop_cases",
        default=("equivalence",),
        opt_in=("repeatability",),
        owns=frozenset({STEP}),
        step_gradients="param.grad",
        derived_bound=False,
        options=("loss", "clip_norm", "autocast", "scaler"),
        on_target_gradients=True,
        # A loop computes its loss its own way: in float32, `.float()` on the logits (a common
        # habit) changes nothing (Note [Loss semantics]).
        dtype="float32",
        # ``loop_cases``: a language model of one group, trained by the user's step; a clip only
        # where the target declares one (its every case has it).
        never_draws=frozenset(
            {
                "unused-some-ranks",
                "unused-always",
                "float32-layer",
                "buffer",
                "no-sync",
                "lr-changes",
                "scheduler",
                "groups-generators",
                "reload",
                "reshard",
                "finish-once",
                "double-backward",
                "clip",
                "unbounded-bucket",
            }
        ),
    ),
    # A plan ``plan(model, mesh) -> model`` over a 2-D mesh ("dp", "tp") (paracheck.tp; Note
    # [Readings of a tensor-parallel plan] in paracheck.check.ranks.tp).
    "tp": Kind(
        "tp",
        "paracheck.check.ranks.tp:run_tp",
        "paracheck.strategies._tp:tp_cases",
        default=("equivalence",),
        opt_in=("repeatability",),
        owns=frozenset({PARAMETERS}),
        # Its ranks compute each local gradient by other operations than the oracle's (a matmul
        # split over the group and summed): judged at float64's tolerance, never at the step-0
        # bound derived for the same operations (Note [Step 0: a derived bound]).
        derived_bound=False,
        # Called, plan(model, mesh): its required arguments beyond these are refused up front.
        constructor=Constructor(
            ("model", "mesh"),
            "the model and the 2-D mesh first, and sequence_parallel= where it takes it",
            by_name=frozenset({"sequence_parallel"}),
        ),
        step_gradients="param.grad",
        never_draws=_TP_NEVER,
    ),
}


@dataclass(frozen=True)
class Evidence:
    """What a property may read: the case, the oracle's trajectory, every rank's ``RankRecord``,
    the kind, and (for the properties that run the target again) the World, target and timeout."""

    case: object
    traj: object
    ranks: list
    kind: str
    world: object = None
    target: object = None
    timeout: float | None = None
    # Where the ranks computed ("cpu", "cuda", "cuda:1"), and the first step each parameter's
    # gradient is judged at (a ZeRO wrapper's late groups: Note [Gradients outside the groups] in
    # paracheck.check.run; None: every step).
    ranks_on: str = "cpu"
    judged_from: dict | None = None
    # What a property measured besides its verdict, by name (the float64 bound's worst ratio).
    measured: dict = field(default_factory=dict)
    # Whether balance judges an undeclared sharded design by the state its ranks step (the
    # contract's ``stepped_balance``: paracheck.check.features).
    stepped_balance: bool = True

    @property
    def row(self) -> Kind:
        return KINDS[self.kind]


# Every selected name but "equivalence" (compared by paracheck.check.properties.equivalence.compare,
# which also reports the worst relative error), by name; each returns a Divergence or None.
PROPERTY_CHECKS: dict[str, Callable[[Evidence], object]] = checks()


def default_properties(kind: str, takes_bucket: bool = False) -> frozenset[str]:
    """The properties a check of a ``kind`` target runs when none are selected."""
    row = KINDS[kind]
    return frozenset(p for p in row.default if takes_bucket or p not in row.bucket_only)


def resolve_properties(
    kind: str, names, *, takes_bucket: bool = False, base=None
) -> frozenset[str]:
    """None -> ``default_properties``; otherwise ``names`` as a set, each one a property of
    ``kind`` (a bucket-only one needs ``takes_bucket``): ValueError naming the rest. ``+NAME``
    adds NAME to the default properties (``base``, a target's own, where given), or to the plain
    names given."""
    if names is None:
        return default_properties(kind, takes_bucket)
    plus = frozenset(n[1:] for n in names if n.startswith("+"))
    row, chosen = KINDS[kind], frozenset(n for n in names if not n.startswith("+"))
    if plus:  # "+NAME": the defaults (or the plain names) and NAME
        own = frozenset(base) if base is not None else default_properties(kind, takes_bucket)
        chosen = (chosen or own) | plus
    unknown = sorted(chosen - set(row.properties))
    if unknown:
        raise ValueError(
            f"properties={sorted(chosen)!r}: {unknown} not properties of a {kind} target; choose "
            f"from {list(row.properties)}"
        )
    bucketless = sorted(chosen & row.bucket_only) if not takes_bucket else []
    if bucketless:
        raise ValueError(
            f"properties={sorted(chosen)!r}: {bucketless} apply only to a target that takes a "
            f"bucket size"
        )
    return chosen


def select_properties(targets, names, *, refuse_none: bool = True) -> tuple[list, list[str]]:
    """The ``targets`` with ``Target.properties`` set to what ``names`` select of each one's
    properties, and warnings. A name written ``+NAME`` adds NAME to the target's default
    properties (or to the plain names selected of it), so ``+repeatability`` checks the defaults
    and repeatability. ValueError for a name no kind has, and (``refuse_none``) when ``names``
    select nothing of any target. A target of which ``names`` select nothing keeps its own
    properties (a warning says so): the pytest plugin's session-wide selection meets tests of
    every kind, one at a time."""
    import dataclasses

    plus = frozenset(n[1:] for n in names if n.startswith("+"))
    plain = frozenset(n for n in names if not n.startswith("+"))
    chosen = plain | plus
    every = {p for row in KINDS.values() for p in row.properties}
    unknown = sorted(chosen - every)
    if unknown:
        raise ValueError(f"unknown {unknown}; choose from {sorted(every)}")
    out, warnings, used = [], [], set()
    for t in targets:
        row = KINDS[t.kind]

        def of_target(ps, row=row, t=t):
            return {
                p for p in ps & set(row.properties) if t.takes_bucket or p not in row.bucket_only
            }

        mine, added = of_target(plain), of_target(plus)
        if not mine and not added:
            warnings.append(
                f"--properties selects none of {t.name}'s properties ({', '.join(row.properties)}"
                f"{'' if t.takes_bucket else '; it takes no bucket size'}): it runs its default ones"
            )
            out.append(t)
            continue
        used |= mine | added
        # "+NAME" adds to what the target checks by default (a built-in may check fewer than
        # its kind: torch-zero).
        base = mine or resolve_properties(t.kind, t.properties, takes_bucket=t.takes_bucket)
        out.append(
            dataclasses.replace(
                t,
                properties=resolve_properties(t.kind, base | added, takes_bucket=t.takes_bucket),
            )
        )
    if not used and refuse_none:
        raise ValueError(
            f"--properties {','.join(names)} selects none of the properties of "
            + "; ".join(
                f"{t.name} ({', '.join(KINDS[t.kind].properties)}"
                f"{'' if t.takes_bucket else '; it takes no bucket size'})"
                for t in targets
            )
        )
    unused = sorted(chosen - used)
    if unused and used:
        warnings.append(f"--properties {', '.join(unused)}: no target given has them")
    return out, warnings


# -- the properties in words: the --properties help and the documents' table ------------------


def properties_help() -> str:
    """The help of ``--properties``: each kind's properties, from its row."""
    groups: dict[tuple, list[str]] = {}
    for row in KINDS.values():
        groups.setdefault((row.default, row.opt_in, row.bucket_only), []).append(row.name)

    def names(props, bucket_only) -> str:
        return ",".join(p + ("*" if p in bucket_only else "") for p in props)

    kinds = []
    for (default, opt_in, bucket_only), rows in groups.items():
        text = f"{'/'.join(rows)}: {names(default, bucket_only)}"
        kinds.append(text + (f" [{names(opt_in, bucket_only)}]" if opt_in else ""))
    return (
        "comma-separated properties to check, each applied to the targets whose kind has it (in "
        "brackets: checked only when selected; *: only for a target that takes a bucket size): "
        + "; ".join(kinds)
        + ". +NAME adds NAME to the defaults: --properties +repeatability"
    )


def _kinds_checking(name: str) -> str:
    """Which kinds check the selected ``name``, by default and on request, in words."""

    def listed(rows) -> str:
        if len(rows) == len(KINDS):
            return "every kind"
        return ", ".join(
            r.name + (" taking a bucket size" if name in r.bucket_only else "") for r in rows
        )

    default = [r for r in KINDS.values() if name in r.default]
    opt_in = [r for r in KINDS.values() if name in r.opt_in]
    parts = [listed(default)] if default else []
    return "; ".join(parts + ([f"on request: {listed(opt_in)}"] if opt_in else []))


def property_table() -> str:
    """The documents' table of properties (``docs/guide.md``), one row per property a failure
    reports, from ``PROPERTIES`` and the kinds' rows (``tests/unit/test_property_table.py``
    compares it with the guide's)."""
    lines = [
        "| property | checked (`--properties` name: kinds) | what must hold | needs the oracle "
        "| catches (example mutant) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for p in PROPERTIES.values():
        if p.selector is None:
            checked = "every case"
        else:
            via = "" if p.selector == p.name else f"`{p.selector}`: "
            checked = via + _kinds_checking(p.selector)
        lines.append(f"| {p.name} | {checked} | {p.holds} | {p.oracle} | {p.catches} |")
    return "\n".join(lines) + "\n"
