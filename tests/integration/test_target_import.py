"""A target's module that exits or never returns while imported is a usage error naming what it
did, never a silent exit 0 or a hang (Note [Importing a target])."""

import os
import signal

import pytest

import paracheck.check.loading as loading
from paracheck.check.targets import TargetError, load_object

MODULES = {
    "exits_zero": "import sys\nsys.exit(0)\n",
    "underscore_exit": "import os\nos._exit(0)\n",
    "never_returns": "import time\ntime.sleep(10**6)\n",
    "prints": "print('hello from the top level')\nclass DDP:\n    pass\n",
}


@pytest.fixture
def module(tmp_path):
    def write(name):
        path = tmp_path / f"{name}.py"
        path.write_text(MODULES[name])
        return f"{path}:DDP"

    return write


@pytest.mark.parametrize(
    "name, said",
    [
        ("exits_zero", "called sys.exit(0), which would end the check having checked nothing"),
        ("underscore_exit", "called os._exit(0), which would end the check"),
    ],
)
def test_an_exit_at_import_is_a_target_error(module, name, said):
    with pytest.raises(
        TargetError, match=r"importing module .* " + said.replace("(", r"\(").replace(")", r"\)")
    ):
        load_object(module(name))
    assert os._exit is not None and os._exit.__module__ in ("posix", "nt")  # restored


def test_an_import_that_never_returns_is_a_target_error(module, monkeypatch):
    monkeypatch.setattr(loading, "IMPORT_SECONDS", 0.5)
    with pytest.raises(TargetError, match=r"did not finish importing within 0.5 s"):
        load_object(module("never_returns"))
    assert signal.getsignal(signal.SIGALRM) == signal.SIG_DFL
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_what_a_module_prints_at_import_goes_to_stderr(module, capsys):
    load_object(module("prints"))
    out, err = capsys.readouterr()
    assert out == "" and "hello from the top level" in err


def test_ranks_that_do_not_start_end_the_cli_with_exit_2(monkeypatch, capsys):
    """A World that cannot start its ranks (a machine too loaded) judged nothing: exit 2 and one
    line, never a traceback with the exit code of a failing verdict."""
    import paracheck.cli.check as cli_check
    from paracheck.cli import main
    from paracheck.world import WorldStartError

    def refuse(*a):
        raise WorldStartError("ranks did not start within 120.0 s")

    monkeypatch.setattr(cli_check, "_make_world", refuse)
    assert main(["check", "naive", "--world-sizes", "1", "--no-database"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("paracheck: error: could not run the checks: ranks did not start")
    assert "Traceback" not in err
