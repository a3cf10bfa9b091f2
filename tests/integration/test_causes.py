"""Every cause of failure found is printed in its own block, in its row, the contract's rows
first (Note [Finding every cause] in paracheck.check.table, Note [Causes, not properties] in
paracheck.check.verdict): two bugs of one property are two causes, a core bug beside a feature's
is filed in each row, a bug that needs two features is found in their pair's row, a CUDA timing
call diagnosed once is stubbed so that the bug behind it is reached."""

from dataclasses import replace

from paracheck.cases import Case, GroupSpec, OptimizerSpec
from paracheck.check.features import optional_features
from paracheck.check.property import check_target
from paracheck.check.report import BEYOND_HEADING
from paracheck.check.settings import CheckSettings
from paracheck.check.targets import Target
from paracheck.workloads import MLPSpec

_PATH = "tests.integration._cause_targets:"


def _target(name: str) -> Target:
    return Target(name, _PATH + name, "ddp")


def _only(*names: str) -> str:
    """--features that leave only ``names`` of the optional features drawn."""
    return ",".join(f"-{f}" for f in optional_features() if f not in names) or None


def _settings(**changes) -> CheckSettings:
    # The command line's verdict table (check_target's defaults are one search).
    base = CheckSettings(
        world_sizes=(1, 2),
        max_examples=8,
        table=True,
        labels=True,
        first_failure=False,
        database=None,
        budget=None,
        timeout=None,
    )
    return base.replace(**changes)


def _blocks(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("cause ")]


def test_two_exceptions_of_one_property_are_two_causes(world):
    """A KeyError on two ranks and a RuntimeError on one, both in the core: two blocks, each
    with its own case (the one-rank case is not shrunk into the two-rank exception)."""
    report = check_target(_target("TwoRaisesDDP"), world, _settings(features=_only()))
    text = report.text()
    raised = [f for f in report.failures if f.property == "raised"]
    assert len(raised) == 2, text
    assert {f.case.world_size for f in raised} == {1, 2}, text
    assert {f.row for f in raised} == {"core"}, text
    assert len(_blocks(text)) == 2, text
    assert "KeyError" in text and "RuntimeError" in text, text
    core = next(r for r in report.rows if r.name == "core")
    assert core.status == "FAIL" and len(core.own) == 2, text


def test_core_bug_and_a_features_bug_of_one_property_are_each_in_their_row(world):
    """Gradients summed, not averaged (the core, two ranks) and the earlier micro-batches dropped
    (accumulation, one rank too): both diverge first on a gradient; each is its own cause, in its
    own row, the core's first; the accumulation row is beyond the CS336 contract."""
    report = check_target(
        _target("CoreAndAccumulationDDP"), world, _settings(features=_only("accumulation"))
    )
    text = report.text()
    rows = {r.name: r for r in report.rows}
    core, acc = rows["core"], rows["+accumulation"]
    assert core.status == "FAIL" and core.failure.property == "gradients", text
    assert acc.status == "FAIL" and acc.failure is not None, text
    assert acc.failure.property == "gradients" and acc.failure.case.accumulation > 1, text
    assert acc.beyond and not core.beyond, text
    blocks = _blocks(text)
    assert len(blocks) == 2, text
    assert "(1 within the contract, 1 beyond it)" in report.summary(), text
    assert BEYOND_HEADING in text, text
    # The core's cause is printed first, its row above the heading.
    assert text.index("rows: core") < text.index("rows: +accumulation"), text
    assert text.index("  core ") < text.index(BEYOND_HEADING) < text.index("  +accumulation "), text


def test_bug_that_needs_two_features_is_found_in_their_pair_row(world):
    """Accumulation over a parameter no rank used gives it a gradient of zeros: neither feature's
    row finds it, their pair's row does."""
    report = check_target(
        _target("AccumulatedUnusedDDP"),
        world,
        _settings(features=_only("accumulation", "unused-always")),
    )
    text = report.text()
    rows = {r.name: r for r in report.rows}
    pair = rows["+accumulation+unused-always"]
    assert rows["core"].status == "PASS", text
    assert rows["+accumulation"].status == "PASS", text
    assert rows["+unused-always"].status == "PASS", text
    assert pair.status == "FAIL" and pair.failure is not None, text
    assert pair.failure.property == "gradients", text
    assert pair.failure.row == "+accumulation+unused-always", text
    case = pair.failure.case
    assert case.accumulation > 1 and case.model.unused == "always", text


