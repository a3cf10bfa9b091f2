"""``paracheck check --contract`` and ``--features``: what the cases draw. A DDP that reduces only
the gradients that are not None (correct under the CS336 interface) fails the full contract on a
parameter used on some ranks only, and passes when that feature is not drawn."""

import json
from pathlib import Path

import pytest

import paracheck.cli.check as cli_check
from paracheck.check.property import check_target
from paracheck.check.targets import resolve_target
from paracheck.cli import main
from tests.integration._borrowed import Borrowed

CS336_DDP = f"{Path(__file__).with_name('_cs336_ddp.py')}:GradNotNoneDDP"
# The default sequence breaks GradNotNoneDDP at its 7th case at world sizes 1,2,3 (measured), so a
# pass with this many examples is not a pass for want of cases.
EXAMPLES = "10"
SEARCH = dict(world_sizes=(1, 2, 3), max_examples=int(EXAMPLES))


@pytest.fixture
def check(world, monkeypatch, tmp_path):
    """``paracheck check TARGET ARGS...`` in this process on the session's World: (exit, JSON)."""
    monkeypatch.setattr(cli_check, "_make_world", lambda *a: Borrowed(world))
    monkeypatch.chdir(tmp_path)

    def run(*args: str):
        out = tmp_path / "verdict.json"
        out.unlink(missing_ok=True)
        code = main(
            ["check", CS336_DDP, "--world-sizes", "1,2,3", "--max-examples", EXAMPLES]
            # No budget: a pass must not turn INCOMPLETE (exit 3) on a loaded machine.
            + ["--no-database", "--budget", "0", "--json", str(out), *args]
        )
        return code, json.loads(out.read_text())["targets"][0]

    return run


def test_grad_not_none_ddp_fails_the_full_contract_on_unused_some_ranks(world):
    """Drawn by default, a parameter used on some ranks only breaks it, and the failure says so."""
    # The labelling re-runs a dying case without each feature; on two loaded cores (two xdist
    # workers) 2 s of budget ran out before "unused-some-ranks" was tried.
    report = check_target(
        resolve_target(CS336_DDP), world, labels=True, hang_shrink_seconds=20, **SEARCH
    )
    assert not report.passed
    assert "unused-some-ranks" in report.failures[0].needs, report.text()


@pytest.mark.parametrize(
    "args",
    [("--contract", "cs336"), ("--features", "-unused-some-ranks")],
    ids=["contract-cs336", "minus-unused-some-ranks"],
)
def test_grad_not_none_ddp_passes_when_unused_some_ranks_is_not_drawn(check, args):
    """Under the CS336 contract, or with that one feature off, it passes (``--features -name``
    written with a space, as argparse alone would refuse)."""
    code, verdict = check(*args)
    assert code == 0 and verdict["passed"], verdict
    assert verdict["cases_run"] >= 8


def test_plus_draws_a_feature_the_contract_turned_off(world):
    """``contract="cs336", features="+unused-some-ranks"`` draws it again: the failure is back."""
    report = check_target(
        resolve_target(CS336_DDP),
        world,
        contract="cs336",
        features="+unused-some-ranks",
        hang_shrink_seconds=2,
        **SEARCH,
    )
    assert not report.passed and report.failures[0].case.model.unused == "data", report.text()


@pytest.fixture
def no_world(monkeypatch):
    def refuse(*a):
        raise AssertionError("a World was started for a usage error")

    monkeypatch.setattr(cli_check, "_make_world", refuse)


@pytest.mark.parametrize(
    "args, words",
    [
        (["--features", "-nope"], ["--features=-nope: 'nope' is not a feature", "buffer"]),
        (["--features=frozen"], ["--features=frozen: 'frozen' must be -name"]),
        (["--features", "-several-steps,+late-group"], ["+late-group needs several-steps"]),
    ],
)
def test_a_bad_feature_selection_exits_2_naming_it(args, words, capsys, no_world):
    """Refused before any rank starts, with the value, the rule and the valid names."""
    assert main(["check", "naive", *args]) == 2
    err = capsys.readouterr().err
    for w in words:
        assert w in err, err


def test_an_unknown_contract_exits_2(capsys, no_world):
    with pytest.raises(SystemExit) as info:
        main(["check", "naive", "--contract", "cs999"])
    assert info.value.code == 2 and "invalid choice: 'cs999'" in capsys.readouterr().err
