"""Case features: what a failing case has that a simpler case lacks. Pure functions of cases.

A failure is labelled with the features it needs ("only with gradient accumulation") by removing
each feature from the shrunk case and running it again: the feature is needed if the failure goes
away (``paracheck.check.property``). ``FEATURES`` is one table; a new ``Case`` field is one row:
a name, the label shown to the user, whether a case has it, and the same case without it.

``without(case, name)`` always returns a valid case that differs from ``case`` only in that
feature (and in what the feature forces: dropping the data-dependent branch removes its
parameters, so the optimizer groups are re-indexed by parameter name).

The same table chooses what a check draws: a contract (``CONTRACTS``: ``full`` draws every
feature, ``cs336`` only what the CS336 interfaces promise) and ``-name`` / ``+name`` items
(``features_off``) name the features never drawn, and every drawn case is mapped through
``without_all`` for them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from paracheck.cases import Case, GroupSpec
from paracheck.errors import FeatureError

__all__ = [
    "CONTRACTS",
    "Contract",
    "KIND_CONTRACTS",
    "PAIRS",
    "beyond_contract",
    "unpromised_properties",
    "Feature",
    "FeatureError",
    "FEATURES",
    "case_features",
    "closure",
    "essential",
    "feature",
    "label",
    "never_drawn_off",
    "optional_features",
    "row_off",
    "without",
    "without_all",
]


@dataclass(frozen=True)
class Feature:
    """One row of ``FEATURES``. ``search_without``: when a failure needs this feature, also search
    for a failure among cases without it (another bug may hide behind this one); off for features
    whose absence leaves nothing to find (a single rank)."""

    name: str
    label: str  # completes "only ...": "with gradient accumulation"
    has: Callable[[Case], bool]
    remove: Callable[[Case], Case]
    search_without: bool = True
    implies: tuple[str, ...] = ()  # features this one includes (not listed again when it is needed)
    # Features a case needs to have this one (a late group needs a step before it): a feature turned
    # off turns off those that imply or require it (``features_off``).
    requires: tuple[str, ...] = ()
    # The ``Case`` field a one-field feature sets (``_flag``): what a target's class names in
    # ``unsupported_case_features`` to decline it.
    field: str | None = None


def _model(case: Case, **changes) -> Case:
    """``case`` with its MLP spec changed; optimizer groups that named parameters by index are
    re-indexed by name, and parameters that no longer exist are dropped from them."""
    from paracheck.workloads import build_model

    old = [n for n, _ in build_model(case.model, seed=0).named_parameters()]
    spec = replace(case.model, **changes)
    new = {n: i for i, (n, _) in enumerate(build_model(spec, seed=0).named_parameters())}
    groups = []
    for g in case.optimizer.groups:
        if not g.params:
            groups.append(g)
            continue
        idx = tuple(new[old[i]] for i in g.params if i < len(old) and old[i] in new)
        if idx:
            groups.append(replace(g, params=idx))
    if not groups:
        groups = [replace(case.optimizer.groups[0], params=(), add_at_step=None)]
    if all(g.add_at_step is not None for g in groups):
        groups[0] = replace(groups[0], add_at_step=None)
    return replace(case, model=spec, optimizer=replace(case.optimizer, groups=tuple(groups)))


def _is_mlp(case: Case) -> bool:
    return getattr(case.model, "kind", None) == "mlp"


def _opt(case: Case, **changes) -> Case:
    return replace(case, optimizer=replace(case.optimizer, **changes))


def _groups(case: Case, fn: Callable[[GroupSpec], GroupSpec]) -> Case:
    return _opt(case, groups=tuple(fn(g) for g in case.optimizer.groups))


def _one_group(case: Case) -> Case:
    first = case.optimizer.groups[0]
    return _opt(case, groups=(replace(first, params=(), add_at_step=None),))


def _flag(field: str, default, name: str, label: str, **kw) -> Feature:
    """A feature that is one ``Case`` field away from its default (absent fields: never present)."""
    return Feature(
        name,
        label,
        lambda c: hasattr(c, field) and getattr(c, field) != default,
        lambda c: replace(c, **{field: default}),
        field=field,
        **kw,
    )


def _opt_flag(field: str, default, name: str, label: str) -> Feature:
    return Feature(
        name,
        label,
        lambda c: getattr(c.optimizer, field, default) != default,
        lambda c: _opt(c, **{field: default}),
    )


FEATURES: tuple[Feature, ...] = (
    Feature(
        "world>=3",
        "at world size >= 3",
        lambda c: c.world_size >= 3,
        lambda c: c.with_world_size(2),
        implies=("world>=2",),
    ),
    Feature(
        "world>=2",
        "with several ranks",
        lambda c: c.world_size >= 2,
        lambda c: c.with_world_size(1),
        search_without=False,
    ),
    Feature(
        "unused-some-ranks",
        "when a parameter is used on some ranks but not others",
        lambda c: _is_mlp(c) and c.model.unused == "data",
        lambda c: _model(c, unused="none"),
    ),
    Feature(
        "unused-always",
        "with a parameter that is never used",
        lambda c: _is_mlp(c) and c.model.unused == "always",
        lambda c: _model(c, unused="none"),
    ),
    Feature(
        "frozen",
        "with frozen (requires_grad=False) parameters",
        lambda c: _is_mlp(c) and bool(c.model.frozen),
        lambda c: _model(c, frozen=()),
    ),
    Feature(
        "tied",
        "with a tied (shared) parameter",
        # The MLP's square block applied twice, or the toy model's tied variant.
        lambda c: getattr(c.model, "kind", None) in ("mlp", "toy") and c.model.tied,
        lambda c: _model(c, tied=False),
    ),
    Feature(
        "float32-layer",
        "with parameters of two dtypes (a float32 layer, float64 in a float32 model)",
        lambda c: _is_mlp(c) and getattr(c.model, "float32_layer", None) is not None,
        lambda c: _model(c, float32_layer=None),
    ),
    Feature(
        "buffer",
        "with a buffer",
        lambda c: _is_mlp(c) and c.model.buffer,
        lambda c: _model(c, buffer=False),
    ),
    Feature(
        "unequal-batches",
        "with unequal per-rank batch sizes",
        lambda c: len(set(c.batch_sizes)) > 1,
        lambda c: replace(c, batch_sizes=(min(c.batch_sizes),) * c.world_size),
    ),
    Feature(
        "rank-dependent-init",
        "when ranks construct different initial weights",
        lambda c: c.rank_dependent_init,
        lambda c: replace(c, rank_dependent_init=False),
    ),
    Feature(
        "several-steps",
        "with several optimizer steps",
        lambda c: c.steps > 1,
        lambda c: replace(c, steps=1),
        search_without=False,
    ),
    Feature(
        "accumulation",
        "with gradient accumulation",
        lambda c: c.accumulation > 1,
        lambda c: replace(c, accumulation=1, no_sync=False, last_window=None),
    ),
    Feature(
        "no-sync",
        "with no_sync() during accumulation",
        lambda c: c.no_sync and c.accumulation > 1,
        lambda c: replace(c, no_sync=False),
        implies=("accumulation",),
    ),
    _flag("set_to_none", True, "zero-grad-to-zeros", "with zero_grad(set_to_none=False)"),
    _flag("prefetch", 0, "prefetch", "with a prefetch depth (an FSDP taking prefetch=)"),
    Feature(
        "delay",
        "with one rank held back (a drawn delay)",
        lambda c: getattr(c, "delay_at", None) is not None,
        lambda c: replace(c, delay_at=None, delay_rank=0, delay_s=0.0),
    ),
    Feature(
        "several-groups",
        "with several parameter groups",
        lambda c: len(c.optimizer.groups) > 1,
        _one_group,
    ),
    Feature(
        "late-group",
        "with a parameter group added mid-training (add_param_group)",
        lambda c: any(g.add_at_step is not None for g in c.optimizer.groups),
        lambda c: _groups(c, lambda g: replace(g, add_at_step=None)),
        requires=("several-steps",),
    ),
    Feature(
        "momentum",
        "with SGD momentum",
        lambda c: any(g.momentum for g in c.optimizer.groups),
        lambda c: _groups(c, lambda g: replace(g, momentum=0.0)),
    ),
    Feature(
        "weight-decay",
        "with weight decay",
        lambda c: any(g.weight_decay for g in c.optimizer.groups),
        lambda c: _groups(c, lambda g: replace(g, weight_decay=0.0)),
    ),
    Feature(
        "adam",
        "with Adam/AdamW",
        lambda c: c.optimizer.name in ("adam", "adamw"),
        lambda c: _opt(c, name="sgd"),
    ),
    _opt_flag("lr_decay", 1.0, "lr-changes", "with lr changes between steps"),
    _opt_flag("as_generator", False, "params-generator", "with parameters passed as a generator"),
    _opt_flag("scheduler", None, "scheduler", "with an LR scheduler"),
    _opt_flag(
        "groups_as_generators",
        False,
        "groups-generators",
        "with parameter groups given as generators",
    ),
    Feature(
        "small-buckets",
        "with buckets smaller than the model",
        lambda c: (
            c.bucket_size_mb is not None
            and not getattr(c, "unbounded_bucket", False)
            and c.bucket_size_mb < 1.0
        ),
        lambda c: replace(c, bucket_size_mb=None),
    ),
    _flag("closure", False, "closure", "with optimizer.step(closure)"),
    _flag(
        "reload_at_step",
        None,
        "reload",
        "with the optimizer state reloaded mid-training",
        requires=("several-steps",),
    ),
    Feature(
        "reshard",
        "when training is saved and resumed at another world size",
        lambda c: getattr(c, "reshard_at_step", None) is not None,
        lambda c: replace(c, reshard_at_step=None, reshard_world_size=1),
        requires=("several-steps",),
    ),
    # Note [Compiled cases] in paracheck.cases._compile.
    _flag(
        "compiled",
        None,
        "compile",
        "under torch.compile (the wrapper, and the backward with compiled autograd)",
    ),
    _flag("zero_grad_module", False, "zero-grad-module", "with zero_grad() on the whole module"),
    _flag(
        "finish_once",
        False,
        "finish-once",
        "with one synchronisation after the last micro-step",
        requires=("accumulation",),
    ),
    _flag("double_backward", False, "double-backward", "with two backward passes per micro-step"),
    _flag("clip_norm", None, "clip", "with the global gradient norm clipped before the step"),
    _flag("unbounded_bucket", False, "unbounded-bucket", "with bucket_size_mb=None"),
    Feature(
        "low-precision",
        "in low precision",
        lambda c: c.dtype != "float64",
        lambda c: replace(c, dtype="float64", autocast=None, loss_scale=None),
    ),
    Feature(
        "autocast",
        "under autocast (a bfloat16/float16 forward over float32 parameters)",
        lambda c: getattr(c, "autocast", None) is not None,
        lambda c: replace(c, autocast=None, loss_scale=None),
        requires=("low-precision",),
    ),
    _flag(
        "loss_scale",
        None,
        "loss-scaling",
        "with float16 loss scaling (torch.amp.GradScaler)",
        requires=("autocast",),
    ),
    # Training loops (Note [Loss semantics]).
    Feature(
        "padding",
        "with padded targets (valid tokens differ by row, micro-batch and rank)",
        lambda c: getattr(c, "padded", False),
        lambda c: replace(c, padded=False, empty_micro=False),
    ),
    _flag(
        "empty_micro",
        False,
        "empty-micro-batch",
        "with a micro-batch that is all padding",
        requires=("padding",),
    ),
    _flag(
        "last_window",
        None,
        "partial-window",
        "with a partial last accumulation window",
        requires=("accumulation",),
    ),
)

_BY_NAME = {f.name: f for f in FEATURES}


def case_features(case: Case) -> set[str]:
    """The names of the ``FEATURES`` that ``case`` has."""
    return {f.name for f in FEATURES if f.has(case)}


def without(case: Case, name: str) -> Case:
    """``case`` without feature ``name`` (unchanged if it does not have it)."""
    try:
        feature = _BY_NAME[name]
    except KeyError:
        raise ValueError(f"feature={name!r} is not one of {sorted(_BY_NAME)}") from None
    return feature.remove(case) if feature.has(case) else case


def essential(names) -> list[str]:
    """``names`` in table order, without those another of them implies."""
    implied = {i for n in names for i in _BY_NAME[n].implies}
    return [f.name for f in FEATURES if f.name in names and f.name not in implied]


def label(name: str) -> str:
    """The user-facing words for feature ``name``: "only with gradient accumulation"."""
    return "only " + _BY_NAME[name].label


def feature(name: str) -> Feature:
    return _BY_NAME[name]


# -- choosing what is drawn ----------------------------------------------------------------------


@dataclass(frozen=True)
class Contract:
    """A preset of features never drawn: what an interface leaves unspecified, so that every
    design correct under it passes (``paracheck check --contract``)."""

    name: str
    off: frozenset[str]
    about: str
    # Whether a sharded optimizer that declares no partition is judged on the balance of the
    # state its ranks step (Note [Balance of the state stepped] in
    # ``paracheck.check.properties.balance``): a promise of the full contract, not of CS336's.
    stepped_balance: bool = True


CONTRACTS: dict[str, Contract] = {
    "full": Contract("full", frozenset(), "every feature paracheck draws"),
    # The CS336 handout fixes DDP(module) / DDP(module, bucket_size_mb) with forward() and
    # finish_gradient_synchronization() called after loss.backward() and before optimizer.step(),
    # once per step, and ShardedOptimizer(params, optimizer_cls, **kwargs) with step(closure) and
    # add_param_group() during training, over modules like its toy models (frozen and tied
    # parameters, one dtype, no buffers). What it does not say is not drawn; docs/guide.md's table
    # gives the reason for each feature.
    "cs336": Contract(
        "cs336",
        frozenset(
            {
                "unused-some-ranks",
                "unused-always",
                "float32-layer",
                "buffer",
                "accumulation",
                "no-sync",
                "finish-once",
                "double-backward",
                "lr-changes",
                "scheduler",
                "groups-generators",
                "reload",
                "reshard",
                "compile",
                "unbounded-bucket",
                "clip",
            }
        ),
        "what the CS336 assignment's DDP and ShardedOptimizer interfaces promise",
        # The handout asks for a balanced partition only loosely, and declares none.
        stepped_balance=False,
    ),
}


def never_drawn_off(off, never, declared=()) -> tuple[str, ...]:
    """``off`` (``features_off``) with the features a kind's strategy never draws (``never``:
    ``Kind.never_draws``, Note [Features a kind never draws] in ``paracheck.check.kinds``) and
    every feature that needs one of them, in table order, less the target's ``declared`` features
    (in every case it runs)."""
    closed = set(off) | _closed(set(never) - set(declared))
    return tuple(f.name for f in FEATURES if f.name in closed and f.name not in declared)


def without_all(case: Case, names) -> Case:
    """``case`` without any of the features ``names`` (closed as ``features_off`` closes them):
    removed in reverse table order, so that a feature that needs another (a late group, several
    steps) goes before it."""
    for f in reversed(FEATURES):
        if f.name in names and f.has(case):
            case = f.remove(case)
    return case


def closure(names) -> set[str]:
    """``names`` with every feature that implies or requires one of them: what goes with them
    when they are removed from a case (``without_all(case, closure(names))``)."""
    return _closed(names)


def _closed(off) -> set[str]:
    """``off`` with every feature that implies or requires one of it."""
    off = set(off)
    changed = True
    while changed:
        more = {f.name for f in FEATURES if set(f.implies + f.requires) & off} - off
        off |= more
        changed = bool(more)
    return off


def optional_features() -> tuple[str, ...]:
    """The features some contract leaves undrawn (``CONTRACTS`` other than ``full``), in table
    order: the rows of the verdict table beyond its core (Note [The verdict table] in
    ``paracheck.check.table``)."""
    names = set().union(*(c.off for c in CONTRACTS.values() if c.name != "full"))
    return tuple(f.name for f in FEATURES if f.name in _closed(names))


def row_off(name, off) -> tuple[str, ...]:
    """The features never drawn in the verdict table's row of feature ``name`` (None: the core;
    a tuple: a row of several features together, ``PAIRS``): those ``off`` turns off and every
    optional feature but ``name`` and what it implies or requires, closed as ``features_off``
    closes them."""
    keep: set[str] = set()
    todo = [] if name is None else ([name] if isinstance(name, str) else list(name))
    while todo:
        n = todo.pop()
        if n not in keep:
            keep.add(n)
            todo += list(_BY_NAME[n].implies + _BY_NAME[n].requires)
    closed = _closed((set(optional_features()) - keep) | set(off))
    return tuple(f.name for f in FEATURES if f.name in closed)


# Pairs of features searched together in a row of their own (Note [The verdict table] in
# ``paracheck.check.table``): a bug that needs both is drawn by neither feature's row, and the
# whole contract's row draws them together too rarely to find it within its examples (a DDP whose
# accumulation mishandles a parameter no rank used: gradients of zeros summed into a None).
PAIRS: tuple[tuple[str, str], ...] = (
    ("accumulation", "unused-always"),
    ("accumulation", "unused-some-ranks"),
)

# The contract a kind's interface was written to where the check names none (``--contract
# full``, the default): the CS336 handout's for its DDP and ShardedOptimizer interfaces.
KIND_CONTRACTS = {"ddp": "cs336", "sharded": "cs336"}


# Properties a contract's interfaces do not promise, though no contract turns them off: the
# state read from ``state_dict()`` (the CS336 handout's ShardedOptimizer has none, and its
# contract never reloads one) and the balance of the state a sharded optimizer's ranks step
# (``Contract.stepped_balance``). A cause of a row within the contract seen through one of them
# is printed with the rows beyond it (Note [Numbered once, as printed] in
# ``paracheck.check.table``).
UNPROMISED = {"cs336": frozenset({"balance", "optimizer-state", "state-consolidated"})}


def unpromised_properties(kind: str, contract: str = "full") -> frozenset[str]:
    """The properties the contract of a target of ``kind`` checked under ``contract`` does not
    promise (``UNPROMISED``), resolved as ``beyond_contract`` resolves its features."""
    name = contract if contract != "full" else KIND_CONTRACTS.get(kind, "full")
    return UNPROMISED.get(name, frozenset())


def beyond_contract(kind: str, contract: str = "full") -> frozenset[str]:
    """The optional features beyond the contract of a target of ``kind`` checked under
    ``contract``: the named contract's features not drawn, else those of the contract its
    kind's interface was written to (``KIND_CONTRACTS``); none for a kind with no such contract.
    The verdict table searches and prints the rows of these features after the others."""
    name = contract if contract != "full" else KIND_CONTRACTS.get(kind, "full")
    return frozenset(_closed(CONTRACTS[name].off)) if name in CONTRACTS else frozenset()