def test_a_gradient_where_none_is_due_is_named_before_a_rounding_of_another(world):
    """Note [Presence first]: a float32 average rounds every gradient of every case, and a
    parameter no rank used gets zeros. The case with an unused parameter names the zeros, not
    the rounding of the first parameter: its row has a cause of its own, not the core's "as
    above"."""
    core = Case(world_size=2, batch_sizes=(1, 1), steps=1)
    unused = replace(core, model=replace(core.model, unused="always"))
    report = check_target(
        _target("RoundedAndZerosForUnusedDDP"),
        world,
        _settings(features=_only("unused-always"), budget=1e-9),
        explicit=[core, unused],
    )
    text = report.text()
    assert [(f.row, f.property) for f in report.failures] == [
        ("core", "gradients"),
        ("+unused-always", "gradients"),
    ], text
    zeros = report.failures[1].result.divergence_of("gradients")
    assert zeros.detail.startswith("expected no gradient, got a tensor"), text
    assert len(_blocks(text)) == 2, text


def test_cuda_timing_call_is_stubbed_after_its_diagnosis(world):
    """torch.cuda.synchronize() in the target's synchronisation raises on every case of a CPU
    machine; once diagnosed, the cases run with it stubbed, and the gradients summed without
    dividing are reported too, with a replay that stubs it."""
    report = check_target(_target("CudaTimedDDP"), world, _settings(features=_only()))
    text = report.text()
    props = [f.property for f in report.failures]
    assert props[0] == "raised" and "gradients" in props, text
    assert any("--stub-cuda-timing" in n for n in report.notes), text
    grads = next(f for f in report.failures if f.property == "gradients")
    assert "--stub-cuda-timing" in report.to_dict()["failures"][props.index("gradients")]["replay"]
    assert grads.row == "core", text


def test_causes_found_beyond_the_contract_first_are_numbered_after_the_contracts(world):
    """Two given cases: one with a buffer breaks its broadcast (beyond the contract), run first;
    one of the core breaks the division. The core's cause is cause 1, printed first, as it
    streams and at the end; the buffer's is held back until the rows beyond the contract."""
    core = Case(world_size=2, batch_sizes=(1, 1), steps=1)
    buffered = replace(core, model=replace(core.model, buffer=True), rank_dependent_init=True)
    two_bugs = Target("two-bugs", "tests.integration._report_targets:TwoBugsDDP", "ddp")
    streamed: list[str] = []
    report = check_target(
        two_bugs,
        world,
        _settings(features=_only("buffer"), budget=1e-9),
        explicit=[buffered, core],
        on_failure=lambda f: streamed.append(f"cause: {f.property}"),
        on_row=lambda row, i, n: (
            streamed.append(f"row: {row.name}") if row.status != "not drawn" else None
        ),
    )
    text = report.text()
    assert streamed == [
        "cause: gradients",
        "row: core",
        "cause: initial-state",
        "row: +buffer",
        "row: all features",
    ], text
    assert [f.property for f in report.failures] == ["gradients", "initial-state"], text
    assert [f.row for f in report.failures] == ["core", "+buffer"], text
    blocks = _blocks(text)
    assert blocks[0].startswith("cause 1: FAIL two-bugs: gradients"), text
    assert blocks[1].startswith("cause 2: FAIL two-bugs: initial-state"), text
    assert "(1 within the contract, 1 beyond it)" in report.summary(), text
    failures = report.to_dict()["failures"]  # in the order of their causes, each numbered
    assert [(f["property"], f["row"], f["cause"]) for f in failures] == [
        ("gradients", "core", 1),
        ("initial-state", "+buffer", 2),
    ]


