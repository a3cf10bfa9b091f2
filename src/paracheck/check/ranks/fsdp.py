"""The ``fsdp`` kind's rank program: a fully sharded wrapper ``Class(module)`` (``paracheck.fsdp``)
with ``forward``, ``finish_gradient_synchronization()`` after each backward outside ``no_sync()``
(optional), and a method that returns every parameter whole (Note [Reading an FSDP]).

Every rank builds the case's model, wraps it, and builds the case's optimizer over the wrapper's
``parameters()`` (its shards and replicated parameters). Per step: the micro-steps by the case's
protocol, then ``optimizer.step()``; recorded: the gathered parameters and, where the wrapper
offers ``full_gradients()``, the gathered gradients. In a case with master weights (bfloat16,
for a wrapper whose constructor takes ``compute_dtype``) the model is built in float32 and wrapped
as ``Class(module, compute_dtype=torch.bfloat16)``: the gathered float32 parameters are recorded
as the masters and, rounded, as the parameters (Note [Compute dtype of an FSDP]); a constructor
that refuses the argument (NotImplementedError, or an error naming ``compute_dtype``) skips the
case with a note.

Note [Reading an FSDP]
    No rank holds a sharded parameter whole, so the check asks the wrapper for it: through the
    declared ``gather`` (``--gather``: a method name, or ``module:function`` called as
    ``f(wrapper)``), else the first of ``GATHER_METHODS`` it has, either returning a list in the unwrapped module's ``parameters()`` order or
    a dict keyed by its ``named_parameters()`` names (a wrapper's prefixes, ``module.`` and
    ``_fsdp_wrapped_module.``, are dropped). ``full_gradients()`` (optional, the same forms) lets the
    gradients be compared too. Both are collectives: every rank calls them, at the same points.
    The optimizer's groups are built by parameter index, so a case with several groups needs
    the wrapper's ``parameters()`` to be one per module parameter, in order; where it is not,
    such a case is skipped with a note.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
import weakref

import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from paracheck.accounting.record import collective_kind, tensors_in
from paracheck.cases import (
    Case,
    add_late_groups,
    apply_lr_schedule,
    build_case_model,
    build_optimizer,
    build_scheduler,
    step_scheduler,
)
from paracheck.check.interfaces import GATHER_METHODS, takes_keyword
from paracheck.check.loading import load_object
from paracheck.check.ranks._common import (
    on_every_rank,
    rank_device,
    snapshot,
    target_object,
    train_micro_steps,
)
from paracheck.check.ranks._drive import DDPDriver
from paracheck.check.ranks.job import RankJob
from paracheck.check.ranks.record import RankRecord, RankStep
from paracheck.world import set_step

__all__ = [
    "GATHER_METHODS",
    "CollectiveWatch",
    "Delay",
    "GatherWatch",
    "storage_elements",
    "perturbed",
    "run_fsdp",
]

# The waits before a count is believed (Note [Settling a count of live storages]).
SETTLE_SECONDS = (0.001, 0.002, 0.004, 0.008, 0.016, 0.032)


def _strip(name: str) -> str:
    """A wrapper's parameter name as the unwrapped module's: ``_fsdp_wrapped_module.`` anywhere
    and leading ``module.`` dropped."""
    name = name.replace("_fsdp_wrapped_module.", "")
    while name.startswith("module."):
        name = name.removeprefix("module.")
    return name


def in_module_order(got, names: list[str], what: str, trainable: list[bool] | None = None) -> list:
    """``got`` (a list in parameter order, or a dict by name) as a list in ``names``' order. With
    ``trainable`` (one flag per name), a list of one entry per trainable parameter is read too,
    None standing for the others (gradients: frozen parameters have none), and a dict may leave
    out the parameters that have no gradient."""
    if isinstance(got, dict):
        by_name = {_strip(str(k)): v for k, v in got.items()}
        missing = [n for n in names if n not in by_name]
        if missing and trainable is None:
            raise ValueError(
                f"{what} returned a dict without {missing[0]!r} (keys: {sorted(by_name)[:6]})"
            )
        return [by_name.get(n) for n in names]
    got = list(got)
    if trainable is not None and len(got) != len(names) and len(got) == sum(trainable):
        it = iter(got)
        return [next(it) if t else None for t in trainable]
    if len(got) != len(names):
        also = "" if trainable is None else f" (or {sum(trainable)}, one per trainable parameter)"
        raise ValueError(
            f"{what} returned {len(got)} tensors for {len(names)} parameters{also}, or give a "
            f"dict by name"
        )
    return got


def _gather(job: RankJob, wrapper):
    """(name, f()) reading every parameter whole: the declared ``gather`` (a method name, or a
    ``module:function`` called as ``f(wrapper)``), else the first of ``GATHER_METHODS``."""
    spec = job.gather
    if spec is not None and ":" in spec:
        fn = load_object(spec)
        return spec, lambda: fn(wrapper)
    name = spec or next((m for m in GATHER_METHODS if callable(getattr(wrapper, m, None))), None)
    if name is None or not callable(getattr(wrapper, name, None)):
        have = f"no method {name}()" if name else f"none of {', '.join(GATHER_METHODS)}"
        raise TypeError(
            f"{job.path} has {have}: the check cannot read the parameters whole; name the "
            "method or module:function that does with --gather (Note [Reading an FSDP] in "
            "paracheck.check.ranks.fsdp)"
        )
    return name, getattr(wrapper, name)


def run_fsdp(job: RankJob) -> RankRecord:
    case: Case = job.case
    rank = dist.get_rank()
    device = rank_device(job.device)
    cls = target_object(job.path)
    # The float32 model, wrapped with the case's dtype to compute in; the gathered float32
    # parameters are the masters (Note [Compute dtype of an FSDP]).
    compute = case.torch_dtype if case.masters_from_float32 else None
    model = build_case_model(case, rank, device=device, masters=compute is not None)
    names = [n for n, _ in model.named_parameters()]
    originals = list(model.parameters())
    trainable_mask = [p.requires_grad for p in originals]
    # A constructor taking ``prefetch`` is built with the case's depth (Note [Gathered layers
    # and the prefetch depth] in paracheck.check.properties.gathered_layers).
    prefetch = case.prefetch if takes_keyword(cls, "prefetch") else None
    kwargs = {} if prefetch is None else {"prefetch": prefetch}
    if compute is not None:
        kwargs["compute_dtype"] = compute
    try:
        wrapper = on_every_rank(lambda: cls(model, **kwargs), device, "constructing the wrapper")
    except (NotImplementedError, ValueError, TypeError) as exc:
        # A constructor that refuses a compute dtype (NotImplementedError, or an error naming
        # the argument) declares it out of its interface: no verdict, never a failure.
        if compute is None or not (
            isinstance(exc, NotImplementedError) or "compute_dtype" in str(exc)
        ):
            raise
        return RankRecord.skip(
            f"{job.path}(module, compute_dtype={compute}) raised "
            f"{type(exc).__name__} ({exc}): the compute dtype is not checked"
        )
    gather_name, gather = _gather(job, wrapper)
    full_gradients = getattr(wrapper, "full_gradients", None)
    params = list(wrapper.parameters())
    built = case
    if len(params) != len(names):
        # The wrapper's own tensors (flat shards per module, say) do not map to the module's
        # parameters one to one: only a single group over every parameter can be built.
        groups = case.optimizer.groups
        if len(groups) > 1 or set(groups[0].params or range(len(names))) != set(range(len(names))):
            return RankRecord.skip(
                f"the wrapper's parameters() gives {len(params)} tensors for the module's "
                f"{len(names)}: parameter groups by index cannot be built"
            )
        one = dataclasses.replace(groups[0], params=())
        built = dataclasses.replace(
            case, optimizer=dataclasses.replace(case.optimizer, groups=(one,))
        )
    optimizer = build_optimizer(built, params)
    scheduler = build_scheduler(case, optimizer)

    def whole(fn, what, trainable=None):
        return snapshot(in_module_order(fn(), names, what, trainable))

    def computed(masters: list) -> list:
        """The parameters a forward computes with: the masters rounded to the compute dtype."""
        return [m if m is None or not m.is_floating_point() else m.to(compute) for m in masters]

    initial_params = whole(gather, f"{gather_name}()")
    if compute is not None:
        initial_params = computed(initial_params)
    initial_buffers, steps = snapshot(model.buffers()), []
    drv = DDPDriver.of(wrapper)
    settle_above = None if prefetch is None else prefetch + 1
    for step in range(case.steps):
        set_step(step)  # named if the rank exceeds its memory cap
        add_late_groups(case, optimizer, params, step)
        optimizer.zero_grad(set_to_none=case.set_to_none)
        windows: list = []
        with GatherWatch(settle_above) as watch, perturbed(case, rank, model):
            train_micro_steps(case, drv, optimizer, rank, device, step, windows)
        gathered, peak = watch.settled(), watch.peak
        grads = None
        if full_gradients is not None:
            grads = whole(full_gradients, "full_gradients()", trainable_mask)
        optimizer.step()
        apply_lr_schedule(case, optimizer)
        step_scheduler(scheduler)
        held = storage_elements([*params, *model.parameters()])
        after = whole(gather, f"{gather_name}()")
        steps.append(
            RankStep(
                after if compute is None else computed(after),
                grads,
                windows=tuple(windows),
                gathered=gathered,
                peak_gathered=peak,
                held_param_elements=held,
                masters=None if compute is None else after,
            )
        )
    return RankRecord(
        initial_params,
        initial_buffers,
        tuple(steps),
        prefetch=prefetch,
        kept_whole=kept_whole(originals, list(model.parameters())),
    )


def storage_elements(tensors) -> int:
    """Elements of the storages behind ``tensors`` (a DTensor's local shard), each storage once,
    whole: a shard that is a view of a whole parameter counts the whole (Note [Parameters kept
    as shards] in ``paracheck.check.properties.placement``)."""
    seen: dict[int, int] = {}
    for t in tensors:
        local = t.to_local() if hasattr(t, "to_local") else t
        st = local.untyped_storage()
        seen[st._cdata] = st.nbytes() // max(1, local.element_size())
    return sum(seen.values())


def kept_whole(originals: list, now: list) -> tuple[bool, ...] | None:
    """Per parameter of the module, whether the wrapper provably holds it whole on this rank:
    the same object as before wrapping, with as many elements (at least 2: a 1-element shard
    looks whole) and every byte of its storage; None where the module's parameters are no
    longer one per original (a flat parameter). What a wrapper holds whole it need not gather
    (Note [Gathered layers and the prefetch depth])."""
    if len(now) != len(originals):
        return None
    out = []
    for orig, p in zip(originals, now):
        n = orig.numel()
        whole = p is orig and p.numel() == n >= 2
        if whole:
            st = p.untyped_storage()
            whole = st.nbytes() >= (p.storage_offset() + n) * p.element_size()
        out.append(whole)
    return tuple(out)


class CollectiveWatch(TorchDispatchMode):
    """Watches the full tensor of every floating-point collective of one ``kind`` dispatched
    inside the block (the larger of its input and output: ``paracheck.accounting.record``'s
    reading of a gather's or a reduce-scatter's message; integer and byte gathers carry metadata
    and objects, not parameters). ``alive()`` gives how many of their storages are still
    referenced and hold bytes, and how many bytes; ``settled()`` the same once backend threads
    have let go (Note [Settling a count of live storages]).

    Note [Settling a count of live storages]
        A storage the design has dropped can still be referenced for a while by the backend's
        own threads: gloo's worker releases a finished collective's work, which holds its
        output, after waking the rank that waits on it, and on a loaded machine that thread may
        not run again for milliseconds. So a count that would condemn the design is taken again
        after waits of 1, 2, 4, 8, 16 and 32 ms, until it no longer does: the rank's own thread
        is inside this watch meanwhile (in a gather, or past the step), so only references
        held by other threads can go, and what is still alive after 63 ms is held by the
        design. A count that condemns nothing costs no wait.
    """

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind
        self._watched: list = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if collective_kind(func) == self.kind:
            tensors = [
                t
                for t in tensors_in((*args, *kwargs.values(), out))
                if t.numel() and t.is_floating_point()
            ]
            if tensors:
                full = max(tensors, key=lambda t: t.untyped_storage().nbytes())
                self._watched.append(weakref.ref(full.untyped_storage()))
                self.dispatched()
        return out

    def dispatched(self) -> None:
        """Called after each watched collective is dispatched."""

    def _settle(self, above: int) -> tuple[int, int]:
        """``alive()``, taken again after each of ``SETTLE_SECONDS`` while it counts more than
        ``above`` storages (Note [Settling a count of live storages])."""
        count = self.alive()
        for wait in SETTLE_SECONDS:
            if count[0] <= above:
                break
            time.sleep(wait)
            count = self.alive()
        return count

    def settled(self) -> tuple[int, int]:
        """``alive()`` once nothing but the design holds the storages (settled above zero)."""
        return self._settle(0)

    def alive(self) -> tuple[int, int]:
        """(storages still alive with bytes, their bytes), each storage once."""
        live = {}
        for ref in self._watched:
            st = ref()
            if st is not None and st.nbytes() > 0:
                live[st._cdata] = st.nbytes()
        return len(live), sum(live.values())


class GatherWatch(CollectiveWatch):
    """A ``CollectiveWatch`` of the all-gathers (Note [Gathered parameters die with the step] in
    ``paracheck.check.properties.freed``); with ``settle_above`` (an int), ``peak`` is the most
    alive at once, counted as each gather is dispatched and settled where it passes
    ``settle_above`` (Note [Gathered layers and the prefetch depth])."""

    def __init__(self, settle_above: int | None = None):
        super().__init__("all_gather")
        self.settle_above = settle_above
        self.peak = 0

    def dispatched(self) -> None:
        if self.settle_above is not None:  # settled once per rise of the peak
            above = max(self.settle_above, self.peak)
            self.peak = max(self.peak, self._settle(above)[0])


# Note [Schedule perturbation]
#   A design that does not wait for a collective it started (an all-gather read before it
#   arrived, a reduce-scatter's output used before the other ranks' parts are in, a prefetch
#   used unwaited) is right whenever the collective happens to finish first, and that depends
#   on when each rank gets there. A case may therefore hold one rank back: ``Case.delay_at``
#   names where, ``delay_rank`` which rank, ``delay_s`` how long. That rank sleeps before
#   dispatching each of its floating-point all-gathers or reduce-scatters, or after each forward
#   of a leaf module (a layer), in its forward and backward passes (not in the reads of
#   the whole parameters the check makes). Every other rank then reaches the collective first
#   and, in a design that does not wait, reads what is not there yet. The delay is drawn (one
#   case in two, 2 or 10 ms, on any rank, shrinking to none), so a race shows in the case that
#   holds a rank back instead of in one run of several; the values computed are the same with
#   and without it, so the oracle ignores it.


class Delay(TorchDispatchMode):
    """Sleeps ``seconds`` before dispatching each floating-point collective of ``kind``."""

    def __init__(self, kind: str, seconds: float):
        super().__init__()
        self.kind, self.seconds = kind, seconds
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if collective_kind(func) == self.kind and any(
            t.is_floating_point() for t in tensors_in((*args, *kwargs.values()))
        ):
            self.count += 1
            time.sleep(self.seconds)
        return func(*args, **kwargs)


@contextlib.contextmanager
def perturbed(case: Case, rank: int, model):
    """Inside the block, this rank is held back as ``case`` says (Note [Schedule perturbation]):
    nothing where the case draws no delay or another rank is the one held back."""
    if case.delay_at is None or rank != case.delay_rank:
        yield None
        return
    if case.delay_at == "forward":

        def hold(module, inputs, output):
            time.sleep(case.delay_s)

        # Leaf modules: a wrapper may have moved the parameters off them, not their forwards.
        handles = [
            m.register_forward_hook(hold)
            for m in model.modules()
            if next(m.children(), None) is None
        ]
        try:
            yield None
        finally:
            for h in handles:
                h.remove()
        return
    kind = {"all-gather": "all_gather", "reduce-scatter": "reduce_scatter"}[case.delay_at]
    with Delay(kind, case.delay_s) as delay:
        yield delay
