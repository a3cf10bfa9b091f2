"""Check reports: every failing property, each shrunk and labelled with the features it needs;
the target's own frame and prints; JSON for CI; the pytest fixture's text."""

import io
import json

import pytest
from hypothesis import given, settings

from paracheck.cases import Case
from paracheck.check.features import FEATURES, case_features, label, without
from paracheck.check.property import CaseTimeouts, Progress, check_target
from paracheck.check.report import PROPERTIES, target_frame
from paracheck.check.run import run_case
from paracheck.check.targets import Target
from paracheck.strategies import cases

TWO_BUGS = Target("two-bugs", "tests.integration._report_targets:TwoBugsDDP", "ddp")
RAISES = Target("raises", "tests.integration._report_targets:RaisesOnRank1DDP", "ddp")
CHATTY = Target("chatty", "tests.integration._report_targets:ChattyDDP", "ddp")


@settings(max_examples=40, deadline=None, derandomize=True)
@given(cases(world_sizes=(1, 2, 3)))
def test_removing_a_feature_leaves_a_valid_case_without_it(case):
    """without(case, f) is a valid Case (it survives JSON) that no longer has f, for every f it has."""
    for name in case_features(case):
        simpler = without(case, name)
        assert name not in case_features(simpler), name
        assert Case.from_json(simpler.to_json()) == simpler


def test_every_feature_has_a_label_and_every_property_a_meaning():
    """The two tables are complete: a label per feature, a meaning and a fix per property."""
    assert all(label(f.name).startswith("only ") for f in FEATURES)
    assert all(p.meaning and p.hint for p in PROPERTIES.values())


def test_case_timeout_is_ten_times_the_slowest_passing_case_within_floor_and_cap():
    """Timeouts follow the slowest passing case of each world size, never below the floor or above the cap."""
    t = CaseTimeouts(20.0, floor=5.0)
    assert t(2) == 20.0  # nothing measured yet: the World's timeout
    t.observe(2, 0.1)
    assert t(2) == 5.0
    t.observe(2, 1.2)
    assert t(2) == 12.0
    assert t(4) == 20.0  # extrapolated (2x per doubling, twice for safety), capped
    t.observe(2, 3.0)
    assert t(2) == 20.0


def test_progress_line_is_written_on_a_tty_and_cleared():
    """On a terminal the progress line is rewritten in place and cleared; elsewhere nothing is written."""

    class Tty(io.StringIO):
        def isatty(self):
            return True

    tty, plain = Tty(), io.StringIO()
    for stream in (tty, plain):
        p = Progress(stream, after=0.0)
        p("paracheck flat: 3 cases, world size 2, searching")
        p.clear()
    assert "\r\x1b[Kparacheck flat: 3 cases" in tty.getvalue()
    assert plain.getvalue() == ""


def test_two_independent_bugs_are_both_reported_shrunk_and_labelled(world):
    """A DDP that neither divides nor broadcasts buffers fails both properties, each on its own minimal case."""
    report = check_target(
        TWO_BUGS,
        world,
        world_sizes=(2,),
        max_examples=40,
        first_failure=False,
        labels=True,
        search_without=False,
    )
    by_prop = {f.property: f for f in report.failures}
    assert set(by_prop) == {"initial-state", "gradients"}, report.text()
    buffers = by_prop["initial-state"]
    assert buffers.case.model.buffer and {"buffer", "world>=2"} <= set(buffers.needs), report.text()
    grads = by_prop["gradients"]
    assert (
        grads.case.world_size == 2 and not grads.case.model.buffer and grads.needs == ["world>=2"]
    ), report.text()
    text = report.text()
    assert (
        "FAIL two-bugs: initial-state: ranks do not start from rank 0's parameters and buffers"
        in text
    )
    assert "FAIL two-bugs: gradients: gradients not averaged over ranks" in text
    assert "needs: only with several ranks; only with a buffer" in text


