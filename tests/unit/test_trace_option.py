"""``scripts/trace_option.py`` follows ``--world-sizes`` from the command line to the rank job,
with a World that stops the check at its first submitted job (no rank process starts)."""

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "trace_option.py"


def _script():
    spec = importlib.util.spec_from_file_location("trace_option", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module's annotations through it
    spec.loader.exec_module(module)
    return module


class _Submitted(BaseException):
    """Raised by the stand-in World at its first job: the trace has ended by then."""


class _World:
    """A World of ``size`` ranks that runs nothing: ``submit`` and ``run`` end the check."""

    def __init__(self, size, timeout):
        self.size, self.backend, self.timeout = size, "gloo", timeout

    def submit(self, *args, **kwargs):
        raise _Submitted

    run = submit

    def close(self):
        pass


@pytest.fixture
def trace_option(monkeypatch):
    import paracheck.cli.check

    monkeypatch.setattr(
        paracheck.cli.check,
        "_make_world",
        lambda backend, size, timeout, *a, **k: _World(size, timeout),
    )
    return _script()


@pytest.mark.parametrize("name", ["world_sizes", "features"])
def test_an_option_is_followed_from_the_command_line_to_the_rank_job(trace_option, name):
    """The trace of ``--world-sizes 1,2`` (of ``--features`` turning every optional feature off)
    starts in ``paracheck/cli``, ends at the rank job and finds the text parsed once, by one
    call: the plan's (Note [One plan per check] in ``paracheck.check.plan``)."""
    from paracheck.cli import main as cli_main

    def main(argv):
        try:
            return cli_main(argv)
        except _Submitted:
            return None

    option = trace_option.followed(name)
    trace = trace_option.run(option, main=main)
    assert trace.reached_job, trace.output[-2000:]
    assert len(trace.steps) >= 3
    assert trace.steps[0].file.startswith("paracheck/cli/")
    assert trace.steps[-1].end and trace.steps[-1].function == "Target.job"
    assert not any(s.end for s in trace.steps[:-1])
    innermost = [s for s in trace.parse_sites if s.innermost]
    assert len(innermost) == 1, trace.parse_sites
    figures = trace.figures()
    assert figures["steps"] == len(trace.steps) and figures["files"] == len(trace.files)


def test_returns_count_a_file_entered_again_after_leaving_it(trace_option):
    """Steps in files a, a, b, a, c, b return twice: to a, then to b."""
    steps = [trace_option.Step("f", name, 1, "") for name in "aabacb"]
    assert trace_option.Trace("x", steps=steps).returns == 2


def test_default_names_finds_the_world_sizes_default(trace_option):
    """The plan's default of the world sizes, ``DEFAULT_WORLD_SIZES``, is found where it is read."""
    uses = trace_option.default_names("world_sizes")
    assert any(
        u["name"] == "DEFAULT_WORLD_SIZES" and u["function"] == "_default_world_sizes" for u in uses
    )


def test_passes_count_only_steps_that_enter_a_file_afresh(trace_option):
    """A call reached from its file's own unfinished call, or a method of the object holding the
    value, is not a pass: files a, b, a(entered), a(reached from a), b(a method) pass a twice."""
    Step = trace_option.Step
    steps = [
        Step("f", "a", 1, ""),
        Step("g", "b", 1, ""),
        Step("h", "a", 1, "", enters=True),
        Step("i", "a", 1, "", enters=False),
        Step("j", "b", 1, "", enters=False, read=True),
    ]
    figures = trace_option.Trace("x", steps=steps).figures()
    assert figures["passes"] == {"a": 2, "b": 1}
    assert figures["passes_again"] == 1 and figures["files_passed_again"] == ["a"]


@pytest.mark.parametrize("name", ["world_sizes", "precision"])
def test_an_option_passes_through_each_module_once(trace_option, name):
    """From the command line to the rank job, the world sizes and the precision are handed to each
    module of ``src/paracheck`` once: each module's later calls are its own call's, or methods of
    the settings, the plan or the search that hold the value."""
    from paracheck.cli import main as cli_main

    def main(argv):
        try:
            return cli_main(argv)
        except _Submitted:
            return None

    trace = trace_option.run(trace_option.followed(name), main=main)
    assert trace.reached_job, trace.output[-2000:]
    figures = trace.figures()
    assert figures["passes_again"] == 0, trace_option.table(trace, [])
