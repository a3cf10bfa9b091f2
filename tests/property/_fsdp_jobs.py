"""Rank jobs for the FSDP tests: what one rank holds, and when gathered parameters die."""

import weakref

import torch
import torch.distributed as dist
from torch import nn

from paracheck.fsdp import FSDP

# Weights of 35, 20 and 12 elements (uneven at W = 2, 3, 4), sharded; biases replicated.
WIDTHS = (7, 5, 4, 3)


def _model():
    torch.manual_seed(0)
    layers = []
    for a, b in zip(WIDTHS[:-1], WIDTHS[1:]):
        layers += [nn.Linear(a, b), nn.Tanh()]
    return nn.Sequential(*layers[:-1]).double()


def held(_payload):
    """(bytes of parameters this rank holds, numel of each parameter it holds)."""
    fsdp = FSDP(_model())
    return (
        sum(p.numel() * p.element_size() for p in fsdp.parameters()),
        [p.numel() for p in fsdp.parameters()],
    )


class _Watched(FSDP):
    def __init__(self, module):
        super().__init__(module)
        self.refs, self.live_at_gather = [], []

    def _gather_into(self, owner, args):
        self.live_at_gather.append(len(self._live))
        super()._gather_into(owner, args)
        self.refs += [weakref.ref(owner.__dict__[name]) for name, _ in self._by_module[owner]]


def lifetimes(_payload):
    """(parameters gathered in forward, how many of them are alive after it, other modules'
    gathered parameters alive at each gather, whether backward then gave every shard a
    gradient)."""
    fsdp = _Watched(_model())
    x = torch.randn(
        3, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(dist.get_rank())
    )
    loss = fsdp(x).square().sum()
    alive = sum(r() is not None for r in fsdp.refs)
    loss.backward()
    fsdp.finish_gradient_synchronization()
    return (
        len(fsdp.refs),
        alive,
        fsdp.live_at_gather,
        all(p.grad is not None for p in fsdp.parameters() if p.requires_grad),
    )


class OwnNames(nn.Module):
    """A user's FSDP whose whole-parameter reader has a name of its own: ``materialize()``."""

    def __init__(self, module):
        super().__init__()
        self.inner = FSDP(module)

    def forward(self, *args):
        return self.inner(*args)

    def finish_gradient_synchronization(self):
        self.inner.finish_gradient_synchronization()

    def no_sync(self):
        return self.inner.no_sync()

    def materialize(self):
        return dict(zip(self._names(), self.inner.gather_full_params()))

    def _names(self):
        return [n for n, _ in self.inner.module.named_parameters()]


def gather_all(wrapper):
    """The ``module:function`` reading of the same wrapper."""
    return wrapper.inner.gather_full_params()


class MyFSDP(OwnNames):
    """The CS336 constructor ``FSDP(module, compute_dtype=None)`` and a reader of its own."""

    def __init__(self, module, compute_dtype=None):
        super().__init__(module)


class _CalledTwice(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4, bias=False)
        self.b = nn.Linear(4, 2, bias=False)

    def forward(self, x):
        return self.b(self.a(torch.tanh(self.a(x))))


def torch_fsdp_reductions(payload):
    """The gradient collectives of one synchronised backward of a module called twice per
    forward, plain and after a no_sync() micro-batch, as (kind, payload bytes): through torch's
    fully_shard (``TorchFSDP``), or the wrapper ``payload`` names."""
    from paracheck.accounting.traffic import record_collectives
    from paracheck.check.targets import load_object
    from paracheck.fsdp.torch_fsdp import TorchFSDP

    cls = TorchFSDP if payload is None else load_object(payload)
    out = []
    for no_sync in (False, True):
        torch.manual_seed(0)
        m = cls(_CalledTwice().double())
        x = torch.randn(3, 4, dtype=torch.float64)
        with record_collectives() as rec:
            if no_sync:
                with m.no_sync():
                    m(x).sum().backward()
            m(x).sum().backward()
            m.finish_gradient_synchronization()
        out.append([c for c in rec.calls if c[0] != "all_gather"])
    return out


def compute_dtype_ledger(_payload):
    """One step of the reference with compute_dtype=torch.bfloat16 over a float32 model: (dtypes
    of the floating all-gathers, of the reductions, of the shards, of their gradients, of the
    output)."""
    from paracheck.accounting.traffic import record_collectives

    torch.manual_seed(0)
    layers = []
    for a, b in zip(WIDTHS[:-1], WIDTHS[1:]):
        layers += [nn.Linear(a, b), nn.Tanh()]
    fsdp = FSDP(nn.Sequential(*layers[:-1]), compute_dtype=torch.bfloat16)
    x = torch.randn(3, 7, generator=torch.Generator().manual_seed(dist.get_rank()))
    with record_collectives() as rec:
        out = fsdp(x)
        out.float().square().sum().backward()
        fsdp.finish_gradient_synchronization()
    typed = rec.typed_calls
    return (
        {d for name, d, _ in typed if name == "all_gather"},
        {d for name, d, _ in typed if name in ("all_reduce", "reduce_scatter")},
        {str(p.dtype).removeprefix("torch.") for p in fsdp.parameters()},
        {str(p.grad.dtype).removeprefix("torch.") for p in fsdp.parameters()},
        str(out.dtype).removeprefix("torch."),
    )