def test_raising_target_is_reported_on_its_rank_with_its_own_frame_first(world):
    """'your code raised on rank 1', then the target's own line, then the traceback."""
    case = Case(world_size=2, batch_sizes=(1, 1), steps=1)
    result = run_case(world, RAISES, case)
    assert result.failed_properties == ["raised"]
    from paracheck.check.report import case_report

    text = case_report(RAISES, result).text()
    assert text.splitlines()[1] == "FAIL raises: raised: your code raised on rank 1"
    assert "ValueError: planted failure in the target on rank 1" in text
    frame = target_frame(result.error.failures[0].detail)
    assert (
        frame is not None
        and "_report_targets.py" in frame
        and "finish_gradient_synchronization" in frame
    )
    assert f"at {frame}" in text


def test_target_prints_are_captured_per_rank_and_clipped(world, capfd):
    """What the target prints (Python and file descriptor) comes back per rank, clipped, not on the terminal."""
    case = Case(world_size=2, batch_sizes=(1, 1), steps=1)
    result = run_case(world, CHATTY, case)
    assert not result.ok
    assert "chatty" not in capfd.readouterr().out
    out = result.outputs[1]
    assert (
        "chatty python line 0" in out and "chatty fd line 149" in out and "more lines) ..." in out
    )
    assert len(out.splitlines()) <= 31


def test_json_verdict_lists_failing_properties_and_replay(tmp_path):
    """--json writes the verdict: target, failing properties, shrunk case as JSON and replay command."""
    from paracheck.cli import main

    case = Case(world_size=2, batch_sizes=(1, 1), steps=1)
    path = tmp_path / "verdict.json"
    code = main(
        [
            "check",
            "paracheck.mutants.ddp:NoDivideDDP",
            "--case",
            case.to_json(),
            "--json",
            str(path),
            "--timeout",
            "30",
        ]
    )
    assert code == 1
    data = json.loads(path.read_text())
    t = data["targets"][0]
    assert not data["passed"] and t["failed_properties"] == ["gradients"]
    f = t["failures"][0]
    assert Case.from_dict(f["case"]) == case
    assert "--kind ddp" in f["replay"] and "--timeout 30" in f["replay"]
    # The case from a file named by its absolute path, never its JSON inline.
    case_file = f["replay"].split("--case ", 1)[1]
    assert case_file.startswith("/") and Case.from_json(open(case_file).read()) == case


def test_pytest_fixture_fails_with_the_report_text(paracheck_check):
    """The fixture fails the test with the property, its meaning and the replay command."""
    with pytest.raises(pytest.fail.Exception) as info:
        paracheck_check(
            "paracheck.mutants.ddp:NoDivideDDP",
            world_sizes=(1, 2),
            max_examples=10,
            search_without=False,
        )
    text = str(info.value)
    assert (
        "FAIL paracheck.mutants.ddp:NoDivideDDP: gradients: gradients not averaged over ranks"
        in text
    )
    assert "replay exactly this case:" in text
    # The case is printed once (its JSON); the replay reads it from a file, by absolute path.
    assert text.count('"world_size"') == 1, text
    replay = text.split("replay exactly this case:", 1)[1].strip().splitlines()[0]
    assert " --case /" in replay and len(replay) < 300, replay


def test_hang_report_says_which_collective_the_ranks_disagree_on(world):
    """A DDP that skips a parameter without a local gradient hangs; the report names the counts."""
    from paracheck.cases import GroupSpec, OptimizerSpec
    from paracheck.check.report import case_report
    from paracheck.workloads.mlp import MLPSpec

    case = Case(
        model=MLPSpec(in_features=1, widths=(1,), bias=False, unused="data"),
        world_size=2,
        batch_sizes=(1, 1),
        steps=1,
        seed=1,
        set_to_none=False,
        optimizer=OptimizerSpec(name="adam", groups=(GroupSpec(params=(0, 1), lr=1e-3),)),
    )
    target = Target("skip-none-grad", "paracheck.mutants.ddp:SkipNoneGradDDP", "ddp")
    result = run_case(world, target, case, timeout=10.0)
    assert result.failed_properties == ["hang"] and result.error.definite, result.describe()
    text = case_report(target, result).text()
    assert "FAIL skip-none-grad: hang: the ranks hang: they did not all finish" in text
    assert (
        "the ranks disagree: rank 0 is in its 2nd all_reduce" in text
        and "rank 1 finished after 1 all_reduce" in text
    )
    # Where in the target's code the hung rank waits, on a line of its own.
    (at,) = [line for line in text.splitlines() if line.startswith("  at ")]
    assert "/paracheck/ddp/" in at and " in finish_gradient_synchronization" in at, at


