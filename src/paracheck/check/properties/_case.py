"""What the driver-side properties read from a case itself: its model's parameters (built in the
driver, as rank 0 builds them), their names, and the parameter groups each belongs to."""

from __future__ import annotations

import torch

from paracheck.cases import Case, build_case_model, param_groups

__all__ = ["case_params", "group_of", "param_names"]


def case_params(case: Case) -> list:
    with torch.random.fork_rng(devices=[]):
        model = build_case_model(case, 0)
    return list(model.parameters())


def param_names(case: Case) -> list[str]:
    with torch.random.fork_rng(devices=[]):
        model = build_case_model(case, 0)
    return [n for n, _ in model.named_parameters()]


def group_of(case: Case, params) -> tuple[dict[int, dict], dict[int, int | None]]:
    """Per parameter index: its group's options, and the step its group is added at (None:
    constructor)."""
    index = {id(p): i for i, p in enumerate(params)}
    options, added = {}, {}
    for late in (False, True):
        for g in param_groups(case, params, late=late):
            at = g.pop("add_at_step", None)
            for p in g.pop("params"):
                options[index[id(p)]] = g
                added[index[id(p)]] = at
    return options, added