def test_a_dead_rank_and_a_hang_in_one_collective_of_the_target_are_one_cause_headed_by_the_hang():
    """One rank aborts in an all-reduce its peer called with another size (the peer raises there),
    and in another case the peer hangs in that same call: one cause, the hang's words first."""
    from paracheck.check.failure import PropertyFailure
    from paracheck.check.run import CaseResult
    from paracheck.check.verdict import causes_of
    from paracheck.world import RankFailure
    from paracheck.world._failures import RankDied, RankHang

    own = ("/home/u/mypkg/",)
    call = '  File "/home/u/mypkg/ddp.py", line 42, in finish_gradient_synchronization\n'
    raised = (
        "Traceback (most recent call last):\n"
        '  File "/x/src/paracheck/check/ranks/_drive.py", line 40, in run_steps\n'
        + call
        + "    dist.all_reduce(flat)\n"
        "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer\n"
    )
    died = RankDied(
        "1 rank(s) died",
        [RankFailure(0, "died", "killed by signal SIGABRT (6)"), RankFailure(1, "raised", raised)],
    )
    dump = (
        "Current thread 0x00007e (most recent call first):\n"
        '  File "/x/site-packages/torch/distributed/distributed_c10d.py", line 2978 in all_reduce\n'
        '  File "/home/u/mypkg/ddp.py", line 42 in finish_gradient_synchronization\n'
        '  File "/x/src/paracheck/check/ranks/_drive.py", line 40 in run_steps\n'
    )
    died.disagreement = "their 3rd all_reduce got tensors of different sizes: rank 0 (died) 12"
    hang = RankHang(
        "hung", [RankFailure(1, "hung", dump)], disagreement="rank 1 is in its 3rd all_reduce"
    )
    dead = PropertyFailure("died", CaseResult(Case(seed=0), error=died), own=own, row="core")
    hung = PropertyFailure("hang", CaseResult(Case(seed=1), error=hang), own=own, row="core")
    assert causes_of([dead, hung]) == [[hung, dead]]
    elsewhere = dump.replace("line 42", "line 77")
    other = RankHang(
        "hung", [RankFailure(1, "hung", elsewhere)], disagreement="rank 1 is in its 3rd"
    )
    third = PropertyFailure("hang", CaseResult(Case(seed=2), error=other), own=own, row="core")
    assert causes_of([dead, hung, third]) == [[hung, dead], [third]]
    # Two ranks dead in that all-reduce in two cases, no frame of the target's known: one cause.
    again = RankDied("1 rank(s) died", [RankFailure(1, "died", "killed by signal SIGABRT (6)")])
    again.disagreement = "their 5th all_reduce got tensors of different sizes: rank 1 (died) 8"
    alone = RankDied("1 rank(s) died", [RankFailure(0, "died", "killed by signal SIGABRT (6)")])
    alone.disagreement = "their 2nd all_reduce got tensors of different sizes: rank 0 (died) 4"
    a = PropertyFailure("died", CaseResult(Case(seed=3), error=again), own=own, row="core")
    b = PropertyFailure("died", CaseResult(Case(seed=4), error=alone), own=own, row="core")
    assert causes_of([a, b]) == [[a, b]]


def test_cuda_timing_call_shown_by_a_given_case_is_stubbed_before_the_search(world):
    """The CUDA call found by a given case, run before any row: every row's search runs with it
    stubbed, and the core's search reaches the gradients summed without dividing."""
    case = Case(world_size=2, batch_sizes=(1, 1), steps=1)
    report = check_target(
        _target("CudaTimedDDP"), world, _settings(features=_only()), explicit=[case]
    )
    text = report.text()
    assert [f.property for f in report.failures] == ["raised", "gradients"], text
    assert report.failures[1].row == "core" and report.failures[1].shrunk, text


def test_a_rounding_and_a_wrong_value_of_one_gradient_are_two_causes():
    """A float32 buffer rounds a float64 gradient (within 1e-3 of it); a wrong weighting gives
    another value: two causes of one property in one row; two wrong values are one."""
    from paracheck.check.failure import PropertyFailure
    from paracheck.check.properties import Divergence
    from paracheck.check.run import CaseResult
    from paracheck.check.verdict import causes_of

    def failure(got, expected, name="w"):
        detail = f"worst element #0 (of the finite ones): got {got}, expected {expected}, ..."
        d = Divergence(0, "grad", 0, 0, name, abs(got - expected), 1e-15, detail=detail)
        result = CaseResult(Case(seed=0), divergences=[d])
        return PropertyFailure("gradients", result, row="core")

    rounded = failure(1.0000000596e00, 1.0e00)
    weighted = failure(1.5e00, 1.0e00)
    again = failure(-2.5e-01, 1.25e-01, name="fc1.weight")
    assert causes_of([rounded, weighted, again]) == [[rounded], [weighted, again]]