def test_harness_error_without_a_target_frame_is_not_blamed_on_the_target():
    """A traceback with no frame of the target's code (paracheck's harness raised reading it) is
    reported as the harness's, not as 'your code raised'."""
    from types import SimpleNamespace

    from paracheck.check.report import PropertyFailure

    inside = (
        "Traceback (most recent call last):\n"
        '  File "/x/site-packages/paracheck/check/ranks/fsdp.py", line 154, in run_fsdp\n'
        "    optimizer = build_optimizer(case, params)\n"
        '  File "/x/site-packages/paracheck/cases/_optimizer.py", line 574, in param_groups\n'
        "    d = {'params': [params[i] for i in idx]}\n"
        "IndexError: list index out of range\n"
    )
    user = inside.replace(
        "IndexError", '  File "/home/me/mypkg/fsdp.py", line 9, in forward\n    x[3]\nIndexError'
    )
    for detail, says in (
        (inside, "paracheck's harness raised on rank 0"),
        (user, "your code raised on rank 0"),
    ):
        error = SimpleNamespace(failures=[SimpleNamespace(rank=0, detail=detail)])
        failure = PropertyFailure("raised", SimpleNamespace(error=error))
        assert failure.meaning.startswith(says), failure.meaning


def test_a_target_installed_in_site_packages_is_its_own_code():
    """A target imported by module path owns its frames wherever it is installed: a user's package
    in site-packages, or torch's own ZeroRedundancyOptimizer. A file target or paracheck's
    harness does not."""
    from types import SimpleNamespace

    from paracheck.check.report import PropertyFailure, own_fragments, target_frame

    detail = (
        "Traceback (most recent call last):\n"
        '  File "/x/site-packages/paracheck/check/ranks/sharded.py", line 70, in fresh\n'
        "    saved = opt.state_dict()\n"
        '  File "/x/site-packages/mypkg/zero.py", line 41, in state_dict\n'
        "    raise RuntimeError('not consolidated')\n"
        "RuntimeError: not consolidated\n"
    )
    assert own_fragments("mypkg.zero:Sharded") == ("/mypkg/zero.py", "/mypkg/zero/", "/mypkg/")
    assert own_fragments("mymod:Sharded") == ("/mymod.py", "/mymod/")
    assert own_fragments("src/mymod.py:Sharded") == ()
    assert target_frame(detail) is None
    frame = target_frame(detail, own_fragments("mypkg.zero:Sharded"))
    assert frame is not None and frame.endswith(
        "zero.py:41 in state_dict: raise RuntimeError('not consolidated')"
    )
    assert target_frame(detail, own_fragments("otherpkg.zero:Sharded")) is None
    # A built-in's fragments (paracheck.ddp: "/paracheck/") never make the harness the target.
    harness_only = detail.replace("/x/site-packages/mypkg/zero.py", "/x/paracheck/check/run.py")
    assert target_frame(harness_only, own_fragments("paracheck.ddp:FlatDDP")) is None
    torch_detail = detail.replace(
        "/mypkg/zero.py", "/torch/distributed/optim/zero_redundancy_optimizer.py"
    )
    own = own_fragments("torch.distributed.optim:ZeroRedundancyOptimizer")
    assert target_frame(torch_detail, own) is not None
    error = SimpleNamespace(failures=[SimpleNamespace(rank=1, detail=detail)])
    for own, says in (
        ((), "paracheck's harness raised on rank 1"),
        (own_fragments("mypkg.zero:Sharded"), "your code raised on rank 1"),
    ):
        failure = PropertyFailure("raised", SimpleNamespace(error=error), own=own)
        assert failure.meaning.startswith(says), failure.meaning
