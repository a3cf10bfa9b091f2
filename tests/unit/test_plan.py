"""One plan per check (Note [One plan per check] in ``paracheck.check.plan``): the world sizes have
one default, every surface (the command line's namespace, the pytest plugin's options, the
keywords of ``check_target``) gives the same plan for the same inputs, and a bad value is one
``InvalidArgument`` that each surface names with its own flag."""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

import pytest

import paracheck
from paracheck import pytest_plugin
from paracheck.check.plan import (
    CheckPlan,
    InvalidArgument,
    plan,
    plan_target,
    settled,
    world_sizes,
)
from paracheck.check.settings import (
    DEFAULT_WORLD_SIZES,
    SELFTEST,
    CheckSettings,
    add_pytest_options,
    from_namespace,
    from_pytest,
)
from paracheck.check.targets import Target
from paracheck.cli import _parser, main

NAIVE = Target("naive", "paracheck.ddp:NaiveDDP", "ddp")
LOOP = Target("loop", "paracheck.loop:train_step", "loop", loss="token-mean")


def _namespace(*argv: str, command: str = "check") -> argparse.Namespace:
    """``paracheck check`` (or ``selftest``) parsed, as the command line parses it."""
    return _parser(only_check=True)[1][command].parse_args(list(argv))


class _Config:
    """A pytest config of the plugin's ``--paracheck-*`` options, parsed by the same table."""

    def __init__(self, *argv: str):
        parser = argparse.ArgumentParser()

        class Group:
            def addoption(self, name, **kw):
                parser.add_argument(name, **kw)

        add_pytest_options(Group())
        self.ns = parser.parse_args(list(argv))

    def getoption(self, name, default=None):
        return getattr(self.ns, name.lstrip("-").replace("-", "_"), default)

    def addinivalue_line(self, *args) -> None:
        pass


def _decided(p: CheckPlan) -> tuple:
    """What the options given decide in a plan (the surfaces' own budget, database and table
    apart)."""
    return (p.world_sizes, p.precision, p.dtype, p.features_off, p.properties, p.timeout)


def test_default_world_sizes_come_from_one_constant():
    """No world size given: the command line, the selftest, the plugin and the keywords all draw
    DEFAULT_WORLD_SIZES, and no other literal 1,2,3,4 is left in the package to drift from it."""
    assert world_sizes(CheckSettings()) == DEFAULT_WORLD_SIZES
    assert world_sizes(from_namespace(_namespace())) == DEFAULT_WORLD_SIZES
    assert world_sizes(from_namespace(_namespace(command="selftest"), SELFTEST)) == (
        DEFAULT_WORLD_SIZES
    )
    assert pytest_plugin._world_sizes(_Config()) == DEFAULT_WORLD_SIZES
    assert world_sizes(CheckSettings(), pool={"size": 2, "backend": "gloo"}) == (1, 2)
    root = Path(paracheck.__file__).parent
    literals = []
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Tuple) and all(isinstance(e, ast.Constant) for e in node.elts):
                if [e.value for e in node.elts] == list(DEFAULT_WORLD_SIZES):
                    literals.append(f"{path.relative_to(root)}:{node.lineno}")
            if isinstance(node, ast.Constant) and node.value == "1,2,3,4":
                literals.append(f"{path.relative_to(root)}:{node.lineno}")
    assert len(literals) == 1 and literals[0].startswith("check/settings.py:"), literals


@pytest.mark.parametrize(
    "given",
    [
        {},
        {"world_sizes": (2, 1, 2), "precision": "fp32", "timeout": 5.0},
        {"world_sizes": (1, 3), "dtype": "float32", "features": "-buffer,-accumulation"},
        {"contract": "cs336", "max_examples": 7},
    ],
    ids=["nothing", "sizes-precision-timeout", "dtype-features", "contract"],
)
def test_every_surface_gives_the_same_plan(given):
    """The same options through the command line's namespace, the plugin's options and
    check_target's keywords: the same world sizes, precision, features off, properties and
    timeout for a DDP and for a loop."""
    argv: list[str] = []
    for name, value in given.items():
        text = ",".join(map(str, value)) if isinstance(value, tuple) else str(value)
        argv.append(f"--{name.replace('_', '-')}={text}")
    keyword = CheckSettings(**{"timeout": 20.0, **given})  # the surfaces' hang timeout
    cli = from_namespace(_namespace(*argv))
    plugin_argv = [a.replace("--", "--paracheck-", 1) for a in argv if not a.startswith("--dtype")]
    surfaces = [keyword, cli]
    if "dtype" not in given:  # the plugin offers --paracheck-precision, not a dtype
        surfaces.append(from_pytest(_Config(*plugin_argv)))
    plans = [plan(s, (NAIVE, LOOP)) for s in surfaces]
    for other in plans[1:]:
        assert [_decided(p) for p in other] == [_decided(p) for p in plans[0]]
    assert all(p.examples == given.get("max_examples", 40) for p in plans[1])


