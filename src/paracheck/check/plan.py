"""One plan per check: ``plan(settings, targets)`` works out, once and before any rank starts,
everything a check of each target decides, and refuses what cannot run.

Note [One plan per check]
    The command line, the pytest plugin, the selftest and ``check_target`` only map their inputs
    onto ``CheckSettings`` (``paracheck.check.settings``) and call ``plan``. Here, and nowhere
    else, the world sizes are parsed and given their default (``DEFAULT_WORLD_SIZES`` on gloo,
    the agents attached, the devices on nccl), the precision of each target is resolved (an
    explicit ``precision`` or ``dtype``, else its kind's dtype or its declared reduction dtype, a
    loop's own autocast), the features turned off are validated at that precision, and the
    numbers, the database and the budget are settled. The result is a frozen ``CheckPlan`` per
    target whose ``settings`` carry these decisions written back (the world sizes a sorted
    tuple, the target's precision, no dtype, the database or None, the budget or None): the
    search reads the plan and parses or defaults none of them again.

    Every refusal is one ``InvalidArgument(option, value, rule)`` naming a field of
    ``CheckSettings``; each surface prints it with its own flag (``InvalidArgument.text``):
    ``--world-sizes=0`` on the command line, ``--paracheck-world-sizes=0`` in pytest,
    ``world_sizes=(0,)`` for a keyword of ``check_target``. A new option is one row of
    ``settings.OPTIONS``, one field of ``CheckSettings`` and, where it is decided before the
    check runs, one field here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from paracheck.check.kinds import KINDS, STEP, resolve_properties
from paracheck.check.settings import (
    DEFAULT_WORLD_SIZES,
    PRECISIONS,
    PROFILES,
    CheckSettings,
)
from paracheck.check.targets import Target
from paracheck.errors import InvalidArgument

__all__ = [
    "DEFAULT_WORLD_SIZES",
    "DTYPE_PRECISIONS",
    "CheckPlan",
    "InvalidArgument",
    "plan",
    "plan_target",
    "settled",
    "world_sizes",
]

# The precision a ``dtype`` stands for.
DTYPE_PRECISIONS = {"float64": "fp64", "float32": "fp32", "bfloat16": "bf16"}


@dataclass(frozen=True)
class CheckPlan:
    """What a check of ``target`` decides before it runs (Note [One plan per check]).

    ``settings`` are the settings it was planned from with the decisions below written back; the
    search reads them. ``refused`` says why the target is not checked at all (a loop that applies
    its own precision, where another is given): the surface drops it or refuses it by name."""

    target: Target
    settings: CheckSettings
    world_sizes: tuple[int, ...]
    precision: str  # fp64, fp32, bf16, fp16 or mixed
    dtype: str  # the dtype its cases are drawn at before their precision is applied
    features_off: tuple[str, ...]  # never drawn, in table order (less the target's declarations)
    properties: frozenset[str]
    database: str | None  # the saved cases' folder; None: nothing saved or replayed
    timeout: float | None  # longest a case may run (None: the World's)
    budget: float | None  # seconds for the verdict table (None: no limit)
    examples: int
    seed: int | None  # 0: Hypothesis's derandomised sequence; None: random
    replay: str  # the options after the target's name that a replay command carries
    refused: str | None = None
    # (feature, why) the target's interface cannot be asked for: never drawn, in any search, and
    # its row reads "not supported" (``paracheck.check.interfaces.unsupported``).
    unsupported: tuple[tuple[str, str], ...] = ()
    # (feature, why) never drawn at this check's precision (in ``features_off`` too).
    off_at_precision: tuple[tuple[str, str], ...] = ()


def plan(
    settings: CheckSettings, targets: Sequence[Target], *, pool: Mapping | None = None
) -> tuple[CheckPlan, ...]:
    """One ``CheckPlan`` per target (Note [One plan per check]); ``pool`` the agents attached
    (``size``, ``backend``), which bound and give the world sizes. An ``InvalidArgument`` for a
    setting that cannot run; with no targets, the settings alone are checked."""
    shared = settled(settings, pool=pool)
    return tuple(_plan_target(shared, t) for t in targets)


def plan_target(settings: CheckSettings, target: Target) -> CheckPlan:
    """The plan of one target, its refusal an ``InvalidArgument`` of the precision."""
    (one,) = plan(settings, (target,))
    if one.refused is not None:
        given = "precision" if settings.precision is not None else "dtype"
        raise InvalidArgument(given, getattr(settings, given), one.refused)
    return one


def settled(settings: CheckSettings, *, pool: Mapping | None = None) -> CheckSettings:
    """``settings`` with what no target changes settled: the world sizes parsed and defaulted,
    the numbers checked, ``dtype`` turned into an explicit precision, the features checked at it,
    the database and the budget. An ``InvalidArgument`` for the first that cannot run."""
    _check_numbers(settings)
    if settings.profile not in PROFILES:
        raise InvalidArgument("profile", settings.profile, f"must be one of {', '.join(PROFILES)}")
    explicit = _explicit_precision(settings)
    if settings.features is not None:
        from paracheck.check.feature_choice import parse_features

        # Parsed here, once; every later reader takes these changes as they are.
        settings = settings.replace(features=parse_features(settings.features))
    if settings.features is not None or settings.contract != "full":
        _features_off(settings, explicit or "fp64")  # refused before any target is read
    return settings.replace(
        world_sizes=world_sizes(settings, pool=pool),
        precision=explicit,
        dtype=None,
        database=None if settings.case is not None else settings.example_database,
        no_database=settings.case is not None or settings.no_database,
        budget=settings.budget or None,
    )


def world_sizes(settings: CheckSettings, *, pool: Mapping | None = None) -> tuple[int, ...]:
    """The world sizes a check draws, sorted: the ``case``'s, else ``world_sizes`` (text
    ``"1,2,4"`` or integers), else the default (the agents attached, ``DEFAULT_WORLD_SIZES`` on
    gloo, every device on nccl). Refused: a size below 1, above the agents attached, or above
    what this machine runs on gloo without ``allow_large_world`` (Note [Gloo rank limit])."""
    given = settings.world_sizes
    sizes: tuple[int, ...]
    if settings.case is not None and hasattr(settings.case, "world_size"):
        option, sizes = "case world_size", (settings.case.world_size,)
        value: object = sizes[0]
    elif given is None:
        option, sizes = "world_sizes", _default_world_sizes(settings.backend, pool)
        value = ",".join(map(str, sizes))
    else:
        option, sizes, value = "world_sizes", _parse_sizes(given), given
    bad = [s for s in sizes if s < 1]
    if bad:
        raise InvalidArgument(option, value, f"world size {bad[0]} must be >= 1")
    if pool is not None:
        if max(sizes) > pool["size"]:
            raise InvalidArgument(
                option,
                value,
                f"world size {max(sizes)} exceeds the {pool['size']} agents at "
                f"{{option:attach}}={settings.attach}",
            )
    elif settings.backend == "gloo" and not settings.allow_large_world:
        from paracheck.check.limits import world_size_rule

        rule = world_size_rule(sizes, "{option:allow_large_world}")
        if rule is not None:
            raise InvalidArgument(option, value, rule)
    return tuple(sorted(set(sizes)))


def _parse_sizes(given) -> tuple[int, ...]:
    if isinstance(given, str):
        try:
            sizes = tuple(int(s) for s in given.split(",") if s.strip())
        except ValueError:
            raise InvalidArgument(
                "world_sizes", given, "must be comma-separated integers, e.g. 1,2,4"
            ) from None
    else:
        try:
            sizes = tuple(int(s) for s in given)
        except (TypeError, ValueError):
            raise InvalidArgument("world_sizes", given, "must be integers") from None
    if not sizes:
        raise InvalidArgument("world_sizes", given, "names no world size")
    return sizes


def _default_world_sizes(backend: str | None, pool: Mapping | None) -> tuple[int, ...]:
    if pool is not None:
        return tuple(range(1, pool["size"] + 1))
    if backend == "nccl":
        import torch

        return tuple(range(1, torch.cuda.device_count() + 1)) or (1,)
    return DEFAULT_WORLD_SIZES


# The numeric options, each with what it must be: a positive number, or a finite one.
_POSITIVE = ("timeout", "rank_memory", "attach_timeout")


def _check_numbers(settings: CheckSettings) -> None:
    for name in _POSITIVE:
        value = getattr(settings, name)
        if value is not None and not value > 0:
            unit = " (GB)" if name == "rank_memory" else ""
            raise InvalidArgument(name, value, f"must be > 0{unit}")
    budget = settings.budget
    if budget is not None and not (math.isfinite(budget) and budget >= 0):
        raise InvalidArgument("budget", budget, "must be a number of seconds >= 0 (0: no limit)")
    clip = settings.clip_norm
    if clip is not None and not (
        isinstance(clip, (int, float)) and math.isfinite(clip) and clip > 0
    ):
        raise InvalidArgument("clip_norm", clip, "must be a finite number > 0")
    if settings.max_examples is not None and not settings.max_examples > 0:
        raise InvalidArgument("max_examples", settings.max_examples, "must be > 0")


def _explicit_precision(settings: CheckSettings) -> str | None:
    """The precision given: ``precision``, which replaces ``dtype`` (``check_target``'s rule; the
    command line refuses the two where they disagree), else the one ``dtype`` stands for; None:
    each target's own."""
    precision, dtype = settings.precision, settings.dtype
    if precision is not None:
        if precision not in PRECISIONS:
            raise InvalidArgument("precision", precision, f"must be one of {', '.join(PRECISIONS)}")
        return precision
    if dtype is None:
        return None
    if dtype not in DTYPE_PRECISIONS:
        raise InvalidArgument("dtype", dtype, f"must be one of {', '.join(DTYPE_PRECISIONS)}")
    return DTYPE_PRECISIONS[dtype]