def test_a_bucket_structure_failure_is_one_cause_in_every_row():
    """A bucket-structure failure in the core and one in a feature row (whose sizes it changes)
    are one cause; a gradient divergence in each is two (the row is part of its cause)."""
    from paracheck.check.failure import PropertyFailure
    from paracheck.check.properties import Divergence
    from paracheck.check.run import CaseResult
    from paracheck.check.verdict import causes_of

    def failure(prop, what, row):
        d = Divergence(0, what, 0, None, None, 1.0, 2.0, detail="1 all-reduce calls")
        return PropertyFailure(prop, CaseResult(Case(seed=0), divergences=[d]), row=row)

    core = failure("bucket-structure", "bucket-structure", "core")
    pair = failure("bucket-structure", "bucket-structure", "+accumulation+unused-some-ranks")
    grads = failure("gradients", "grad", "core")
    more = failure("gradients", "grad", "+accumulation")
    assert causes_of([core, pair, grads, more]) == [[core, pair], [grads], [more]]


def test_a_pair_row_takes_a_cause_of_one_of_its_features_rows_as_known():
    """The pair row looks for bugs neither feature's row shows: a divergence the accumulation
    row found is not a new cause of +accumulation+unused-always, nor of the whole contract's row;
    it is one of another pair's."""
    from types import SimpleNamespace

    from paracheck.check.attribution import ALL, is_new
    from paracheck.check.failure import PropertyFailure
    from paracheck.check.properties import Divergence
    from paracheck.check.run import CaseResult
    from paracheck.check.verdict import RowVerdict

    d = Divergence(0, "grad", 0, 0, "w", 1.0, 1e-15, detail="")
    result = CaseResult(Case(seed=0), divergences=[d])
    known = PropertyFailure("gradients", result, row="+accumulation")
    search = SimpleNamespace(failures=[known], own=(), declared=frozenset())
    pair = RowVerdict("+accumulation+unused-always", None, pair=("accumulation", "unused-always"))
    other = RowVerdict("+buffer+clip", None, pair=("buffer", "clip"))
    assert not is_new(search, "gradients", result, pair, [])
    assert not is_new(search, "gradients", result, RowVerdict(ALL, None), [])
    assert is_new(search, "gradients", result, other, [])


def _raised(detail: str, row: str):
    from paracheck.check.failure import PropertyFailure
    from paracheck.check.run import CaseResult
    from paracheck.world import RankFailure
    from paracheck.world._failures import RankError

    err = RankError("2 rank(s) raised", [RankFailure(0, "raised", detail)])
    return PropertyFailure(
        "raised", CaseResult(Case(seed=0), error=err), own=("/home/u/mypkg/",), row=row
    )


def test_an_exception_at_one_line_of_the_target_is_one_cause_in_every_row():
    """The same line of the target's code raising the same type (its message naming the case's
    dtypes one way, then the other) is one cause, in the core and in a feature row alike;
    another type, or the same message at another line, is another cause; an exception with no
    frame of the target's is one cause per row."""
    from paracheck.check.verdict import causes_of

    def tb(line: int, last: str) -> str:
        return (
            "Traceback (most recent call last):\n"
            f'  File "/home/u/mypkg/ddp.py", line {line}, in finish_gradient_synchronization\n'
            "    p.grad = flat.view(p.shape)\n" + last + "\n"
        )

    one = "RuntimeError: assign a gradient with dtype 'float' to grad_dtype 'Double'"
    other = "RuntimeError: assign a gradient with dtype 'double' to grad_dtype 'Float'"
    a = _raised(tb(42, one), "+float32-layer")
    b = _raised(tb(42, other), "core")
    c = _raised(tb(42, "KeyError: 'lr'"), "core")
    d = _raised(tb(50, one), "core")
    torch_only = "Traceback (most recent call last):\nRuntimeError: a torch error\n"
    e, f = _raised(torch_only, "core"), _raised(torch_only, "+buffer")
    assert causes_of([a, b, c, d, e, f]) == [[a, b], [c], [d], [e], [f]]