class _WithUnused(nn.Module):
    def __init__(self):
        super().__init__()
        self.used = nn.Linear(4, 2)
        self.unused = nn.Linear(4, 2)  # never called

    def forward(self, x):
        return self.used(x)


def torch_fsdp_unused_group_in_no_sync(reduce_dtype):
    """One backward inside ``set_requires_gradient_sync(False)`` of a model whose submodule
    ``unused`` never runs, each submodule and the root under ``fully_shard`` with
    ``MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=...)`` ("float32" or None): None,
    or the error it raised as "Type: message"."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    torch.manual_seed(0)
    model = _WithUnused()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    policy = MixedPrecisionPolicy(
        param_dtype=torch.bfloat16,
        reduce_dtype=None if reduce_dtype is None else getattr(torch, reduce_dtype),
    )
    for m in (model.used, model.unused):
        fully_shard(m, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    model.set_requires_gradient_sync(False)
    try:
        model(torch.randn(3, 4)).float().sum().backward()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


class RefusesComputeDtype(FSDP):
    """The CS336 constructor with the compute dtype left unimplemented, refused by name."""

    def __init__(self, module, compute_dtype=None):
        if compute_dtype is not None:
            raise ValueError(f"compute_dtype={compute_dtype} is not supported")
        super().__init__(module)


def prefetch_peaks(depth):
    """(the most gathered storages alive at once in a second forward and backward of a 4-layer
    model without biases through the reference with ``prefetch=depth``, whether its gradients
    equal those without prefetch bit for bit)."""
    from paracheck.check.ranks.fsdp import GatherWatch

    def model():
        torch.manual_seed(0)
        return nn.Sequential(*(nn.Linear(5, 5, bias=False) for _ in range(4))).double()

    x = torch.randn(3, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    grads = []
    for d in (depth, 0):
        fsdp = FSDP(model(), prefetch=d)
        fsdp(x).sum().backward()  # the first forward records the order
        for p in fsdp.parameters():
            p.grad = None
        with GatherWatch(settle_above=d + 1) as watch:
            fsdp(x).sum().backward()
        fsdp.finish_gradient_synchronization()
        grads.append([p.grad.clone() for p in fsdp.parameters()])
        if d == depth:
            peak = watch.peak
    return peak, all(torch.equal(a, b) for a, b in zip(*grads))


class ShardsEverything(FSDP):
    """A correct reading that shards every trainable parameter, biases too (each gathered on its
    own: two storages per linear layer with a bias)."""

    def _is_sharded(self, p):
        return p.requires_grad


def per_layer_ledger(prefetch):
    """The collectives of one synchronised step of a 4-layer model without biases (weights of
    5x5, 5x4, 4x3, 3x2) through the reference with ``prefetch``, after a first forward that
    records the order: [(kind, elements)] in forward+backward, then in finish."""
    from paracheck.accounting.traffic import record_collectives

    torch.manual_seed(0)
    sizes = [(5, 5), (5, 4), (4, 3), (3, 2)]
    model = nn.Sequential(*(nn.Linear(a, b, bias=False) for a, b in sizes)).double()
    fsdp = FSDP(model, prefetch=prefetch)
    x = torch.randn(3, 5, dtype=torch.float64)
    fsdp(x).sum().backward()
    fsdp.finish_gradient_synchronization()
    with record_collectives() as rec:
        fsdp(x).sum().backward()
    passes = [(kind, nbytes // 8) for kind, nbytes in rec.calls]
    with record_collectives() as rec:
        fsdp.finish_gradient_synchronization()
    return passes, [(kind, nbytes // 8) for kind, nbytes in rec.calls]


def held_back(payload):
    """One forward and backward of the reference FSDP over ``_model()`` inside
    ``perturbed(case, rank, model)``, for ``case`` = ``payload`` (delay_at, delay_s) at world
    size W with rank W - 1 held back: (rank, collectives the Delay slept before or None, wall
    seconds of the pass)."""
    import time

    from paracheck.cases import Case
    from paracheck.check.ranks.fsdp import perturbed

    at, seconds = payload
    W, rank = dist.get_world_size(), dist.get_rank()
    case = Case(world_size=W, batch_sizes=(1,) * W, delay_at=at, delay_rank=W - 1, delay_s=seconds)
    model = _model()
    fsdp = FSDP(model)
    x = torch.randn(2, WIDTHS[0], dtype=torch.float64)
    start = time.perf_counter()
    with perturbed(case, rank, model) as delay:
        fsdp(x).square().sum().backward()
        fsdp.finish_gradient_synchronization()
    return rank, None if delay is None else delay.count, time.perf_counter() - start
