"""A feature is reported as needed only if the case without it passes on fresh runs too: a race
(an all-reduce not waited for) lands in time on some runs, and one lucky pass named a feature
the failure does not need."""

from types import SimpleNamespace

import paracheck.check.search as prop_mod


def _checker(outcomes):
    runs = iter(outcomes)

    def fake_run_case(world, target, case, *, device=None, timeout=None, **options):
        return SimpleNamespace(failed_properties={"gradients"} if next(runs) else set())

    checker = prop_mod._Checker(
        None,
        None,
        device_fn=None,
        timeouts=lambda w: 1.0,
        progress=lambda s: None,
        strategy_settings=None,
        key="k",
        seed=None,
    )
    return checker, fake_run_case


def test_a_lucky_pass_is_not_a_needed_feature(monkeypatch):
    checker, fake = _checker([False, True])  # passes once more, then fails: a race
    monkeypatch.setattr(prop_mod, "run_case", fake)
    assert not checker._passes_again("gradients", SimpleNamespace(world_size=2))


def test_a_steady_pass_is_a_needed_feature(monkeypatch):
    checker, fake = _checker([False, False])
    monkeypatch.setattr(prop_mod, "run_case", fake)
    assert checker._passes_again("gradients", SimpleNamespace(world_size=2))
