"""The verdict table (Note [The verdict table]): a bug behind a feature the target never promised
is reported in that feature's row, beside the core's own; rows left out by ``--features`` say
so; the budget ends the table with the rows not reached listed; failures of one cause are one
block."""

import types

from paracheck.check.failure import PropertyFailure, property_info
from paracheck.check.features import optional_features
from paracheck.check.property import check_target
from paracheck.check.run import CaseResult
from paracheck.check.settings import CheckSettings
from paracheck.check.targets import Target
from paracheck.check.verdict import causes_of

TWO_BUGS = Target("two-bugs", "tests.integration._report_targets:TwoBugsDDP", "ddp")

# Only the buffer row beside the core and all features: the other optional rows cost time here.
ONLY_BUFFERS = ",".join(f"-{f}" for f in optional_features() if f != "buffer")


def _settings(**changes) -> CheckSettings:
    # The command line's verdict table (check_target's defaults are one search: Note [One set
    # of defaults]).
    base = CheckSettings(
        world_sizes=(2,),
        max_examples=5,
        table=True,
        labels=True,
        first_failure=False,
        database=None,
        budget=None,
        timeout=None,
    )
    return base.replace(**changes)


def test_bug_behind_an_unpromised_feature_is_reported_in_its_own_row(world):
    """A DDP that forgets to divide by the world size and to broadcast buffers: the core row fails
    with the division, the buffer row with the buffers, each its own cause."""
    report = check_target(TWO_BUGS, world, _settings(features=ONLY_BUFFERS))
    rows = {r.name: r for r in report.rows}
    text = report.text()
    assert rows["core"].status == "FAIL" and rows["core"].failure.property == "gradients", text
    assert rows["+buffer"].status == "FAIL", text
    assert rows["+buffer"].failure.property == "initial-state", text
    assert rows["+buffer"].failure.case.model.buffer, text
    assert rows["+accumulation"].status == "not drawn", text
    assert rows["+accumulation"].why == "--features -accumulation", text
    assert [r.name for r in report.rows][-1] == "all features"
    assert len(causes_of(report.failures)) == 2, text
    assert "cause 1: FAIL two-bugs: gradients: gradients not averaged over ranks" in text
    assert "cause 2: FAIL two-bugs: initial-state:" in text
    # No database: the case is written to a file of the temporary directory, not inlined.
    assert "  replay: paracheck check two-bugs --backend gloo --case /" in text
    assert "--case '{" not in text
    assert not report.passed


def test_first_failure_stops_at_the_first_failing_row(world):
    """--first-failure: the core's failure, every later row not reached (and saying why)."""
    report = check_target(TWO_BUGS, world, _settings(features=ONLY_BUFFERS, first_failure=True))
    rows = {r.name: r for r in report.rows}
    assert rows["core"].status == "FAIL" and rows["+buffer"].status == "not reached"
    assert "--first-failure" in rows["+buffer"].why
    assert [f.property for f in report.failures] == ["gradients"]


def test_spent_budget_lists_the_rows_not_reached(world):
    """A budget spent before the first case: no row searched, each saying the budget ran out."""
    report = check_target(TWO_BUGS, world, _settings(features=ONLY_BUFFERS, budget=1e-9))
    searched = [r for r in report.rows if r.status != "not drawn"]
    assert searched and all(r.status == "not reached" for r in searched)
    assert all("budget" in r.why for r in searched), report.text()
    assert report.cases_run == 0 and "not reached: the budget of" in report.text()


def _failure(prop, what, name, rank, *upstream, step=0):
    """A failure of ``prop`` on ``what`` of tensor ``name``; its case's other divergences are
    ``upstream``: (what, name, rank, step) each."""
    from paracheck.cases import Case
    from paracheck.check.properties import Divergence

    d = Divergence(step, what, rank, 0, name, 1.0, 1e-9)
    others = [Divergence(st, w, r, 0, n, 1.0, 1e-9) for w, n, r, st in upstream]
    return PropertyFailure(prop, CaseResult(Case(seed=0), divergences=others + [d]))


