"""The example database (``paracheck.check.database``): a check saves its failing cases, the next
check of the target replays them before any search, and drops them once they pass; from the
command line and from the pytest plugin."""

import json
from dataclasses import replace
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
            + ["--budget", "0", "--json", str(out), *extra]  # a pass stays 0 under load
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


# A loop case (the shape the loop kind draws), saved under the token-mean loss.
LOOP_CASE = (
    '{"model": {"kind": "lm", "vocab_size": 7, "context_length": 2, "d_model": 8, "d_ff": 8, '
    '"num_layers": 1, "num_heads": 2, "norm": "torch"}, "world_size": 2, "batch_sizes": [1, 1], '
    '"steps": 1, "accumulation": 2, "no_sync": false, "optimizer": {"name": "sgd", "groups": '
    '[{"params": [], "lr": 0.05, "weight_decay": 0.0, "momentum": 0.0, "betas": [0.9, 0.999], '
    '"add_at_step": null}], "lr_decay": 1.0, "as_generator": false, "scheduler": null, '
    '"groups_as_generators": false}, "bucket_size_mb": null, "seed": 1, '
    '"rank_dependent_init": false, "set_to_none": true, "dtype": "float32", "merged_ranks": 1, '
    '"closure": false, "reload_at_step": null, "zero_grad_module": false, "finish_once": false, '
    '"double_backward": false, "unbounded_bucket": false, "clip_norm": null, "autocast": null, '
    '"loss_scale": null, "loss": "token-mean", "padded": true, "empty_micro": false, '
    '"last_window": null, "autocast_cache": true, "master_weights": false, '
    '"masters_from_float32": false, "prefetch": 0, "delay_at": null, "delay_rank": 0, '
    '"delay_s": 0.0}'
)


def test_a_saved_case_of_another_declaration_is_kept_not_replayed(world, tmp_path, capsys):
    """A loop's loss and clip norm are its declarations: a case saved before the loss was
    declared (it fails the batch-mean loop, correctly) is not that loop's case. Replayed, it
    failed a correct target; it is kept, and a ``--case`` of another declaration is refused."""
    from paracheck.check.run import run_case

    target = resolve_target("loop-batch-mean")
    token_mean = Case.from_json(LOOP_CASE)
    assert not run_case(world, target, token_mean).ok  # what a replay would have said
    db = CaseDatabase(tmp_path / "db")
    key = f"{target.path}|{target.kind}"
    db.save(key, token_mean, "gradients")
    clipped = replace(
        Case.from_json(LOOP_CASE.replace('"token-mean"', '"batch-mean"')), clip_norm=1.0
    )
    db.save(key, clipped, "gradients")
    report = check_target(target, world, world_sizes=(1, 2), max_examples=4, database=db)
    assert report.passed and report.replayed == 0, report.text()
    assert (
        "1 saved case kept, not replayed: its loss is 'token-mean', the target declares "
        "'batch-mean'" in report.notes
    )
    assert (
        "1 saved case kept, not replayed: its clip norm is 1.0, the target declares None"
        in report.notes
    )
    code = main(["check", "loop-batch-mean", "--case", LOOP_CASE])
    assert code == 2
    assert "--case is not a case of loop-batch-mean: its loss is 'token-mean'" in (
        capsys.readouterr().err
    )
