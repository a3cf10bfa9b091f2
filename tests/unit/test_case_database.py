"""The example database's files (``paracheck.check.database``): pure, no ranks."""

import pytest

from paracheck.cases import Case
from paracheck.check.database import CaseDatabase
from paracheck.workloads import MLPSpec

SMALL = Case(world_size=1, batch_sizes=(1,), steps=1)
LARGER = Case(model=MLPSpec(widths=(3, 2)), world_size=2, batch_sizes=(1, 2))


def test_a_saved_case_loads_back_with_its_property_smallest_first(tmp_path):
    """Cases come back as saved, smallest first; saving the same (case, property) twice keeps one."""
    db = CaseDatabase(tmp_path)
    db.save("t|ddp", LARGER, "gradients", {"equivalence"})
    db.save("t|ddp", SMALL, "hang", {"equivalence"})
    db.save("t|ddp", SMALL, "hang", {"equivalence"})
    saved = db.cases("t|ddp")
    assert [(s.case, s.property) for s in saved] == [(SMALL, "hang"), (LARGER, "gradients")]
    assert saved[0].properties == frozenset({"equivalence"}) and db.cases("other|ddp") == []


def test_a_file_that_no_longer_loads_is_listed_first_with_its_error(tmp_path):
    db = CaseDatabase(tmp_path)
    good = db.save("t|ddp", SMALL, "gradients")
    good.with_name("broken.json").write_text('{"case": {"world_size": "two"}}')
    first, second = db.cases("t|ddp")
    assert first.case is None and "KeyError" in first.error and second.case == SMALL


def test_deleting_the_last_case_of_a_target_removes_its_folder(tmp_path):
    db = CaseDatabase(tmp_path)
    file = db.save("t|ddp", SMALL, "gradients")
    db.delete(db.cases("t|ddp")[0])
    assert not file.exists() and not file.parent.exists() and tmp_path.exists()


def test_a_database_that_is_not_a_path_is_refused():
    with pytest.raises(TypeError, match="database=3 must be a directory path"):
        CaseDatabase(3)
