"""A case's optimizer (``paracheck.cases``): ``OptimizerSpec`` and ``GroupSpec``, the values,
and how the optimizer, its late groups and its LR scheduler are built from a case."""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

__all__ = [
    "SCHEDULERS",
    "GroupSpec",
    "OptimizerSpec",
    "add_late_groups",
    "apply_lr_schedule",
    "build_optimizer",
    "build_scheduler",
    "param_groups",
    "params_in_groups",
    "step_scheduler",
]

_OPTIMIZERS = ("sgd", "adam", "adamw")


@dataclass(frozen=True)
class GroupSpec:
    """One parameter group: indices into ``list(model.parameters())`` and its hyper-parameters.

    ``add_at_step`` is None for a group given to the constructor; k >= 1 means
    ``optimizer.add_param_group`` is called just before step k (0-based), mid-training.
    """

    params: tuple[int, ...]
    lr: float = 0.05
    weight_decay: float = 0.0
    momentum: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    add_at_step: int | None = None

    def options(self, name: str) -> dict:
        if name == "sgd":
            return {"lr": self.lr, "momentum": self.momentum, "weight_decay": self.weight_decay}
        return {"lr": self.lr, "betas": tuple(self.betas), "weight_decay": self.weight_decay}


@dataclass(frozen=True)
class OptimizerSpec:
    """An optimizer (``sgd``, ``adam``, ``adamw``) over parameter groups.

    ``lr_decay`` multiplies every group's lr after each step, as an LR scheduler would, through
    ``optimizer.param_groups`` (a sharded optimizer must honour that). ``as_generator`` passes a
    single group's parameters as a generator instead of a list.

    ``scheduler`` (None, ``"step"`` or ``"lambda"``, ``SCHEDULERS``) is a torch LR scheduler built on
    the optimizer right after construction and stepped after every ``optimizer.step()``; it reads
    and writes ``param_groups`` (``lr``, ``initial_lr``). ``groups_as_generators`` passes every
    group as a dict whose ``params`` is a generator (consumed once).
    """

    name: str = "sgd"
    groups: tuple[GroupSpec, ...] = ()
    lr_decay: float = 1.0
    as_generator: bool = False
    scheduler: str | None = None
    groups_as_generators: bool = False

    def __post_init__(self):
        if self.name not in _OPTIMIZERS:
            raise ValueError(f"optimizer name={self.name!r} must be one of {_OPTIMIZERS}")
        object.__setattr__(self, "groups", tuple(self.groups))
        if self.scheduler is not None and self.scheduler not in SCHEDULERS:
            raise ValueError(
                f"scheduler={self.scheduler!r} must be None or one of {sorted(SCHEDULERS)}"
            )
        if self.scheduler == "lambda" and any(g.add_at_step is not None for g in self.groups):
            raise ValueError(
                "scheduler='lambda' with a group added by add_param_group: LambdaLR cannot step a "
                "group added after it was built (torch raises); use scheduler='step'"
            )

    @property
    def cls(self) -> type[torch.optim.Optimizer]:
        return {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[
            self.name
        ]


class _WithOptimizer(Protocol):
    """What the functions below read of a case: its optimizer. (A ``Case`` is one; naming the
    protocol, not ``Case``, keeps this module below ``paracheck.cases._case``, which imports the
    specs above.)"""

    @property
    def optimizer(self) -> OptimizerSpec: ...


def param_groups(case: _WithOptimizer, params: list, *, late: bool = False) -> list[dict]:
    """Groups for the constructor (``late=False``) or for ``add_param_group`` (``late=True``)."""
    opt = case.optimizer
    named = {i for g in opt.groups for i in g.params}
    rest = [i for i in range(len(params)) if i not in named]
    out = []
    for g in opt.groups:
        if (g.add_at_step is not None) != late:
            continue
        # An empty index tuple means "every parameter no other group names".
        idx = g.params or rest
        d = {"params": [params[i] for i in idx], **g.options(opt.name)}
        if late:
            d["add_at_step"] = g.add_at_step
        out.append(d)
    return out


def build_optimizer(case: _WithOptimizer, params: list, optimizer_cls=None, **extra):
    """The case's optimizer over ``params`` (``list(model.parameters())``).

    ``optimizer_cls`` replaces the torch class with a wrapper that takes
    ``(params, optimizer_cls, **kwargs)`` (the CS336 ShardedOptimizer interface).
    """
    groups = param_groups(case, params)
    opt = case.optimizer
    if opt.groups_as_generators:
        groups = [{**g, "params": (p for p in g["params"])} for g in groups]
    if opt.as_generator and len(groups) == 1:
        first = groups[0]
        params_arg: Iterable[Any] = (p for p in first.pop("params"))
        kwargs = first
    else:
        params_arg, kwargs = groups, {}
    if optimizer_cls is None:
        return opt.cls(params_arg, **kwargs)
    return optimizer_cls(params_arg, opt.cls, **kwargs, **extra)


def add_late_groups(case: _WithOptimizer, optimizer, params: list, step: int) -> None:
    for g in param_groups(case, params, late=True):
        if g.pop("add_at_step") == step:
            optimizer.add_param_group(g)


def params_in_groups(case: _WithOptimizer, params: list, step: int) -> list:
    """The parameters of ``params`` that the case's optimizer holds at step ``step`` (its
    constructor's groups and the groups added at or before ``step``), in ``params`` order."""
    groups = param_groups(case, params) + [
        g for g in param_groups(case, params, late=True) if g["add_at_step"] <= step
    ]
    held = {id(p) for g in groups for p in g["params"]}
    return [p for p in params if id(p) in held]


def apply_lr_schedule(case: _WithOptimizer, optimizer) -> None:
    if case.optimizer.lr_decay != 1.0:
        for group in optimizer.param_groups:
            group["lr"] *= case.optimizer.lr_decay


def _warmup(step: int) -> float:
    # Below 1 from the start: LambdaLR changes every lr when it is constructed, before step 0.
    return (step + 1) / 3 if step < 2 else 0.5


# The case's LR schedulers. LambdaLR covers only the groups present when it is built (torch
# raises when it steps a later one), so cases pair it with constructor groups only.
SCHEDULERS = {
    "step": lambda optimizer: torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5),
    "lambda": lambda optimizer: torch.optim.lr_scheduler.LambdaLR(optimizer, _warmup),
}


def step_scheduler(scheduler) -> None:
    """``scheduler.step()``, or nothing for None. A step the GradScaler skipped never called
    ``optimizer.step()``, and torch warns that the schedule went first; it did not (it follows the
    case's steps, as in real training), so that one warning is not shown."""
    if scheduler is None:
        return
    with warnings.catch_warnings():
        # A regular expression, matched at the message's start: the parentheses escaped.
        warnings.filterwarnings(
            "ignore", message=re.escape("Detected call of `lr_scheduler.step()`")
        )
        scheduler.step()


def build_scheduler(case: _WithOptimizer, optimizer):
    """The case's LR scheduler on ``optimizer`` (None without one). Build it right after the
    optimizer; torch raises TypeError when ``optimizer`` is not a ``torch.optim.Optimizer``."""
    name = case.optimizer.scheduler
    return None if name is None else SCHEDULERS[name](optimizer)
