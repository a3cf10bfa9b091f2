"""The outside-style corpus (``corpus/``, run by ``scripts/corpus.py``): its manifest is what the
designs' docstrings say, every design imports, and reports are read into verdict-table rows."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("corpus_script", ROOT / "scripts" / "corpus.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_corpus_manifest_matches_docstrings():
    """MANIFEST.json equals what ``read_designs`` reads from the imported designs; at least 40
    designs, 10 of them correct, and every planted bug names a row of the verdict table."""
    script = _script()
    designs = script.read_designs()
    assert json.loads((ROOT / "corpus" / "MANIFEST.json").read_text())["designs"] == designs
    assert len(designs) >= 40
    assert sum(d["expected"] == "correct" for d in designs) >= 10
    rows = script.known_rows()
    assert [d["target"] for d in designs if d["expected"] not in rows | {"correct"}] == []


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