def _features_off(settings: CheckSettings, precision: str) -> tuple[str, ...]:
    """The features never drawn at ``precision`` (``features_off``); its ``FeatureError`` is an
    ``InvalidArgument`` naming ``contract`` or ``features``."""
    from paracheck.check.feature_choice import features_off
    from paracheck.strategies._core import NOMINAL_DTYPES

    return features_off(settings.contract, settings.features, dtype=NOMINAL_DTYPES[precision])


def _target_precision(settings: CheckSettings, target: Target) -> tuple[str, str | None]:
    """The precision ``target`` is checked at, and why it is not checked (None: it is)."""
    explicit = settings.precision
    precision = explicit
    if precision is None:
        # A declared reduction dtype (Note [Declared reduction dtype]) is judged on parameters
        # no wider than it: float32 parameters for a float32 reduction.
        precision = DTYPE_PRECISIONS[target.reduce_dtype or KINDS[target.kind].dtype]
    if STEP not in KINDS[target.kind].owns:
        return precision, None
    # A training step applies autocast and loss scaling itself (Note [A loop's own precision]).
    from paracheck.strategies._loop import loop_precision

    try:
        if explicit is not None:
            loop_precision(explicit, target.autocast)
        if target.autocast is not None:
            precision = loop_precision(precision, target.autocast) or precision
    except ValueError as exc:  # "precision='fp16': a training loop ...": the option is named
        return precision, str(exc).removeprefix(f"precision={explicit!r}: ")
    return precision, None