def test_gradient_divergences_of_one_row_are_one_cause_most_specific_first():
    """parameters diverging where the case's gradients diverge first, and gradients diverging on
    another tensor or rank (another model drawn): one cause, gradients first; the same divergence
    filed in another row (a feature's bug beside the core's) is another cause."""
    params = _failure("parameters", "param", "w", 1, ("grad", "w", 1, 0))
    grads = _failure("gradients", "grad", "w", 1)
    other = _failure("gradients", "grad", "fc1.weight", 0)
    for f in (params, grads, other):
        f.row = "core"
    feature = _failure("gradients", "grad", "w", 0)
    feature.row = "+accumulation"
    groups = causes_of([params, grads, other, feature])
    assert [[f.property for f in g] for g in groups] == [
        ["gradients", "gradients", "parameters"],
        ["gradients"],
    ]
    assert groups[1] == [feature]


def test_parameters_wrong_with_right_gradients_are_another_cause():
    """Parameters diverging on a tensor whose gradients hold (an optimizer's bug), or whose
    gradients diverge only later, are not the cause of a gradient divergence on that tensor; an
    optimizer-state divergence is not a consolidated state's."""
    grads = _failure("gradients", "grad", "w", 0)
    params = _failure("parameters", "param", "w", 0)
    later = _failure("parameters", "param", "w", 0, ("grad", "w", 0, 2), step=1)
    state = _failure("optimizer-state", "state", "w", 0)
    consolidated = _failure("state-consolidated", "state-consolidated", "w", 0)
    groups = causes_of([grads, params, later, state, consolidated])
    assert [[f.property for f in g] for g in groups] == [
        ["gradients"],
        ["parameters", "parameters"],
        ["optimizer-state"],
        ["state-consolidated"],
    ]


def test_sharding_failures_speak_of_owners_and_zero_grad():
    """A sharded optimizer's gradient failure names zero_grad, a ZeRO wrapper's its owners; never
    a DDP's finish_gradient_synchronization."""
    for kind in ("sharded", "zero", "zero2"):
        info = property_info("gradients", kind=kind)
        assert "zero_grad()" in info.hint
        assert "finish_gradient_synchronization" not in info.hint + info.meaning
        assert "owner" in property_info("parameters", kind=kind).hint
    assert "finish_gradient_synchronization" in property_info("gradients", kind="ddp").hint


def test_a_dtype_mistake_of_the_target_is_its_own():
    """torch refusing a float64 gradient on a float32 parameter, raised in paracheck's call of
    step(): "your code", with a fix about dtypes, not "paracheck's harness raised"."""
    from paracheck.cases import Case

    detail = (
        "Traceback (most recent call last):\n"
        '  File "/x/paracheck/check/ranks/ddp.py", line 10, in run_ddp\n'
        "    opt.step()\n"
        "RuntimeError: attempting to assign a gradient with dtype 'double' to a tensor with "
        "grad_dtype 'Float'."
    )
    error = types.SimpleNamespace(
        failures=[types.SimpleNamespace(rank=1, detail=detail)], kind="raised"
    )
    failure = PropertyFailure("raised", CaseResult(Case(seed=0), error=error))
    assert failure.meaning.startswith("your code raised on rank 1: it gave torch a tensor of")
    assert "dtype of its parameter" in failure.fix


def test_headline_says_what_the_detail_says():
    """A gradient present where the oracle's is None is headlined as such, not as "not
    averaged"; a numeric difference keeps the property's own headline."""
    from paracheck.cases import Case
    from paracheck.check.properties import Divergence

    def meaning(detail):
        d = Divergence(0, "grad", 0, 0, "w", float("nan"), 1e-9, detail=detail)
        return PropertyFailure("gradients", CaseResult(Case(seed=0), divergences=[d])).meaning

    assert meaning("expected no gradient, got a tensor").startswith(
        "a gradient is a tensor where the oracle's is None"
    )
    assert meaning("expected a gradient, got None").startswith("a gradient is None where")
    assert meaning("worst element #0").startswith("gradients not averaged over ranks")


