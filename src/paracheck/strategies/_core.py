"""The strategies behind ``paracheck.strategies`` (see its docstring for the house style).

What they reach, because that is where data-parallel bugs live: 1-element and odd-sized layers,
biases (1-D parameters), frozen parameters, tied weights, parameters unused always or on some
ranks only (a data-dependent branch), buffers, rank-dependent initial weights, unequal per-rank
batches, 1..4 steps, gradient accumulation with and without ``no_sync()``, ``zero_grad`` both ways,
SGD / SGD with momentum / Adam / AdamW over several groups (one possibly added mid-training, lr
schedules), and bucket caps from below the smallest parameter to above the whole model, including
caps that fall exactly on a bucket boundary and None (one unbounded bucket). Also the protocols of
a training loop: one ``finish_gradient_synchronization()`` after several backward passes, and two
backward passes of one forward; and models with a float32 layer in float64 (two dtypes). Everything
shrinks toward the smallest world that communicates (Note [Worlds that communicate first]), the
smallest model, a cap of several buckets and the fewest
steps.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import strategies as st

from paracheck.cases import DTYPES, Case, GroupSpec, OptimizerSpec, batch_for
from paracheck.workloads import MLPSpec, ToySpec, build_model

__all__ = [
    "NOMINAL_DTYPES",
    "PRECISIONS",
    "bucket_sizes_mb",
    "cases",
    "mlp_specs",
    "model_specs",
    "optimizer_specs",
    "precision_settings",
    "with_precision",
    "world_sizes",
]


def _check_bounds(name: str, lo: int, hi: int, floor: int = 1) -> None:
    for arg, v in ((f"min_{name}", lo), (f"max_{name}", hi)):
        if not isinstance(v, int) or v < floor:
            raise ValueError(f"{arg}={v!r} must be an int >= {floor}")
    if lo > hi:
        raise ValueError(f"min_{name}={lo} must be <= max_{name}={hi}")


def communicating_first(sizes) -> list[int]:
    """``sizes`` (ints >= 1) in the order a case draws them: the smallest world that communicates
    first, 1 last (Note [Worlds that communicate first])."""
    return sorted(set(sizes), key=lambda v: (v == 1, v))


# Note [Worlds that communicate first]
#   A world of one rank sends nothing: it checks the local arithmetic and nothing a data-parallel
#   design adds. Hypothesis draws a choice's first value far more often than the others (the
#   first examples and its mutations favour the simplest choice), and shrinks toward it. With the
#   sizes in increasing order one derandomised float32 search of 40 DDP cases drew W = 1 in 23 and
#   W = 2 in 3, and a DDP that ignores its bucket cap survived it. So a case draws its world size
#   from the sizes with the smallest one above 1 first and 1 last: a failure shrinks toward two
#   ranks, the smallest world in which anything is communicated, and one rank stays drawn.
#   That order alone does not hold for two sizes: from (2, 1) the same search drew W = 1 in 25 of
#   40 (a ZeRO-1 clipping by its own chunk's norm met no clipped W = 2 case and survived), so
#   with one size above 1 that size is listed three times (``world_size_draws``). With more
#   sizes the order is left alone: 1 came 7-9 times in 40, and a change would move every
#   derandomised sequence of the default sizes.


def world_size_draws(sizes) -> st.SearchStrategy[int]:
    """The world size of a case, from ``sizes`` (ints >= 1; Note [Worlds that communicate
    first]): the communicating sizes first, 1 last, and 1 and a single other size at 1 : 3."""
    order = communicating_first(sizes)
    if len(order) == 2 and order[-1] == 1:
        order = [order[0]] * 3 + [1]
    return st.sampled_from(order)


def world_sizes(*, min_size: int = 1, max_size: int = 4) -> st.SearchStrategy[int]:
    """World sizes in [min_size, max_size], shrinking toward ``min_size``."""
    _check_bounds("size", min_size, max_size)
    return st.integers(min_size, max_size)


@st.composite
def mlp_specs(
    draw,
    *,
    max_layers: int = 3,
    max_width: int = 7,
    features: bool = True,
    mixed_dtypes: bool = True,
) -> MLPSpec:
    """MLP specs from 1 layer of width 1 upward; with ``features``, also frozen parameters,
    tied blocks, unused and data-dependent branches and buffers, and with ``mixed_dtypes`` one
    layer kept in float32 (each shrinks to "off")."""
    _check_bounds("layers", 1, max_layers)
    _check_bounds("width", 1, max_width)
    n = draw(st.integers(1, max_layers))
    widths = tuple(draw(st.lists(st.integers(1, max_width), min_size=n, max_size=n)))
    in_features = draw(st.integers(1, max_width))
    # Biases (1-D parameters) three times in four, shrinking to none: at one in two, one target's
    # 40 derandomised examples at world sizes 1,2,3,4,6 held a bias at world size >= 2 in a single
    # case, and a DDP that never reduces 1-D parameters passed.
    bias = draw(st.integers(0, 3)) > 0
    if not features:
        return MLPSpec(in_features=in_features, widths=widths, bias=bias)
    tied = draw(st.booleans())
    # Not sampled_from(["none", "data", "always"]): that one came out "none" in 28 of the first 40
    # derandomised draws, starving the property of the branch that breaks DDPs most. The
    # data-dependent branch (a parameter used on some ranks only) in half of the models: at one in
    # four, a DDP that reads "present" as "my hook fired in the last backward" (killed only where
    # that branch meets accumulation) survived 40 derandomised examples at world sizes 1,2,3,4,6.
    # The always-unused branch in a third: at one in six, a bucketed DDP that resets a bucket's
    # count of fired hooks only when it reaches zero passed 180 examples (Note [A never-used
    # parameter across windows]).
    unused = ("none", "data", "data", "data", "always", "always")[draw(st.integers(0, 5))]
    # Three buffers in four: a buffer only matters on ranks that start apart (rank-dependent
    # initial values, a third of cases), and at one in two the pair came up in none of the 40
    # derandomised examples at world sizes 1..4.
    buffer = draw(st.integers(0, 3)) > 0
    # The last layer's weight stays trainable so that every loss requires grad.
    names = [f"layers.{i}.weight" for i in range(n - 1)] + (
        [f"layers.{i}.bias" for i in range(n)] if bias else []
    )
    frozen = (
        tuple(sorted(draw(st.sets(st.sampled_from(names), max_size=2))))
        if names and draw(st.booleans())
        else ()
    )
    # One layer in another dtype (float32 in a float64 model, float64 in a float32 one: a float32
    # check meets mixed dtypes too): parameters of two dtypes, next to each other in
    # registration order (where a bucket planner may put them in one buffer). The first layer in
    # at least half of those: a flat buffer built in the first parameter's dtype truncates every
    # other gradient only then, and with the index drawn uniformly a DDP doing that survived 38
    # derandomised examples at world sizes 1..4.
    f32 = None
    if mixed_dtypes and draw(st.booleans()):
        f32 = 0 if draw(st.booleans()) else draw(st.integers(0, n - 1))
    return MLPSpec(
        in_features=in_features,
        widths=widths,
        bias=bias,
        frozen=frozen,
        tied=tied,
        unused=unused,
        buffer=buffer,
        float32_layer=f32,
    )


@st.composite
def model_specs(
    draw, *, max_layers: int = 3, max_width: int = 7, mixed_dtypes: bool = True
) -> MLPSpec | ToySpec:
    """MLP specs (three draws in four; they carry every feature) and the CS336 toy models,
    shrinking toward the smallest MLP."""
    mlp = draw(mlp_specs(max_layers=max_layers, max_width=max_width, mixed_dtypes=mixed_dtypes))
    # The toy model is chosen *after* an MLP is drawn: Hypothesis shrinks shortlex on its choices,
    # and a toy drawn first (fewer choices) would count as "smaller" than a 1x1 MLP.
    if draw(st.integers(0, 3)) == 3:
        return ToySpec(tied=draw(st.booleans()))
    return mlp


@st.composite
def optimizer_specs(
    draw,
    *,
    n_params: int,
    names=("sgd", "adam", "adamw"),
    max_groups: int = 3,
    late_groups: bool = True,
) -> OptimizerSpec:
    """An optimizer over ``n_params`` parameters split into 1..max_groups groups with their own
    lr / weight decay / momentum / betas; optionally a group added mid-training."""
    if n_params < 1:
        raise ValueError(f"n_params={n_params!r} must be >= 1")
    name = draw(st.sampled_from(names))
    k = draw(st.integers(1, max(1, min(max_groups, n_params))))
    # Assign each parameter a group label; group 0 is the constructor's first group.
    labels = draw(st.lists(st.integers(0, k - 1), min_size=n_params, max_size=n_params))
    groups: list[GroupSpec] = []
    for g in range(k):
        idx = tuple(i for i, lab in enumerate(labels) if lab == g)
        if not idx:
            continue
        lr = draw(st.sampled_from([0.05, 0.1, 0.01] if name == "sgd" else [1e-3, 1e-2]))
        wd = draw(st.sampled_from([0.0, 0.1]))
        mom = draw(st.sampled_from([0.0, 0.9])) if name == "sgd" else 0.0
        betas = draw(st.sampled_from([(0.9, 0.999), (0.8, 0.99)]))
        late = draw(st.sampled_from([None, 1])) if (late_groups and groups) else None
        groups.append(
            GroupSpec(
                params=idx, lr=lr, weight_decay=wd, momentum=mom, betas=betas, add_at_step=late
            )
        )
    decay = draw(st.sampled_from([1.0, 0.5]))
    as_gen = len(groups) == 1 and draw(st.booleans())
    return OptimizerSpec(name=name, groups=tuple(groups), lr_decay=decay, as_generator=as_gen)


def bucket_sizes_mb(
    *, model_bytes: int, min_bytes: int = 1, param_bytes=(), unbounded: bool = False
) -> st.SearchStrategy[float | None]:
    """Bucket caps in MB (2**20 bytes) from ``min_bytes`` (below the smallest parameter) to twice
    ``model_bytes`` (above the whole model); with ``unbounded``, also None (one unbounded bucket).

    With ``param_bytes`` (the trainable parameters' sizes in registration order), a third of the
    caps fall exactly on, or one byte either side of, the size of a contiguous run of parameters,
    i.e. a cap at which some bucket is exactly full: where off-by-one bugs in bucket filling live;
    and the other caps shrink toward a *realistic* cap, ``max(largest parameter, total / 2)``,
    which gives several buckets, of several parameters where sizes allow (total / 3 left every
    parameter alone on a typical two-layer MLP), rather than toward ``min_bytes``,
    where every parameter is alone and "the cap is ignored" or "MB compared with bytes" look
    correct. Caps down to ``min_bytes`` stay reachable. Without ``param_bytes`` caps shrink toward
    ``min_bytes``.
    """
    if not isinstance(model_bytes, int) or model_bytes < 1:
        raise ValueError(f"model_bytes={model_bytes!r} must be an int >= 1")
    if not isinstance(min_bytes, int) or not 1 <= min_bytes <= 2 * model_bytes:
        raise ValueError(
            f"min_bytes={min_bytes!r} must be an int in 1..2*model_bytes={2 * model_bytes}"
        )
    param_bytes = tuple(param_bytes)
    if any(not isinstance(b, int) or b < 1 for b in param_bytes):
        raise ValueError(f"param_bytes={param_bytes!r} must be ints >= 1")
    hi = max(min_bytes + 1, 2 * model_bytes)
    if not param_bytes:
        caps = st.integers(min_bytes, hi).map(lambda b: b / 2**20)
        return st.one_of(caps, st.none()) if unbounded else caps
    # Integers shrink toward 0: an offset from the realistic cap reaches min_bytes..hi and shrinks to it.
    # Where one parameter holds half the model or more, a cap of that parameter leaves the rest in
    # one bucket beside it, and a design that ignores the cap sends one bucket of less than cap +
    # largest parameter: a layout rule cannot tell it from a greedy plan (Note [Bucket-structure
    # rules], rule 1). Half of the rest splits the other parameters into buckets and leaves the
    # largest alone, the layout torch DDP gives a large embedding.
    largest, total = max(param_bytes), sum(param_bytes)
    realistic = max(largest, -(-total // 2)) if 2 * largest < total else -(-(total - largest) // 2)
    realistic = min(hi, max(min_bytes, realistic))
    uniform = st.integers(min_bytes - realistic, hi - realistic).map(lambda d: realistic + d)
    # A greedy bucket is a contiguous run of parameters, so the caps at which some bucket of some
    # plan is exactly full are the sums of contiguous runs (single parameters included).
    edges = {
        sum(param_bytes[a:b])
        for a in range(len(param_bytes))
        for b in range(a + 1, len(param_bytes) + 1)
    }
    near = st.tuples(st.sampled_from(sorted(edges)), st.sampled_from([0, -1, 1])).map(
        lambda t: max(min_bytes, t[0] + t[1])
    )
    # A cap that holds every gradient (shrinking to exactly all of them): one bucket is right there,
    # and a design that sends one parameter per call is wrong however right its gradients are.
    whole = st.integers(0, max(0, hi - total)).map(lambda d: max(min_bytes, total + d))
    caps = st.one_of(uniform, whole, near).map(lambda b: b / 2**20)
    # None last: one_of shrinks toward its first branch, and an unbounded bucket is no simpler.
    return st.one_of(caps, caps, caps, st.none()) if unbounded else caps


@st.composite
def cases(
    draw,
    *,
    min_world_size: int = 1,
    max_world_size: int = 4,
    world_sizes=None,
    max_steps: int = 4,
    max_accumulation: int = 3,
    dtype: str = "float64",
    models=None,
    optimizers=("sgd", "adam", "adamw"),
    rank_dependent_init: bool | None = None,
    finish_once: bool = True,
    double_backward: bool = True,
    mixed_dtypes: bool = True,
    unbounded_buckets: bool = True,
    clipping: bool = True,
    precision: str | None = None,
) -> Case:
    """Complete cases: world, model, per-rank batches (1..3 each), optimizer groups, 1..max_steps
    steps, 1..max_accumulation micro-steps with ``finish_gradient_synchronization()`` after each,
    with ``no_sync()`` or (``finish_once``) with one finish after the last, ``zero_grad`` to None or
    to zeros, a bucket cap (None among them with ``unbounded_buckets``), identical or
    rank-dependent initial weights (None: drawn); with ``double_backward``, losses backpropagated
    twice; with ``mixed_dtypes``, MLPs with a float32 layer in a float64 model; with ``clipping``,
    the global gradient norm clipped before the step in half the cases of one dtype (Note [Clip
    from the seed]). Turn a feature off for targets that do not take part in it (the sharding
    kinds).

    The world size is drawn first, from ``world_sizes`` (a collection of ints >= 1) when given,
    else from ``min_world_size..max_world_size``. From ``world_sizes`` it shrinks toward the
    smallest size above 1 (Note [Worlds that communicate first]), from the range toward the
    smallest. Draw
    it here rather than overriding it afterwards (``Case.with_world_size``): an override leaves
    choices Hypothesis varies but that change nothing (duplicate examples) and repeats one rank's
    batch size on every rank when the drawn world was smaller.

    ``precision`` (one of ``PRECISIONS``; it replaces ``dtype``) draws the parameter dtype,
    autocast and loss scaling of each case from its seed (Note [Precision from the seed]).
    """
    if precision is not None:
        _check_precision(precision)
        dtype = nominal_dtype(precision)
    sizes = _checked_world_sizes(world_sizes, min_world_size, max_world_size)
    _check_bounds("steps", 1, max_steps)
    _check_bounds("accumulation", 1, max_accumulation)
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r} must be one of {sorted(DTYPES)}")
    w = draw(
        world_size_draws(sizes)
        if world_sizes is not None
        else st.integers(min_world_size, max_world_size)
    )
    # Drawn next to the world size, not after the model and optimizer: drawn late it stayed False
    # in 33 of 36 cases of one derandomised sharding search (Hypothesis mutates a case's later
    # choices least), and a ZeRO-1 that skips the initial broadcast survived.
    rdi = draw(st.booleans()) if rank_dependent_init is None else rank_dependent_init
    spec = draw(models if models is not None else model_specs(mixed_dtypes=mixed_dtypes))
    params = list(build_model(spec, seed=0, dtype=DTYPES[dtype]).parameters())
    opt = draw(optimizer_specs(n_params=len(params), names=optimizers))
    steps = draw(st.integers(1, max_steps))
    if any(g.add_at_step is not None for g in opt.groups) and steps < 2:
        steps = 2
    acc = draw(st.integers(1, max_accumulation))
    batch = tuple(draw(st.lists(st.integers(1, 3), min_size=w, max_size=w)))
    trainable = [p.numel() * p.element_size() for p in params if p.requires_grad]
    bucket = draw(
        bucket_sizes_mb(
            model_bytes=sum(p.numel() * p.element_size() for p in params),
            param_bytes=trainable,
            unbounded=unbounded_buckets,
        )
    )
    # One draw for the accumulation protocol: 0 finish after every backward, 1 no_sync(),
    # 2 finish once after the last backward (two booleans left finish_once in 1 of 40 examples).
    protocol = draw(st.integers(0, 2 if finish_once and max_accumulation >= 2 else 1))
    no_sync = protocol == 1
    case = Case(
        model=spec,
        world_size=w,
        batch_sizes=batch,
        steps=steps,
        accumulation=acc,
        no_sync=no_sync,
        optimizer=opt,
        bucket_size_mb=bucket,
        seed=draw(st.integers(0, 2**16)),
        rank_dependent_init=rdi,
        set_to_none=draw(st.booleans()),
        dtype=dtype,
        unbounded_bucket=bucket is None,
    )
    if protocol == 2:  # one finish after several synchronised backward passes needs two of them
        case = replace(case, finish_once=True, accumulation=max(2, acc))
    elif no_sync and max_accumulation >= 2:
        # A single backward runs outside no_sync(): with one micro-step the protocol is the plain
        # one, a duplicate. Hypothesis draws one micro-step most, and from world sizes 1 and 2
        # every no_sync() case of one derandomised FSDP search had one: an FSDP reducing inside
        # no_sync() survived. Same draws, so every derandomised sequence is kept.
        case = replace(case, accumulation=max(2, acc))
    if double_backward and draw(st.integers(0, 2)) == 2:
        case = replace(case, double_backward=True)
    return _from_the_seed(
        case,
        spec=spec,
        bucket=bucket,
        trainable_bytes=sum(trainable),
        max_accumulation=max_accumulation,
        clipping=clipping,
        precision=precision,
    )


def _checked_world_sizes(world_sizes, min_world_size: int, max_world_size: int):
    """``world_sizes`` in drawing order (Note [Worlds that communicate first]), checked; or the
    range's bounds checked and None."""
    if world_sizes is None:
        _check_bounds("world_size", min_world_size, max_world_size)
        return None
    sizes = communicating_first(world_sizes)
    if not sizes or any(not isinstance(v, int) or v < 1 for v in sizes):
        raise ValueError(f"world_sizes={world_sizes!r} must be a non-empty collection of ints >= 1")
    return sizes


def _from_the_seed(
    case: Case,
    *,
    spec,
    bucket,
    trainable_bytes: int,
    max_accumulation: int,
    clipping: bool,
    precision,
) -> Case:
    """What ``cases()`` derives from a drawn case's seed rather than draws: the never-used
    parameter's windows, the data-dependent branch, the clip and the precision. ``spec`` and
    ``bucket`` are the drawn model and bucket cap."""
    if getattr(spec, "unused", "none") == "always" and case.seed % 2 == 0 and bucket is not None:
        # See Note [A never-used parameter across windows].
        case = replace(
            case, steps=max(2, case.steps), bucket_size_mb=max(bucket, trainable_bytes / 2**20)
        )
    if getattr(spec, "unused", "none") == "data":
        # From the seed, not a draw of its own: see the note.
        pattern = _BRANCH_PATTERNS[case.seed % len(_BRANCH_PATTERNS)]
        if case.finish_once and pattern in ("any", "only-inside-no-sync"):
            pattern = (
                "only-before-the-last"  # one finish after several backward passes: see the note
            )
        elif pattern == "only-inside-no-sync" and max_accumulation >= 2:
            case = replace(case, accumulation=max(2, case.accumulation), no_sync=True)
        case = replace(case, seed=_seed_for_branch_pattern(case, pattern))
    if clipping and getattr(spec, "float32_layer", None) is None:
        case = replace(case, clip_norm=clip_norm_for_seed(case.seed))
    if precision is not None:
        case = with_precision(case, precision)
    return case


# Note [Precision from the seed]
#   ``--precision`` names a family of settings (parameter dtype, autocast dtype, loss scale), and
#   which one a case gets is a function of its seed, like the clip (Note [Clip from the seed]): the
#   choices drawn are those of the single-dtype strategy, so a precision check meets the cases a
#   float32 check meets, each in one of the family's settings. bf16: bfloat16 autocast over float32
#   parameters, or bfloat16 parameters (the gradients, their reduction and the update in bfloat16);
#   fp16: float16 autocast with a GradScaler whose first backward overflows on every rank (scale
#   2**40: the step is skipped and the next runs at 2**8), with one at 2**8 (no step skipped), and
#   without a scaler; mixed: all of them and float32. A case with ``closure`` gets no scaler
#   (GradScaler.step takes no closure). Cases are drawn at the family's nominal dtype (float32, or
#   float64 for fp64): bucket caps are drawn from float32 sizes, twice a bfloat16 model's.
#   Below float32 a DDP's cases step with SGD (with or without momentum): Adam's first update of
#   an element is lr * g / (|g| + eps), about lr * sign(g), and an element whose synchronised
#   gradient is within bfloat16/float16 rounding of zero may get either sign, in the oracle and in
#   a correct target alike: a difference of 2 * lr that a per-tensor tolerance cannot tell from a
#   bug (the built-ins came within 1.6e-2 of bfloat16's 2e-2 parameter tolerance, and one fell
#   outside it). SGD's update is lr times the gradient, whose difference the tolerance bounds.
#   A sharding target's or a training loop's step is judged on the gradients it recorded (Note
#   [Comparing an update]): the oracle's Adam then sees the same signs, and their cases keep Adam
#   and AdamW (``adam=True``, and the loop strategy; a ZeRO wrapper that does not report its
#   gradients is stepped with SGD: ``run_case``).
PRECISIONS = ("fp64", "fp32", "bf16", "fp16", "mixed")
_BF16 = (("float32", "bfloat16", None), ("bfloat16", None, None))
_FP16 = (
    ("float32", "float16", 2.0**40),
    ("float32", "float16", 2.0**8),
    ("float32", "float16", None),
)
_PRECISION_SETTINGS = {
    "fp64": (("float64", None, None),),
    "fp32": (("float32", None, None),),
    "bf16": _BF16,
    "fp16": _FP16,
    "mixed": (("float32", None, None), *_BF16, *_FP16),
}


def _check_precision(precision: str) -> None:
    if precision not in _PRECISION_SETTINGS:
        raise ValueError(f"precision={precision!r} must be one of {', '.join(PRECISIONS)}")


# The dtype a check of each precision draws its cases at (before ``with_precision``).
NOMINAL_DTYPES = {p: "float64" if p == "fp64" else "float32" for p in PRECISIONS}


def nominal_dtype(precision: str) -> str:
    """The dtype a ``precision`` check draws its cases at (``NOMINAL_DTYPES``)."""
    _check_precision(precision)
    return NOMINAL_DTYPES[precision]


def precision_settings(precision: str) -> tuple[tuple[str, str | None, float | None], ...]:
    """The (dtype, autocast, loss_scale) settings of ``precision``."""
    _check_precision(precision)
    return _PRECISION_SETTINGS[precision]


def from_seed(seed: int, choices):
    """The one of ``choices`` a case's seed picks (Note [Precision from the seed])."""
    # A multiplicative hash: Hypothesis draws many small seeds, and seed // k put most of them in
    # the first choice. Seed 0, where shrinking goes, keeps the first (the simplest).
    return choices[((seed * 0x9E3779B1) >> 16) % len(choices)]


def with_precision(case: Case, precision: str, *, adam: bool = False) -> Case:
    """``case`` in the setting of ``precision`` its seed picks (Note [Precision from the seed]);
    below float32 its optimizer becomes SGD unless ``adam`` (a kind judged on the target's
    gradients)."""
    dtype, autocast, scale = from_seed(case.seed, precision_settings(precision))
    case = replace(case, dtype=dtype, autocast=autocast, loss_scale=None if case.closure else scale)
    if not adam and (dtype == "bfloat16" or autocast is not None):
        case = replace(case, optimizer=replace(case.optimizer, name="sgd"))
    return case


# Note [Clip from the seed]
#   Whether a case clips the global gradient norm, and to what, is a function of its seed, not a
#   draw: a new draw would change every derandomised sequence, and with it which cases every
#   mutant meets. Half of the values of Case.seed clip: to 0.01 (every gradient of these models is larger: the
#   clip always acts) or to 1.0 (acts in some steps only); seed 0, where shrinking goes, does not
#   clip. Models with a float32 layer in a float64 one are not clipped: torch computes each
#   dtype's norm in that dtype, and the float32 rounding of the coefficient would reach the
#   float64 tensors at step 0. Labelling removes the clip like any feature (``without``).
#   The sharding kinds, whose clipping is their own code, clip in three seed values of four, and
#   pick by a hash of the seed rather than by seed // 7: Hypothesis draws seeds 0, 1, 2, 256,
#   65536 far more often than others, which seed // 7 sent to "no clip" nearly always (a ZeRO-1
#   clipping by its own chunk's norm met no clipped two-rank case in 40 at world sizes 1 and 2).
CLIP_NORMS = (None, 0.01, None, 1.0)


SHARDING_CLIP_NORMS = (None, 0.01, 1.0, 0.01)


def clip_norm_for_seed(seed: int) -> float | None:
    return CLIP_NORMS[(seed // 7) % len(CLIP_NORMS)]


def sharding_clip_norm_for_seed(seed: int) -> float | None:
    # Knuth's multiplicative hash: seed 0 maps to 0 (no clip), the small and round seeds that
    # Hypothesis draws most spread over all four values.
    mixed = ((seed * 2654435761) & 0xFFFFFFFF) >> 16
    return SHARDING_CLIP_NORMS[mixed % len(SHARDING_CLIP_NORMS)]


# Note [Steering the data-dependent branch]
#   An MLP with unused="data" runs its branch on a rank's micro-step iff the first input of that
#   batch is positive, so which ranks and micro-steps use it follows from the seed. Left to chance,
#   the patterns that break DDPs are rare in a 40-example budget (a branch whose gradient comes
#   only from micro-steps inside no_sync() came up in about one case in a hundred). So a pattern
#   for step 0 is chosen and the first seed at or after the drawn one (at most 1024 tries) that
#   produces it is used. The pattern is the drawn seed modulo 4 rather than a draw of its own:
#   in 40 derandomised examples Hypothesis explores about a dozen distinct cases (each followed by
#   a few mutations of itself), and a separate draw came out "any" for all but one of them.
#     "any"                  no steering (seed 0, where shrinking goes, has no steering);
#     "mixed"                micro-step 0: rank 0 uses the branch, the last rank does not;
#     "only-inside-no-sync"  accumulation under no_sync(); rank 0 uses the branch in micro-step 0,
#                            no rank in the last micro-step, the one that synchronises;
#     "rank-0-never"         rank 0 never uses it in step 0 (with "mixed": a gradient on some
#                            ranks only, from either side);
#     "only-before-the-last" for ``finish_once`` cases in place of the first and third: rank 0
#                            uses the branch in micro-step 0, no rank in the last micro-step,
#                            whose backward is the last before the one finish (a gradient from
#                            an earlier backward of the same window).
#   The patterns are computed for the case's own world size: a later ``Case.with_world_size``
#   keeps rank 0's pattern only.
_BRANCH_PATTERNS = ("any", "mixed", "only-inside-no-sync", "rank-0-never")


# Note [A never-used parameter across windows]
#   A trainable parameter no rank ever uses (unused="always") leaves its bucket one gradient short
#   in every window. A design that counts a bucket's gradients and resets the count only when it
#   reaches zero launches that bucket at its first hook in the next window, before the bucket's
#   other gradients exist. That needs a second window (another step, or a second backward) and a
#   bucket holding the branch with two used parameters: drawn freely, 1.2% of cases, and such a
#   design passed 180 examples. So, from the seed (even: half of them, the shrunk seed 0 among
#   them), an always-unused case runs at least two steps with a cap holding every gradient.


def _branch_used(case: Case, seed: int, micro: int, rank: int) -> bool:
    return bool(batch_for(replace(case, seed=seed), 0, micro, rank)[0][0, 0] > 0)


def _pattern_holds(case: Case, seed: int, pattern: str) -> bool:
    w, last = case.world_size, case.accumulation - 1
    if pattern == "mixed":
        return _branch_used(case, seed, 0, 0) and (w == 1 or not _branch_used(case, seed, 0, w - 1))
    if pattern in ("only-inside-no-sync", "only-before-the-last"):
        return (
            _branch_used(case, seed, 0, 0)
            and last > 0
            and not any(_branch_used(case, seed, last, r) for r in range(w))
        )
    return not any(_branch_used(case, seed, m, 0) for m in range(last + 1))  # rank-0-never


def _seed_for_branch_pattern(case: Case, pattern: str) -> int:
    if pattern == "any":
        return case.seed
    for k in range(1024):
        seed = (case.seed + k) % (2**16 + 1)
        if _pattern_holds(case, seed, pattern):
            return seed
    return case.seed
