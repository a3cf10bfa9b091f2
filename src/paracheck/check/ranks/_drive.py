"""How a rank program drives a DDP target: construct it, start a batch, synchronise, skip sync.

Runs inside the rank processes. The training loops (``paracheck.check.ranks``) never call a target's methods directly: they call a
``DDPDriver``, so that one loop serves every way people write the CS336 interface (a class with
``finish_gradient_synchronization()``, or the handout's functions ``get_ddp(module)`` and
``ddp_on_after_backward(ddp_model, optimizer)``, ...; Note [Readings of a DDP interface] in
``paracheck.check.interfaces``). The ``RankJob`` fields read here:

* ``path``: the target's import path (a class, or a function returning the wrapper);
* ``takes_bucket``: pass ``bucket_size_mb`` (read only where the constructor's signature cannot be);
* ``finish``, ``batch_start``: the hooks, a method name or ``module:function`` (None: the CS336
  method names).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass

import torch.distributed as dist

from paracheck.cases import Case
from paracheck.check.construction import construct_ddp
from paracheck.check.interfaces import plausible_hooks
from paracheck.check.loading import load_object
from paracheck.check.ranks.job import RankJob

__all__ = ["DDPDriver", "ddp_driver"]


@dataclass
class DDPDriver:
    """One constructed DDP target and the calls the training loop makes on it.

    ``finish`` and ``batch_start`` take the optimizer: the function-style interfaces need it.
    ``no_sync`` is None where the target has no ``no_sync()`` context.
    """

    wrapper: object
    forward: Callable
    finish: Callable  # finish(optimizer)
    batch_start: Callable | None = None  # batch_start(optimizer)
    no_sync: Callable | None = None  # no_sync() -> context manager

    @classmethod
    def of(cls, wrapper) -> DDPDriver:
        """The driver of a wrapper with the method interface: called as the forward,
        ``finish_gradient_synchronization()`` after each backward, ``no_sync()`` where it has one."""
        return cls(
            wrapper=wrapper,
            forward=wrapper,
            finish=lambda optimizer: wrapper.finish_gradient_synchronization(),
            no_sync=getattr(wrapper, "no_sync", None),
        )

    def sync_context(self, skip: bool):
        return self.no_sync() if skip and self.no_sync is not None else contextlib.nullcontext()


def _bucket(case: Case) -> float | None:
    if case.unbounded_bucket:
        return None  # one unbounded bucket; a target that refuses None skips the case (run_ddp)
    return case.bucket_mb


def _construct(job: RankJob, model, case: Case, cls):
    first = next(iter(model.parameters()), None)
    return construct_ddp(
        cls,
        model,
        path=job.path,
        bucket_mb=_bucket(case),
        takes_bucket=job.takes_bucket,
        rank=dist.get_rank(),
        world_size=dist.get_world_size(),
        process_group=dist.group.WORLD,
        device=first.device if first is not None else None,
    )


def _takes_optimizer(fn) -> bool:
    """Whether the bound method ``fn`` has a required argument (then it is given the optimizer)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(
        p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        for p in params
    )


def _hook(wrapper, spec: str | None, default: str, option: str, path: str, required: bool):
    """The hook ``spec`` (Note [Readings of a DDP interface]) as ``f(optimizer)``, or None."""
    if spec is not None and ":" in spec:
        fn = load_object(spec)
        return lambda optimizer: fn(wrapper, optimizer)
    name = spec or default
    method = getattr(wrapper, name, None)
    if method is None:
        if not required:
            return None
        others = plausible_hooks(type(wrapper), "finish" if option == "--finish" else "batch_start")
        hint = f"; it has {others[0]}(): pass {option} {others[0]}" if others else ""
        raise AttributeError(
            f"the DDP wrapper {type(wrapper).__name__} built by {path} has no {name}(){hint} (or "
            f"name the method or module:function that does it with {option})"
        )
    if _takes_optimizer(method):
        return lambda optimizer: method(optimizer)
    return lambda optimizer: method()


def ddp_driver(job: RankJob, model, case: Case, cls) -> DDPDriver:
    """Construct the DDP target ``cls`` around ``model`` for ``case``; see the module docstring."""
    path = job.path
    wrapper = _construct(job, model, case, cls)
    if wrapper is None:
        raise TypeError(f"{path}(module) returned None: it must return the DDP-wrapped model")
    if callable(wrapper):
        forward = wrapper
    elif callable(getattr(wrapper, "forward", None)):
        forward = wrapper.forward  # a plain object holding the module: its forward is the model's
    else:
        raise TypeError(
            f"the DDP wrapper {type(wrapper).__name__} built by {path} is neither callable nor has "
            f"forward()"
        )
    return DDPDriver(
        wrapper=wrapper,
        forward=forward,
        finish=_hook(
            wrapper,
            job.finish,
            "finish_gradient_synchronization",
            "--finish",
            path,
            required=True,
        ),
        batch_start=_hook(
            wrapper,
            job.batch_start,
            "on_train_batch_start",
            "--batch-start",
            path,
            required=job.batch_start is not None,
        ),
        no_sync=getattr(wrapper, "no_sync", None),
    )
