"""The example database (``paracheck.check.database``): a check saves its failing cases, the next
check of the target replays them before any search, and drops them once they pass; from the
command line and from the pytest plugin."""

import json
from pathlib import Path

import paracheck.cli.check as cli_check
from paracheck.cases import Case
from paracheck.check.database import CaseDatabase
from paracheck.check.property import check_target
from paracheck.check.targets import resolve_target
from paracheck.cli import main
from paracheck.workloads import MLPSpec
from tests.integration._borrowed import Borrowed

pytest_plugins = ("pytester",)

# A DDP whose code changes between checks: FlatDDP that forgets to divide while `broken` exists.
TOGGLE = """
from pathlib import Path

from paracheck.ddp import FlatDDP

BROKEN = Path(__file__).with_name("broken")


class ToggleDDP(FlatDDP):
    def _average(self, summed):
        return summed if BROKEN.exists() else super()._average(summed)
"""


def _toggle(folder: Path) -> str:
    (folder / "toggle_ddp.py").write_text(TOGGLE)
    (folder / "broken").touch()
    return f"{folder / 'toggle_ddp.py'}:ToggleDDP"


def _saved(root: Path) -> list[Path]:
    return sorted(root.rglob("*.json")) if root.exists() else []


def test_cli_saves_a_failing_case_replays_it_first_and_drops_it_once_fixed(
    world, tmp_path, monkeypatch
):
    """Default options: the failing case lands in .paracheck/examples; the next run replays it
    first (the JSON verdict says so, and the failure is its first case); once the target is fixed
    the replayed case passes and is deleted. --no-database writes nothing."""
    monkeypatch.setattr(cli_check, "_make_world", lambda *a: Borrowed(world))
    monkeypatch.chdir(tmp_path)
    target = _toggle(tmp_path)
    db = tmp_path / ".paracheck" / "examples"

    def check(*extra: str):
        out = tmp_path / "verdict.json"
        out.unlink(missing_ok=True)
        code = main(
            ["check", target, "--world-sizes", "1,2", "--max-examples", "6", "--first-failure"]
            + ["--json", str(out), *extra]
        )
        return code, json.loads(out.read_text())["targets"][0]

    code, verdict = check("--no-database")
    assert code == 1 and verdict["database"] is None and not (tmp_path / ".paracheck").exists()

    code, verdict = check()
    assert code == 1 and verdict["database"]["saved"] == 1 and verdict["database"]["replayed"] == 0
    (entry,) = _saved(db)
    saved = json.loads(entry.read_text())
    assert saved["property"] == "gradients" and saved["target"].endswith("ToggleDDP|ddp")
    assert Case.from_dict(saved["case"]) == Case.from_dict(verdict["failures"][0]["case"])

    code, verdict = check()
    assert code == 1 and verdict["database"]["replayed"] == 1
    assert verdict["first_failure_at_case"] == 1
    assert "replayed from" in verdict["failures"][0]["notes"][0]

    (tmp_path / "broken").unlink()
    code, verdict = check()
    assert code == 0 and verdict["database"] == {
        "path": ".paracheck/examples",
        "replayed": 1,
        "dropped": 1,
        "saved": 0,
    }
    assert _saved(db) == []


def test_a_saved_case_the_check_would_not_draw_is_kept_not_replayed(world, tmp_path):
    """A saved case with a feature turned off (here by the cs336 contract) or of a world size not
    asked for stays in the database untouched: replaying it would check what was excluded."""
    target = resolve_target(_toggle(tmp_path))
    db = CaseDatabase(tmp_path / "db")
    key = f"{target.path}|{target.kind}"
    branch = Case(model=MLPSpec(unused="data"), world_size=2, batch_sizes=(1, 1), steps=1)
    db.save(key, branch, "gradients")
    db.save(key, Case(world_size=3, batch_sizes=(1, 1, 1), steps=1), "gradients")
    report = check_target(
        target, world, world_sizes=(1, 2), max_examples=6, contract="cs336", database=db
    )
    assert report.replayed == 0 and len(_saved(db.path)) == 2 + report.saved
    assert "1 saved case kept, not replayed: unused-some-ranks is not drawn" in report.notes
    assert "1 saved case kept, not replayed: world size 3 is not among [1, 2]" in report.notes


PLUGIN_TEST = """
def test_toggle(paracheck_check):
    paracheck_check({target!r}, world_sizes=(1, 2), max_examples=6, first_failure=True)
"""


def test_plugin_saves_replays_and_drops_failing_cases(inner):
    """paracheck_check saves under the rootdir's .paracheck/examples, replays first, drops once
    fixed; --paracheck-no-database writes nothing."""
    target = _toggle(inner.path)
    inner.makepyfile(test_toggle=PLUGIN_TEST.format(target=target))
    db = inner.path / ".paracheck" / "examples"
    args = ("-p", "no:cacheprovider", "--paracheck-world-sizes", "1,2")

    inner.runpytest(*args, "--paracheck-no-database").assert_outcomes(failed=1)
    assert _saved(db) == []
    first = inner.runpytest(*args)
    first.assert_outcomes(failed=1)
    assert len(_saved(db)) == 1 and "saved 1 failing case in" in first.stdout.str()
    again = inner.runpytest(*args)
    again.assert_outcomes(failed=1)
    again.stdout.fnmatch_lines(["*replayed 1 saved case first*", "*replayed from*"])
    (inner.path / "broken").unlink()
    inner.runpytest(*args).assert_outcomes(passed=1)
    assert _saved(db) == []