def test_the_precision_is_resolved_per_target():
    """Nothing given: a DDP at fp64, a loop at fp32 (its kind's dtype), a DDP declaring a
    float32 reduction at fp32; a dtype given applies to all; a loop refuses a precision it does
    not compute in, and the plan says why rather than checking it."""
    declared = Target("f32", "paracheck.ddp:NaiveDDP", "ddp", reduce_dtype="float32")
    ddp, loop, f32 = plan(CheckSettings(), (NAIVE, LOOP, declared))
    assert (ddp.precision, ddp.dtype) == ("fp64", "float64")
    assert (loop.precision, loop.dtype) == ("fp32", "float32")
    assert f32.precision == "fp32"
    assert {p.precision for p in plan(CheckSettings(dtype="float32"), (NAIVE, LOOP))} == {"fp32"}
    (refused,) = plan(CheckSettings(precision="fp16"), (LOOP,))
    assert refused.refused is not None and "applies autocast" in refused.refused
    with pytest.raises(InvalidArgument, match="^precision='fp16': a training loop applies"):
        plan_target(CheckSettings(precision="fp16"), LOOP)  # check_target's refusal


def test_settled_settings_are_settled_again_unchanged():
    """A plan's settings planned again give the same plan (the search may be handed either)."""
    (first,) = plan(CheckSettings(world_sizes="3,1", dtype="float32"), (NAIVE,))
    (again,) = plan(first.settings, (NAIVE,))
    assert again == first and first.world_sizes == (1, 3)
    assert settled(first.settings) == first.settings.replace(precision="fp32")


# (keyword, value as a keyword, command-line argv, what the message says after option=value);
# no argv: the option has choices, which argparse refuses on the command line and in pytest.
BAD = [
    ("world_sizes", (0,), ["--world-sizes", "0"], "world size 0 must be >= 1"),
    ("world_sizes", "1,x", ["--world-sizes", "1,x"], "must be comma-separated integers"),
    ("timeout", 0.0, ["--timeout", "0"], "must be > 0"),
    ("rank_memory", -1.0, ["--rank-memory", "-1"], "must be > 0 (GB)"),
    ("max_examples", 0, ["--max-examples", "0"], "must be > 0"),
    ("features", "-nope", ["--features=-nope"], "'nope' is not a feature"),
    ("contract", "cs999", None, "must be one of full, cs336"),
    ("precision", "fp8", None, "must be one of fp64"),
]


@pytest.mark.parametrize("name, value, argv, rule", BAD, ids=[b[0] + "-" + str(b[1]) for b in BAD])
def test_a_bad_value_names_the_option_on_every_surface(name, value, argv, rule, capsys):
    """One InvalidArgument: ``name=value`` for a keyword of check_target, ``--name=value`` on
    the command line (exit 2, no traceback, no rank started), ``--paracheck-name=value`` from
    the plugin (a pytest usage error)."""
    with pytest.raises(InvalidArgument) as info:
        plan(CheckSettings(**{name: value}), (NAIVE,))
    assert info.value.option == name and rule in str(info.value)
    assert str(info.value).startswith(f"{name}={value!r}")
    if argv is not None:
        assert main(["check", "naive", "--no-database", *argv]) == 2
        err = capsys.readouterr().err
        flag = "--" + name.replace("_", "-")
        assert f"{flag}={argv[-1].partition('=')[2] or argv[-1]}" in err and rule in err, err
        assert "Traceback" not in err
    if argv is None:
        return
    text = ",".join(map(str, value)) if isinstance(value, tuple) else str(value)
    with pytest.raises(pytest.UsageError) as usage:
        pytest_plugin.pytest_configure(_Config(f"--paracheck-{name.replace('_', '-')}={text}"))
    said = str(usage.value)
    assert said.startswith(f"--paracheck-{name.replace('_', '-')}={text}") and rule in said, said


def test_a_large_gloo_world_names_the_flag_that_lifts_it(monkeypatch):
    """Above the machine's gloo ranks: the rule names allow_large_world as the surface names it;
    with it, or on an attached pool large enough, the sizes stand."""
    from paracheck.check import limits

    monkeypatch.setattr(limits, "gloo_rank_limit", lambda: limits.rank_limit(1, None))
    big = CheckSettings(world_sizes="1,9", backend="gloo")
    with pytest.raises(InvalidArgument) as info:
        world_sizes(big)
    assert "Pass --allow-large-world" in info.value.text("--")
    assert "Pass --paracheck-allow-large-world" in info.value.text("--paracheck-")
    assert world_sizes(big.replace(allow_large_world=True)) == (1, 9)
    assert world_sizes(big, pool={"size": 9, "backend": "gloo"}) == (1, 9)
    with pytest.raises(InvalidArgument, match="exceeds the 4 agents"):
        world_sizes(big, pool={"size": 4, "backend": "gloo"})
    assert world_sizes(big.replace(backend=None)) == (1, 9)  # check_target: the World is started


