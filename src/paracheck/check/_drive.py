"""How a rank program drives a DDP target: construct it, start a batch, synchronise, skip sync.

Runs inside the rank processes. The training loops (``paracheck.check._rank`` and
``paracheck.check._rank_zero``) never call a target's methods directly: they call a
``DDPDriver``, so that one loop serves every way people write the CS336 interface (a class with
``finish_gradient_synchronization()``, or the handout's functions ``get_ddp(module)`` and
``ddp_on_after_backward(ddp_model, optimizer)``, ...). ``payload`` keys read here:

* ``path``: the target's import path; ``takes_bucket``: pass ``bucket_size_mb``.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable

from paracheck.cases import Case

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

    def sync_context(self, skip: bool):
        return self.no_sync() if skip and self.no_sync is not None else contextlib.nullcontext()


def _bucket(case: Case) -> float:
    return case.bucket_size_mb if case.bucket_size_mb is not None else 25.0


def ddp_driver(payload: dict, model, case: Case, cls) -> DDPDriver:
    """Construct the DDP target ``cls`` around ``model`` for ``case``; see the module docstring."""
    wrapper = cls(model, _bucket(case)) if payload.get("takes_bucket") else cls(model)
    start = getattr(wrapper, "on_train_batch_start", None)
    return DDPDriver(
        wrapper=wrapper,
        forward=wrapper,
        finish=lambda optimizer: wrapper.finish_gradient_synchronization(),
        batch_start=None if start is None else (lambda optimizer: start()),
        no_sync=getattr(wrapper, "no_sync", None),
    )