def test_a_rank_killed_with_nothing_recorded_is_the_stuck_cause_known():
    """A rank killed in gloo with no frame and no collective recorded is the stuck cause found
    before (a hang in the same collective, in another row); a hang in another collective with no
    frame in common is another cause."""
    from paracheck.check.failure import PropertyFailure
    from paracheck.check.run import CaseResult
    from paracheck.check.verdict import causes_of
    from paracheck.world import RankFailure
    from paracheck.world._failures import RankDied, RankHang

    hang = RankHang("hung", [RankFailure(0, "hung", "")], disagreement="rank 0 is in its 1st wait")
    died = RankDied("1 rank(s) died", [RankFailure(1, "died", "killed by signal SIGABRT (6)")])
    other = RankHang(
        "hung", [RankFailure(0, "hung", "")], disagreement="rank 0 is in its 2nd broadcast"
    )
    own = ("/home/u/mypkg/",)

    def failure(prop, err, row):
        return PropertyFailure(prop, CaseResult(Case(seed=0), error=err), own=own, row=row)

    hung = failure("hang", hang, "+unused-some-ranks")
    dead = failure("died", died, "core")
    third = failure("hang", other, "+unused-some-ranks")
    assert causes_of([hung, dead, third]) == [[hung, dead], [third]]


def test_a_removal_that_takes_the_late_group_with_it_says_nothing():
    """A known core divergence found again in +unused-always, on a case whose late group holds
    the branch's parameters only: the case without the branch loses the late group (the bug's
    trigger), so its passing says nothing and the failure is the known cause."""
    from types import SimpleNamespace

    from paracheck.cases import GroupSpec
    from paracheck.check.attribution import is_new
    from paracheck.check.failure import PropertyFailure
    from paracheck.check.properties import Divergence
    from paracheck.check.run import CaseResult
    from paracheck.check.verdict import RowVerdict

    detail = "worst element #0 (of the finite ones): got 1.5, expected 1.0, ..."
    d = Divergence(1, "param", 0, 0, "layers.0.weight", 0.5, 1e-15, detail=detail)
    base = Case(world_size=2, batch_sizes=(1, 1), steps=2)
    late = replace(
        base,
        model=replace(base.model, unused="always"),
        optimizer=replace(
            base.optimizer,
            groups=(GroupSpec(params=(2, 3)), GroupSpec(params=(0, 1), add_at_step=1)),
        ),
    )
    known = PropertyFailure("parameters", CaseResult(base, divergences=[d]), row="core")

    def ran(case):
        raise AssertionError(f"no case needs to run: {case}")

    search = SimpleNamespace(
        failures=[known], own=(), declared=frozenset(), checker=SimpleNamespace(run=ran)
    )
    row = RowVerdict("+unused-always", "unused-always")
    every = optional_features()
    planned = [
        (RowVerdict("core", None), every),
        (row, tuple(f for f in every if f != "unused-always")),
    ]
    result = CaseResult(late, divergences=[d])
    assert not is_new(search, "parameters", result, row, planned)


def test_a_cause_filed_under_a_row_printed_already_prints_the_row_again(monkeypatch):
    """A cause found in a feature row that fails the same way without the feature is filed under
    the core, printed PASS already: the core's row is printed again, FAIL, saying where its cause
    was found; the feature row lists it as above."""
    from types import SimpleNamespace

    from paracheck.check import table
    from paracheck.check.failure import PropertyFailure
    from paracheck.check.properties import Divergence
    from paracheck.check.run import CaseResult
    from paracheck.check.verdict import RowVerdict

    d = Divergence(0, "grad", 0, 0, "w", 1.0, 1e-15, detail="")
    result = CaseResult(Case(seed=0), divergences=[d])
    core = RowVerdict("core", None, status="PASS", shown=True)
    buffer = RowVerdict("+buffer", "buffer")
    planned = [(core, ()), (buffer, ())]
    printed = []
    failure = PropertyFailure("gradients", result, row="core")
    search = SimpleNamespace(
        finish=lambda hit, row: failure,
        on_row=lambda row, i, n: printed.append((row.name, i, row.status, row.why)),
    )
    monkeypatch.setattr(table, "attribute", lambda *args: ("core", result))
    hit = SimpleNamespace(prop="gradients", result=result, notes=[])
    table._file(search, hit, buffer, planned)
    assert printed == [("core", 0, "FAIL", "a cause found later, in row +buffer, filed here")]
    assert core.own == [failure] and buffer.also == [failure]