def test_check_target_has_one_set_of_defaults():
    """check_target without settings and with CheckSettings() plans the same check: one search
    stopping at the first failing property, no budget, no database, seed 0, 40 examples."""
    (p,) = plan(CheckSettings(), (NAIVE,))
    s = p.settings
    assert (s.table, s.first_failure, s.labels) == (False, True, False)
    assert (p.budget, p.database, p.seed, p.examples, p.timeout) == (None, None, 0, 40, None)
    cli = from_namespace(_namespace())
    assert (cli.table, cli.labels, cli.budget, cli.timeout) == (True, True, 90.0, 20.0)
    plugin = from_pytest(_Config())
    assert (plugin.table, plugin.labels, plugin.first_failure) == (False, True, False)


def test_the_command_line_names_any_invalid_argument_as_its_flag(monkeypatch, capsys):
    """An InvalidArgument raised anywhere in a command (here: by the options' check) is printed
    with the option's flag, exit 2, no traceback."""
    import paracheck.cli.check as cli_check

    def refuse(args, job):
        raise InvalidArgument("loss_fn", "m:f", "must return a scalar; see {option:batch}")

    monkeypatch.setattr(cli_check, "planned", refuse)
    assert main(["check", "naive"]) == 2
    err = capsys.readouterr().err
    assert "paracheck: error: --loss-fn=m:f must return a scalar; see --batch" in err, err
    assert "Traceback" not in err


def test_a_feature_the_interface_cannot_be_asked_for_is_planned_off():
    """The reference FSDP's state is per-rank: its reshard feature is never drawn, in the whole
    contract's search as in the table, and its row reads "not supported" with why."""
    from paracheck.check.targets import resolve_target

    one = plan_target(CheckSettings(), resolve_target("fsdp"))
    assert "reshard" in one.features_off and "reshard" in dict(one.unsupported)
    torch_fsdp = plan_target(CheckSettings(), resolve_target("torch-fsdp"))
    assert "reshard" not in torch_fsdp.features_off and not torch_fsdp.unsupported


def test_no_case_is_compiled_below_float32():
    """A bf16 or fp16 check never draws the compile feature (Note [Compiled cases]); a mixed one
    does, in its float32 cases only."""
    from hypothesis import HealthCheck, given, settings

    from paracheck.check.targets import resolve_target
    from paracheck.strategies._compiled import compiled_cases

    for precision in ("bf16", "fp16"):
        one = plan_target(CheckSettings(precision=precision), resolve_target("bucketed"))
        assert "compile" in one.features_off and "compile" in dict(one.off_at_precision)
    mixed = plan_target(CheckSettings(precision="mixed"), resolve_target("bucketed"))
    assert "compile" not in mixed.features_off

    seen = []

    @settings(
        max_examples=400, derandomize=True, database=None, suppress_health_check=list(HealthCheck)
    )
    @given(compiled_cases(world_sizes=(1, 2), precision="mixed"))
    def drawn(case):
        if case.compiled is not None:
            seen.append(case)
            assert case.autocast is None and case.dtype in ("float32", "float64"), case

    drawn()
    assert seen, "no compiled case in 400 mixed-precision draws"


def test_a_default_check_draws_its_kinds_own_sequence():
    """The features a kind never draws are turned off in the plan but not mapped away from its
    strategy: a map adds a span that Hypothesis mutates, and mapping them changed every default
    check's derandomised cases from the twelfth on while removing nothing. A feature the kind
    does draw, turned off, is still taken away from every case."""
    import types

    from paracheck.check.kinds import KINDS
    from paracheck.check.settings import CheckSettings
    from paracheck.check.shared_search import _Search
    from paracheck.check.targets import resolve_target

    def search(name, **changes):
        settings = CheckSettings(world_sizes=(1, 2), database=None, **changes)
        world = types.SimpleNamespace(timeout=10.0)
        return _Search(resolve_target(name), world, settings, None, None, None, None)

    for name in ("bucketed", "zero1", "sharded"):
        default = search(name)
        assert set(KINDS[default.target.kind].never_draws) <= set(default.off), name
        assert default.strategy is default.drawn, name
    without = search("bucketed", features="-accumulation")
    assert "accumulation" in without.off and without.strategy is not without.drawn