def test_a_feature_the_interface_cannot_take_is_not_supported():
    """A sharding target without load_state_dict(): its reload row names the missing method; a
    torch optimizer has both, and a DDP is never asked for a reload."""
    from paracheck.check.interfaces import unsupported

    lacking = Target("lacking", "collections:OrderedDict", "sharded")
    assert unsupported(lacking, "reload") == "OrderedDict has no state_dict()"
    assert unsupported(Target("sgd", "torch.optim:SGD", "sharded"), "reload") is None
    assert unsupported(lacking, "buffer") is None
    assert unsupported(Target("d", "collections:OrderedDict", "ddp"), "reload") is None


def test_failure_found_before_the_budget_ran_out_is_reported(world):
    """A given case that fails, then a budget already spent: the failure is the core row's, every
    searched row is not reached, and the check fails."""
    from paracheck.cases import Case

    case = Case(world_size=2, batch_sizes=(1, 1), steps=1)
    report = check_target(
        TWO_BUGS, world, _settings(features=ONLY_BUFFERS, budget=1e-9), explicit=[case]
    )
    rows = {r.name: r for r in report.rows}
    assert not report.passed and [f.property for f in report.failures] == ["gradients"]
    assert rows["core"].status == "FAIL" and rows["core"].failure.property == "gradients"
    assert rows["+buffer"].status == "not reached" and "budget" in rows["+buffer"].why
    assert "cause 1: FAIL two-bugs: gradients:" in report.text()


def _hang(frame_line: int, counts: str):
    from paracheck.cases import Case
    from paracheck.world import RankFailure
    from paracheck.world._failures import RankHang

    def dump(rank):
        return (
            "Thread 0x00007f (most recent call first):\n"
            '  File "/usr/lib/python3.11/threading.py", line 320 in wait\n'
            '  File "/x/src/paracheck/world/_rank.py", line 90 in _watch\n'
            "\n"
            "Current thread 0x00007e (most recent call first):\n"
            '  File "/x/site-packages/torch/distributed/distributed_c10d.py", line 2978 in broadcast\n'
            f'  File "/home/u/mypkg/shard.py", line {frame_line + rank} in step\n'
            '  File "/x/src/paracheck/check/ranks/_drive.py", line 40 in run_steps\n'
        )

    hung = [RankFailure(r, "hung", dump(r)) for r in (0, 1)]
    err = RankHang("hung", hung, disagreement=f"ranks in their {counts} broadcast")
    return PropertyFailure("hang", CaseResult(Case(seed=0), error=err), own=("/home/u/mypkg/",))


def test_two_hangs_in_different_waits_are_two_causes_one_wait_in_two_cases_is_one():
    """A hang's cause is where the hung ranks wait in the target's own code: the same waits in a
    later case (other counts) are the same cause, waits elsewhere another."""
    first, again, other = _hang(10, "3rd"), _hang(10, "7th"), _hang(50, "3rd")
    assert causes_of([first, again, other]) == [[first, again], [other]]


def test_the_rows_counts_add_up_to_the_cases_run(world):
    """Each case run is counted in one row: a row that draws a case an earlier row ran counts it
    apart ("and N of earlier rows"), so the rows' counts add up to the summary's."""
    from paracheck.check.targets import resolve_target
    from paracheck.check.verdict import RowVerdict

    only = ",".join(f"-{f}" for f in optional_features() if f not in ("buffer", "accumulation"))
    report = check_target(resolve_target("flat"), world, _settings(max_examples=4, features=only))
    reached = [r for r in report.rows if r.status in ("PASS", "FAIL")]
    assert len(reached) >= 3, [r.line(20) for r in report.rows]
    assert sum(r.cases for r in report.rows) == report.cases_run, [r.line(20) for r in report.rows]
    row = RowVerdict("+buffer", "buffer", status="PASS", cases=3, earlier=2, seconds=1.0)
    assert row.cost == "3 cases (and 2 of earlier rows), 1.0 s"
