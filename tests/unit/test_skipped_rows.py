"""A feature row whose cases were skipped says so: "not supported" where every case was (never a
bare PASS), how many where some were; the core row and a failing row are left as they are."""

from types import SimpleNamespace

from paracheck.check.table import _say_skipped
from paracheck.check.verdict import RowVerdict

WHY = "torch.compile (aot_eager) cannot run the model alone: RuntimeError: view size"


def _results(skipped: int, judged: int):
    return [SimpleNamespace(extra={"skipped": WHY}) for _ in range(skipped)] + [
        SimpleNamespace(extra={}) for _ in range(judged)
    ]


def test_a_row_whose_every_case_was_skipped_is_not_supported():
    row = RowVerdict("+compile", "compile", status="PASS", cases=3)
    _say_skipped(row, _results(3, 0), ("compile",))
    assert row.status == "not supported"
    assert row.why == f"every case of the row was skipped: {WHY}"


def test_a_row_with_some_cases_skipped_passes_and_counts_them():
    row = RowVerdict("+compile", "compile", status="PASS", cases=5)
    _say_skipped(row, _results(2, 3), ("compile",))
    assert (row.status, row.why) == ("PASS", f"2 of 5 cases skipped: {WHY}")


def test_the_core_and_a_failing_row_are_left_as_they_are():
    core = RowVerdict("core", None, status="PASS", cases=3)
    _say_skipped(core, _results(3, 0), ())
    assert (core.status, core.why) == ("PASS", "")
    failed = RowVerdict("+compile", "compile", status="FAIL", cases=3)
    _say_skipped(failed, _results(3, 0), ("compile",))
    assert failed.status == "FAIL"
