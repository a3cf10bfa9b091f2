"""Compiled cases as values (Note [Compiled cases]): the settings a case may name, a bad one
refused naming the field, an eager case's JSON as it always was, the strategy's draws, and which
exceptions skip a case (those raised while Dynamo compiles, never those of the running code),
and a verdict row's compile time."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import find, given, settings
from hypothesis.errors import NoSuchExample, Unsatisfiable

from paracheck.cases import COMPILE_SETTINGS, Case
from paracheck.check.features import case_features, optional_features, without
from paracheck.check.properties.compiled import compiling_seconds, compiling_too_long
from paracheck.check.ranks._compiled import compile_failure
from paracheck.check.run import CaseResult
from paracheck.check.verdict import RowVerdict
from paracheck.strategies._compiled import compile_settings, compiled_cases, compiled_loop_cases


def test_settings_pair_compiled_autograd_with_the_python_reducer():
    """Every backend has plain, graph-break-optimised, compiled-autograd and whole-step settings;
    compiled autograd always names torch's Python reducer (torch DDP's C++ reducer refuses it)."""
    assert set(COMPILE_SETTINGS) == {
        f"{b}{m}"
        for b in ("aot_eager", "inductor")
        for m in ("", "+optimize-ddp", "+compiled-autograd", "+whole-step")
    }
    for s in COMPILE_SETTINGS.values():
        assert (s.optimize_ddp == "python_reducer") == s.compiled_autograd, s


def test_a_bad_setting_is_refused_naming_the_field():
    with pytest.raises(ValueError, match=r"compiled='eager' must be None or one of"):
        Case(compiled="eager")


def test_an_eager_case_keeps_its_json_and_a_compiled_one_round_trips():
    eager = Case()
    assert "compiled" not in eager.to_dict()
    compiled = Case(compiled="aot_eager+optimize-ddp")
    assert Case.from_json(compiled.to_json()) == compiled


def test_compile_is_an_optional_feature_removed_by_without():
    case = Case(compiled="inductor")
    assert "compile" in optional_features()
    assert "compile" in case_features(case)
    assert without(case, "compile") == Case()


@settings(max_examples=500, database=None, deadline=None, derandomize=True)
@given(case=compiled_cases(world_sizes=[1, 2], inductor=True))
def _draw(case, seen):
    seen[case.compiled] += 1


def test_the_strategy_draws_every_setting_and_eager_cases_most():
    """Eager cases most (every row but compile's removes the feature), every setting drawn where
    the inductor is asked for; a check's strategy never draws the inductor."""
    seen: Counter = Counter()
    _draw(seen=seen)
    assert seen[None] > sum(n for k, n in seen.items() if k is not None)
    assert set(seen) - {None} == {n for n, s in COMPILE_SETTINGS.items() if not s.whole_step}
    plain: Counter = Counter()
    _draw_plain(seen=plain)
    assert not any(k is not None and k.startswith("inductor") for k in plain), plain
    assert len(plain) > 1, plain


@settings(max_examples=200, database=None, deadline=None, derandomize=True)
@given(case=compiled_cases(world_sizes=[1, 2]))
def _draw_plain(case, seen):
    seen[case.compiled] += 1


@settings(max_examples=200, database=None, deadline=None, derandomize=True)
@given(setting=compile_settings(inductor=True, loop=True, every_setting=True))
def _draw_loop_settings(setting, seen):
    seen[setting] += 1


def test_a_loop_draws_its_model_or_whole_step_compiled_and_no_graph_break_optimiser():
    """Note [Compiled loops]: a loop's settings compile its model, with compiled autograd or not,
    or its whole step, by either backend where the inductor is asked for; never with DDP's
    graph-break optimiser (its model is no torch DDP). A check's loop cases are compiled
    sometimes, their model plainly."""
    seen: Counter = Counter()
    _draw_loop_settings(seen=seen)
    assert set(seen) == {n for n in COMPILE_SETTINGS if "optimize-ddp" not in n}, seen
    found = find(compiled_loop_cases(world_sizes=[1]), lambda c: c.compiled is not None)
    assert found.compiled == "aot_eager"
    costly = compiled_loop_cases(world_sizes=[1, 2])
    with pytest.raises(NoSuchExample):
        find(
            costly,
            lambda c: c.compiled not in (None, "aot_eager"),
            settings=settings(database=None, max_examples=200),
        )


def test_no_loop_case_with_autocast_or_below_float32_is_compiled():
    """A loop declaring its own autocast, or one checked at bfloat16, draws no compiled case."""
    for kw in ({"autocast": "float16", "scaler": True}, {"precision": "bf16"}):
        never = compiled_loop_cases(world_sizes=[1], **kw).filter(lambda c: c.compiled)
        with pytest.raises(Unsatisfiable):
            find(never, lambda c: True, settings=settings(database=None, max_examples=100))


def test_the_setting_shrinks_to_plain_aot_eager():
    assert find(compile_settings(), lambda s: True, settings=settings(database=None)) == "aot_eager"
    loops = compile_settings(loop=True)
    assert find(loops, lambda s: True, settings=settings(database=None)) == "aot_eager"


def _raise_in(filename: str):
    code = compile("raise AssertionError('First bucket should be smaller')", filename, "exec")
    try:
        exec(code, {})
    except AssertionError as exc:
        return exc
    raise AssertionError("did not raise")


def test_only_an_exception_raised_while_compiling_skips_a_case():
    """A traceback through Dynamo's convert_frame is torch failing to compile (a skip, with
    torch's words); the same exception raised elsewhere (a hook of the running code) is not."""
    compiling = _raise_in("/site-packages/torch/_dynamo/convert_frame.py")
    why = compile_failure(compiling, "aot_eager+optimize-ddp")
    assert why is not None and why.startswith(
        "torch.compile (aot_eager+optimize-ddp) cannot compile this case: AssertionError: First"
    )
    assert compile_failure(_raise_in("/work/user/ddp.py"), "aot_eager") is None


class _Hang:
    kind = "hung"

    def __init__(self, *stacks):
        self.failures = [type("F", (), {"detail": s})() for s in stacks]


def test_a_hang_is_a_slow_compiler_only_with_a_rank_inside_it():
    """Note [Compiling is not hanging]: a compiled case's hang with a rank in Dynamo's frame
    conversion or the inductor's compilation is skipped; one with every rank in compiled code
    running (a runtime wrapper) or waiting in a collective is a hang, as is any eager case's."""
    compiling = '  File "/x/torch/_inductor/codecache.py", line 9 in load'
    running = '  File "/x/torch/_functorch/_aot_autograd/runtime_wrappers.py", line 3 in call'
    compiled = Case(compiled="inductor")
    why = compiling_too_long(compiled, _Hang(running, compiling))
    assert why is not None and "took longer than the hang timeout" in why
    assert compiling_too_long(compiled, _Hang(running, running)) is None
    assert compiling_too_long(Case(), _Hang(compiling, compiling)) is None


def test_a_row_reports_its_compile_time_apart_from_its_seconds():
    """A row that compiled says how much of its time went to compiling, in its line and JSON, a
    row stopped by the budget too; a row that compiled nothing reads as it always did."""
    row = RowVerdict("+compile", "compile", status="PASS", cases=10, seconds=14.23, compiling=9.07)
    assert row.line(8) == "+compile  PASS  [10 cases, 14.2 s, 9.1 s of it compiling]"
    assert row.to_dict()["compiling_seconds"] == 9.07
    row.status, row.why = "FAIL", "the budget of 60 s ran out after 10 cases of this row"
    assert row.line(8).endswith(
        "[10 cases, 14.2 s, 9.1 s of it compiling; the budget of 60 s ran out after 10 cases of this row]"
    )
    row.status, row.failure = "not reached", None
    assert row.line(8) == (
        "+compile  not reached: the budget of 60 s ran out after 10 cases of this row  "
        "[10 cases, 14.2 s, 9.1 s of it compiling]"
    )
    core = RowVerdict("core", None, status="PASS", cases=3, seconds=2.0)
    assert core.line(4) == "core  PASS  [3 cases, 2.0 s]"
    assert core.to_dict()["compiling_seconds"] == 0.0


def test_compile_seconds_are_rank_zeros_summed_once_per_case():
    """``compiling_seconds``: each compiled result's ``compile_s`` (rank 0's record) once, however
    often the row met it; an eager or skipped case adds nothing."""
    compiled = CaseResult(Case(compiled="aot_eager"), extra={"compiled": {"compile_s": 1.5}})
    other = CaseResult(Case(seed=2, compiled="aot_eager"), extra={"compiled": {"compile_s": 0.25}})
    skipped = CaseResult(Case(compiled="aot_eager"), extra={"skipped": "torch.compile cannot"})
    assert compiling_seconds([compiled, CaseResult(Case()), compiled, other, skipped]) == 1.75
    assert compiling_seconds([]) == 0.0
