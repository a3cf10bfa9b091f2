"""Checking a target against the oracle: what runs in the ranks, what judges it, and the search.

* ``ranks/``: what runs inside a rank process, one rank program per kind, each returning a
  ``RankRecord``;
* ``properties/``: what runs in the driver on the ``RankRecord``s, one module per property;
* ``kinds``: the table that says, per kind, which rank program, case strategy and properties
  belong together (``resolve_properties``);
* ``plan`` (everything a check decides before it runs: ``plan.plan`` gives one ``CheckPlan``
  per target from the ``settings``), ``targets`` (what can be checked, and how its interface is read), ``run`` (one case),
  ``property`` (the Hypothesis search, ``check_target``), ``features`` (what a failing case
  needs), ``report`` (the one formatter of what a check found), ``adapters``, ``diagnose`` and
  ``limits`` (how many gloo ranks the machine runs).

The names below are imported on first use, so that importing a rank program does not import the
search.
"""

from __future__ import annotations

import importlib

__all__ = [
    "CheckPlan",
    "CheckReport",
    "CheckSettings",
    "InvalidArgument",
    "Target",
    "TargetError",
    "check_target",
    "resolve_properties",
    "resolve_target",
    "run_case",
]

_WHERE = {
    "CheckPlan": "paracheck.check.plan",
    "CheckReport": "paracheck.check.report",
    "CheckSettings": "paracheck.check.settings",
    "InvalidArgument": "paracheck.check.plan",
    "Target": "paracheck.check.targets",
    "TargetError": "paracheck.check.targets",
    "check_target": "paracheck.check.property",
    "resolve_properties": "paracheck.check.kinds",
    "resolve_target": "paracheck.check.targets",
    "run_case": "paracheck.check.run",
}


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'paracheck.check' has no attribute {name!r}")
