"""The outside-style corpus (``corpus/``, run by ``scripts/corpus.py``): its manifest is what the
designs' docstrings say, every design imports, reports are read into verdict-table rows, and each
planted bug of a report is judged (printed, folded under another cause, "as above", budget)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("corpus_script", ROOT / "scripts" / "corpus.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_corpus_manifest_matches_docstrings():
    """MANIFEST.json equals what ``read_designs`` reads from the imported designs; at least 60
    designs, 14 of them correct, 16 with two bugs or more (one with three), 4 that call CUDA-only
    code, bugs in and beyond the CS336 contract; every planted bug names rows of the verdict table
    and properties paracheck has."""
    from paracheck.check.properties.catalog import PROPERTIES

    script = _script()
    designs = script.read_designs()
    assert json.loads((ROOT / "corpus" / "MANIFEST.json").read_text())["designs"] == designs
    assert len(designs) >= 60
    assert sum(d["expected"] == "correct" for d in designs) >= 14
    several = [d for d in designs if len(d.get("bugs", [])) >= 2]
    assert len(several) >= 16
    assert any(len(d["bugs"]) >= 3 for d in several)
    assert sum("cuda" in d for d in designs) >= 4
    bugs = [b for d in designs for b in d.get("bugs", [])]
    assert {b["contract"] for b in bugs} == {"in", "beyond"}
    assert [b for b in bugs if not all(script.row_known(r) for r in b["rows"])] == []
    assert [b for b in bugs if set(b["shows"]) - set(PROPERTIES)] == []


def test_docstring_header_with_several_bugs():
    """Several ``bug:`` lines, each with its properties and pattern, and a ``cuda:`` line; a row
    may have alternatives; anything else in the header is refused, naming the line."""
    script = _script()
    parsed = script.parse_docstring(
        "bug: core: summed\n    shows: gradients, parameters\n"
        "bug: lr-changes|scheduler: no lr\n    shows: raised\n    match: KeyError\n"
        "cuda: events\n\nMore text: not the header.\n"
    )
    assert parsed == {
        "expected": "bug",
        "bugs": [
            {
                "rows": ["core"],
                "what": "summed",
                "shows": ["gradients", "parameters"],
                "match": None,
            },
            {
                "rows": ["lr-changes", "scheduler"],
                "what": "no lr",
                "shows": ["raised"],
                "match": "KeyError",
            },
        ],
        "cuda": "events",
    }
    assert script.parse_docstring("correct\n\nwhy") == {"expected": "correct"}
    for bad in ("correct\nbug: core: x", "bug: core", "cuda: only", "bug: core: x\nshows: raised"):
        with pytest.raises(ValueError, match="docstring"):
            script.parse_docstring(bad)


def test_contract_of_a_bug():
    """A bug is beyond the CS336 contract where every row it may show in needs a feature CS336
    never draws, or where it shows only through properties its interfaces do not promise (the
    balance of the state stepped, the state read from state_dict())."""
    script = _script()

    def bug(rows, shows=()):
        return {"rows": rows, "shows": list(shows)}

    assert script.contract_of(bug(["core"], ["gradients"])) == "in"
    assert script.contract_of(bug(["buffer"])) == "beyond"
    assert script.contract_of(bug(["accumulation+unused-always"])) == "beyond"
    assert script.contract_of(bug(["partial-window"])) == "beyond"  # requires accumulation
    assert script.contract_of(bug(["core"], ["balance", "memory"])) == "beyond"
    assert script.contract_of(bug(["core"], ["optimizer-state", "state-consolidated"])) == "beyond"
    assert script.contract_of(bug(["core"], ["optimizer-state", "parameters"])) == "in"
    assert script.contract_of(bug(["core", "buffer"])) == "in"
    assert script.row_known("accumulation+unused-always")
    assert not script.row_known("accumulation+nonsense")


def test_corpus_reads_both_report_forms():
    """A verdict table is read row by row; a list of failures goes by the optional feature each
    needs (the core for none, "all features" for several)."""
    script = _script()
    table = {"rows": [{"row": "core", "status": "PASS"}, {"row": "+buffer", "status": "FAIL"}]}
    assert script.report_rows(table) == {"core": "PASS", "buffer": "FAIL"}
    failures = {
        "passed": False,
        "failures": [
            {"needs": ["world>=2", "no-sync", "accumulation"]},
            {"needs": ["world>=2"]},
            {"needs": ["buffer", "float32-layer"]},
            {"needs": None},
        ],
    }
    assert script.report_rows(failures) == {
        "no-sync": "FAIL",
        "core": "FAIL",
        "all features": "FAIL",
        "unlabelled": "FAIL",
    }
    assert script.report_rows({"passed": True, "failures": []}) == {"all features": "PASS"}


def _row(name, status="FAIL", prop=None, also=(), why=""):
    return {"row": name, "status": status, "property": prop, "also": list(also), "why": why}


def _failure(prop, tensor=None, detail="", meaning="m"):
    div = None if tensor is None else {"name": tensor, "index": None, "rank": 0, "step": 0}
    return {"property": prop, "divergence": div, "detail": detail, "meaning": meaning}


def _design(*bugs, cuda=None):
    script = _script()
    out = {"target": "corpus/x.py:X", "expected": "bug", "bugs": []}
    for rows, shows, match in bugs:
        b = {"rows": rows, "what": "", "shows": shows, "match": match}
        out["bugs"].append({**b, "contract": script.contract_of(b)})
    if cuda:
        out["cuda"] = cuda
    return out


def test_judge_printed_folded_and_as_above():
    """A bug whose failure heads its own cause block is printed (in its row or not); one whose
    failure is folded into another property's block of the same tensor is found but not printed;
    one whose row failed only "as above" with a property it shows is "as above"; one whose row
    the budget never reached is "budget"."""
    script = _script()
    design = _design(
        (["core"], ["gradients"], "bias"),  # printed, cause 1, in its row
        (["core"], ["parameters"], None),  # folded under cause 1 (same tensor)
        (["buffer"], ["initial-state"], None),  # its row failed as above
        (["no-sync"], ["reduced-once"], None),  # its row not reached
        (["unused-some-ranks"], ["hang"], None),  # printed, in another row
    )
    report = {
        "rows": [
            _row("core", prop="gradients"),
            _row("+buffer", also=["gradients", "initial-state"]),
            _row("+unused-always", prop="hang"),
            _row("+no-sync", status="not reached", why="the budget of 90 s ran out (--budget)"),
        ],
        "failures": [
            _failure("gradients", "layers.0.bias"),
            _failure("parameters", "layers.0.bias"),
            _failure("hang", detail='File "/w/corpus/x.py", line 3 in f'),
        ],
    }
    # The folded failure is filed under no row: the rows name one cause each.
    report["rows"][0]["more"] = []
    v = script.judge(design, report)
    assert [b["status"] for b in v["bugs"]] == [
        "printed",
        "not printed",
        "as above",
        "budget",
        "printed",
    ]
    assert [b["in_row"] for b in v["bugs"]] == [True, False, False, False, False]
    assert v["bugs"][4]["row"] == "unused-always" and v["bugs"][4]["cause"] == 2
    assert v["unexplained"] == [] and v["order"] is False  # the folded in-contract bug
    assert v["first_beyond"] is False


def test_judge_order_unexplained_blame_and_cuda():
    """Cause 1 beyond the contract before an in-contract bug breaks the order; a printed cause no
    bug explains is unexplained, unless it names the design's CUDA call; a failure called
    paracheck's harness's is counted as blame."""
    script = _script()
    design = _design(
        (["core"], ["gradients"], None), (["buffer"], ["raised"], "KeyError"), cuda="ev"
    )
    report = {
        "rows": [_row("core", prop="raised"), _row("+buffer", prop="raised")],
        "failures": [
            _failure("raised", detail="RuntimeError: Tried to instantiate dummy base class Event"),
            _failure(
                "raised", detail="KeyError: 'lr'", meaning="paracheck's harness raised on rank 0"
            ),
            _failure("gradients", "layers.1.weight", meaning="extra"),
        ],
    }
    report["rows"].append(_row("+unused-always", prop="gradients"))
    v = script.judge(design, report)
    assert [b["status"] for b in v["bugs"]] == ["printed", "printed"]
    assert v["bugs"][0]["cause"] == 3 and v["bugs"][1]["cause"] == 2
    assert v["order"] is False and v["cuda"] is True and v["blame"] == 1
    assert v["unexplained"] == []
    no_cuda = {k: w for k, w in design.items() if k != "cuda"}
    assert [c["cause"] for c in script.judge(no_cuda, report)["unexplained"]] == [1]
    # In-contract first: the order holds.
    report["failures"] = [report["failures"][2], report["failures"][1]]
    report["rows"] = [_row("core", prop="gradients"), _row("+buffer", prop="raised")]
    v = script.judge(design, report)
    assert v["order"] is True and v["first_beyond"] is False
    assert script.judge(design, None)["bugs"][0]["status"] == "no report"


def test_judge_matches_bugs_of_one_property_by_count():
    """Two bugs that can show as the same property, one printed cause and one failure folded
    under it: one bug printed, the other found but not printed, whichever order they are listed
    in (a greedy match would give the printed cause to the bug that can take the other too)."""
    script = _script()
    report = {
        "rows": [_row("core", prop="parameters")],
        "failures": [
            _failure("parameters", "layers.0.weight"),
            _failure("gradients", "layers.0.weight"),
        ],
    }
    for first, second in (
        (["parameters"], ["gradients", "parameters"]),
        (["gradients", "parameters"], ["parameters"]),
    ):
        design = _design((["core"], first, None), (["core"], second, None))
        statuses = sorted(b["status"] for b in script.judge(design, report)["bugs"])
        assert statuses == ["not printed", "printed"]


def test_failure_rows_of_a_case_run_before_the_search():
    """A failure found by a case run before a row's search (a kind's first case) is not the row's
    own cause but is listed among its "as above": it is filed under that row, not under none."""
    script = _script()
    report = {
        "rows": [
            _row("core", prop="gradients", also=["parameters"]),
            _row("+buffer", prop="raised"),
        ],
        "failures": [_failure("parameters", "a"), _failure("gradients", "a"), _failure("raised")],
    }
    assert script._failure_rows(report) == ["core", "core", "buffer"]


def test_judge_a_bug_printed_twice_is_split_not_unexplained():
    """A second printed cause that only a bug already matched explains (a hang, then a death, of
    one mismatch of collectives) is that bug split in two, not a cause no bug explains."""
    script = _script()
    design = _design((["unused-some-ranks"], ["hang", "died"], None))
    report = {
        "rows": [_row("+unused-some-ranks", prop="hang"), _row("all features", prop="died")],
        "failures": [
            _failure("hang", detail='File "/w/corpus/x.py", line 3 in f'),
            _failure("died", detail="rank 1 killed by signal SIGABRT"),
        ],
    }
    v = script.judge(design, report)
    assert [b["status"] for b in v["bugs"]] == ["printed"]
    assert v["split"] == 1 and v["unexplained"] == []


def test_judge_the_cuda_call_is_no_bugs_failure():
    """The design's CUDA-only call raising is named as such, never matched to a planted bug that
    can raise, nor counted as that bug printed again."""
    script = _script()
    design = _design((["unused-some-ranks"], ["raised", "died"], None), cuda="events")
    report = {
        "rows": [_row("core", prop="raised")],
        "failures": [
            _failure("raised", detail="RuntimeError: Tried to instantiate dummy base class Event")
        ],
    }
    v = script.judge(design, report)
    assert [b["status"] for b in v["bugs"]] == ["missed"]
    assert v["cuda"] is True and v["split"] == 0 and v["unexplained"] == []