def test_a_resumed_trajectory_wrong_before_the_save_is_the_wrong_steps_cause():
    """A case whose parameters diverge at step 0 fails the reshard property at step 0 too (before
    the save): one cause with the parameters' divergence; a reshard divergence alone (after the
    load, the parameters right) is another."""
    from paracheck.check.failure import PropertyFailure
    from paracheck.check.properties import Divergence
    from paracheck.check.run import CaseResult
    from paracheck.check.verdict import causes_of

    detail = "worst element #0 (of the finite ones): got 1.5, expected 1.0, ..."
    params = Divergence(0, "param", 0, 0, "w", 0.5, 1e-15, detail=detail)
    before = Divergence(0, "reshard", 0, 0, "w", 0.5, 1e-15, detail="param before the save: ...")
    after = Divergence(2, "reshard", 0, 0, "w", 0.5, 1e-15, detail="param after the load: ...")
    case = Case(seed=0)
    wrong = PropertyFailure("parameters", CaseResult(case, divergences=[params]), row="core")
    resumed = PropertyFailure("reshard", CaseResult(case, divergences=[params, before]), row="core")
    loaded = PropertyFailure("reshard", CaseResult(case, divergences=[after]), row="core")
    assert causes_of([wrong, resumed, loaded]) == [[wrong, resumed], [loaded]]


def test_a_rank_dead_in_a_mismatched_collective_reads_as_the_hang_with_its_fix():
    """A DDP skipping parameters whose gradient is None, on gloo: rank 1 aborts in the all-reduce
    its peer called with another size, rank 0 raises there. Alone (no hang found), its block
    still says the ranks disagree, where in the target's code, and gives the hang's fix, not a
    crash's."""
    from paracheck.check.failure import PropertyFailure, property_info
    from paracheck.check.run import CaseResult
    from paracheck.check.verdict import cause_text, causes_of
    from paracheck.world import RankFailure
    from paracheck.world._failures import RankDied

    raised = (
        "Traceback (most recent call last):\n"
        '  File "/x/src/paracheck/check/ranks/_drive.py", line 40, in run_steps\n'
        '  File "/home/u/mypkg/ddp.py", line 28, in finish_gradient_synchronization\n'
        "    dist.all_reduce(p.grad)\n"
        "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer\n"
    )
    died = RankDied(
        "1 rank(s) died",
        [RankFailure(1, "died", "killed by signal SIGABRT (6)"), RankFailure(0, "raised", raised)],
    )
    died.disagreement = (
        "their 4th all_reduce got tensors of different sizes: rank 0 (raised) 16 float64 "
        "elements, rank 1 (died) 8 float64 elements"
    )
    own = ("/home/u/mypkg/",)
    dead = PropertyFailure(
        "died", CaseResult(Case(), error=died), own=own, row="+unused-some-ranks"
    )
    (group,) = causes_of([dead])
    text = cause_text(group, 1, Target("mypkg.ddp:DDP", "mypkg.ddp:DDP", "ddp"), case_files=False)
    hang_fix = property_info("hang", Case(), "ddp").hint
    assert f"  fix: {hang_fix}\n" in text, text
    assert "look for os._exit" not in text, text
    at = "  at /home/u/mypkg/ddp.py:28 in finish_gradient_synchronization: dist.all_reduce(p.grad)"
    assert at in text.splitlines(), text
    assert "the ranks disagree on the collectives they issue" in text.splitlines()[0], text
    # A rank killed with no collective in question keeps the crash's words.
    crash = RankDied("1 rank(s) died", [RankFailure(1, "died", "killed by signal SIGSEGV (11)")])
    alone = PropertyFailure("died", CaseResult(Case(), error=crash), own=own, row="core")
    assert alone.fix == property_info("died").hint and "look for os._exit" in alone.fix