def _plan_target(shared: CheckSettings, target: Target) -> CheckPlan:
    from paracheck.check.features import never_drawn_off, optional_features
    from paracheck.check.interfaces import unsupported
    from paracheck.check.search import declared_features
    from paracheck.strategies._core import NOMINAL_DTYPES

    precision, refused = _target_precision(shared, target)
    declared = declared_features(target)
    off = () if refused else _features_off(shared, precision)
    declined = tuple(
        (name, why)
        for name in optional_features()
        if name not in off and name not in declared and name not in KINDS[target.kind].never_draws
        for why in (unsupported(target, name),)
        if why is not None
    )
    # Note [Compiled cases] in paracheck.cases._compile: only float32 and float64 cases without
    # autocast are compiled.
    at_precision = (
        (("compile", f"no case is compiled at precision {precision} (Note [Compiled cases])"),)
        if precision in ("bf16", "fp16") and "compile" not in off
        else ()
    )
    never = (
        *KINDS[target.kind].never_draws,
        *(name for name, _ in declined),
        *(name for name, _ in at_precision),
    )
    settings = shared.replace(precision=precision)
    assert isinstance(settings.world_sizes, tuple)  # settled
    return CheckPlan(
        target=target,
        settings=settings,
        world_sizes=settings.world_sizes,
        precision=precision,
        dtype=NOMINAL_DTYPES[precision],
        features_off=never_drawn_off(off, never, declared),
        properties=resolve_properties(
            target.kind, target.properties, takes_bucket=target.takes_bucket
        ),
        database=settings.database,
        timeout=settings.timeout,
        budget=settings.budget,
        examples=settings.examples,
        seed=settings.search_seed,
        replay=target.cli_options() + settings.replayed,
        refused=refused,
        unsupported=declined,
        off_at_precision=at_precision,
    )