def test_a_core_cause_seen_through_a_property_the_contract_does_not_promise_comes_after(world):
    """A CS336 sharded optimizer that applies weight decay twice and returns an empty
    ``state_dict()``, given two core cases: Adam without weight decay (only the empty state
    shows, optimizer-state, which the handout's ShardedOptimizer never promises), run first, then
    SGD with weight decay (the wrong update, parameters). The wrong update is cause 1, as it
    streams and at the end; the empty state is held back and printed after it, both in the core
    row; the summary counts the second beyond the contract."""
    target = Target(
        "decay-twice-empty-state",
        "tests.integration._unpromised_targets:DecayTwiceEmptyState",
        "sharded",
    )
    mlp = MLPSpec(in_features=3, widths=(4, 2), bias=True)
    state_only = Case(
        model=mlp,
        world_size=2,
        batch_sizes=(1, 1),
        steps=1,
        optimizer=OptimizerSpec("adam", (GroupSpec(params=(0, 1, 2, 3), lr=1e-2),)),
    )
    decay = replace(
        state_only,
        optimizer=OptimizerSpec("sgd", (GroupSpec(params=(0, 1, 2, 3), lr=0.1, weight_decay=0.1),)),
    )
    streamed: list[str] = []
    report = check_target(
        target,
        world,
        _settings(features=_only(), budget=1e-9),
        explicit=[state_only, decay],
        on_failure=lambda f: streamed.append(f.property),
    )
    text = report.text()
    assert streamed == ["parameters", "optimizer-state"], text
    assert [f.property for f in report.failures] == streamed, text
    assert {f.row for f in report.failures} == {"core"}, text
    assert "(1 within the contract, 1 beyond it)" in report.summary(), text


def test_a_second_way_the_first_step_diverged_is_a_cause_of_its_own(world):
    """Note [Every way a step diverged]: the first parameter's gradient left local (a wrong
    value) and the biases summed (scaled by the world size) diverge at the same step of every
    case of two ranks, the first parameter first. Both are causes of the core, from the one case
    given and from the core's own search."""
    core = Case(world_size=2, batch_sizes=(1, 1), steps=1)
    given = check_target(
        _target("LocalFirstAndSummedBiasesDDP"),
        world,
        _settings(features=_only(), world_sizes=(2,), budget=1e-9),
        explicit=[core],
    )
    searched = check_target(
        _target("LocalFirstAndSummedBiasesDDP"),
        world,
        _settings(features=_only(), world_sizes=(2,)),
    )
    for report in (given, searched):
        text = report.text()
        grads = [f for f in report.failures if f.property == "gradients"]
        assert [f.row for f in grads] == ["core", "core"], text
        ways = [f.result.divergence_of("gradients") for f in grads]
        assert [d.how for d in ways] == ["value", "scaled"], text
        assert ways[0].index == 0 and ways[1].name.endswith("bias"), text
        assert len(_blocks(text)) == 2, text


def test_a_cuda_call_diagnosed_in_a_first_case_is_stubbed_before_the_core_is_searched(world):
    """A sharded check runs a case built for it before the core's search (Note [A partition by
    count]); it raises at torch.cuda.synchronize(). The core's search runs stubbed and finds the
    last rank's parameters never broadcast; unstubbed, every case it drew raised the cause known
    and the core found nothing else."""
    target = Target("cuda-sharded", _PATH + "CudaTimedUnbroadcastSharded", "sharded")
    report = check_target(target, world, _settings(features=_only(), world_sizes=(2,)))
    text = report.text()
    core = next(r for r in report.rows if r.name == "core")
    own = [(f.property, f.shrunk) for f in core.own]
    assert ("raised", False) in own, text  # the first case, run as it is
    assert ("parameters", True) in own, text  # found by the core's own search
    assert any("--stub-cuda-timing" in n for n in report.notes), text
