"""World sizes above what the machine runs on gloo are a usage error before any rank starts,
naming the option, its value, the limit and why; the override lifts it. Reference: Note [Gloo
rank limit] (paracheck.check.limits)."""

import subprocess
import sys

import pytest

from paracheck.cases import Case, GroupSpec, OptimizerSpec
from paracheck.check import limits
from paracheck.check.limits import rank_limit, world_size_error
from paracheck.cli import check as cli_check
from paracheck.cli import main
from paracheck.workloads import MLPSpec

CASE_64 = Case(
    model=MLPSpec(in_features=2, widths=(2,)),
    world_size=64,
    batch_sizes=(1,) * 64,
    steps=1,
    optimizer=OptimizerSpec(name="sgd", groups=(GroupSpec(params=(), lr=0.1),)),
).to_json()


@pytest.fixture
def two_cores(monkeypatch):
    """The 2-core, 4 GiB machine, whatever this one is."""
    monkeypatch.setattr(limits, "_cores", lambda: 2)
    monkeypatch.setattr(limits, "_memory_mib", lambda: 4096)


@pytest.fixture
def no_world(monkeypatch):
    """Starting ranks fails the test: every refusal must come before."""

    def refuse(*args, **kwargs):
        raise AssertionError("a World was started")

    monkeypatch.setattr(cli_check, "_make_world", refuse)


def test_limit_is_the_smaller_of_cores_and_memory():
    """4 ranks per core; 256 MiB per rank in half the memory; unknown memory is no bound."""
    assert rank_limit(2, 24 * 1024).ranks == 8
    assert rank_limit(2, 2048).ranks == 4
    assert rank_limit(16, None).ranks == 64
    with pytest.raises(ValueError, match="cores=0"):
        rank_limit(0, None)


def test_default_and_suite_world_sizes_fit_two_cores(two_cores):
    """1,2,3,4 (the default) and 1,2,3,4,6 (the test suite's) are allowed on 2 cores."""
    assert world_size_error("--world-sizes", "1,2,3,4,6", (1, 2, 3, 4, 6), "--x") is None
    message = world_size_error("--world-sizes", "1,64", (1, 64), "--allow-large-world")
    assert message is not None and message.startswith("--world-sizes=1,64: world size 64 ")
    assert "at most 8: 2 cores x 4 ranks per core = 8" in message
    assert "Pass --allow-large-world to run it anyway" in message


@pytest.mark.parametrize(
    "argv",
    [
        ["check", "naive", "--world-sizes", "1,64"],
        ["check", "naive", "--case", CASE_64],
        ["selftest", "--world-sizes", "64"],
    ],
)
def test_large_world_exits_2_before_any_rank(two_cores, no_world, capsys, argv):
    """check, a replayed case and selftest: exit 2, the option and value named, no World."""
    assert main([*argv, "--no-database"] if argv[0] == "check" else argv) == 2
    err = capsys.readouterr().err
    assert "world size 64 is more gloo ranks than this machine runs (at most 8" in err
    assert ("--world-sizes=" if "--world-sizes" in argv else "--case world_size=64") in err


def test_allow_large_world_lifts_the_limit(two_cores, no_world):
    """--allow-large-world goes on to start the ranks (here: refused by the fixture)."""
    with pytest.raises(AssertionError, match="a World was started"):
        main(["check", "naive", "--world-sizes", "9", "--allow-large-world", "--no-database"])


def test_plugin_refuses_a_large_world(tmp_path):
    """--paracheck-world-sizes: a pytest usage error (exit 4) naming the option, not a hang."""
    (tmp_path / "test_nothing.py").write_text("def test_nothing():\n    pass\n")
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
        + ["--paracheck-world-sizes", "1,100000", str(tmp_path / "test_nothing.py")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 4, out.stdout + out.stderr
    assert "--paracheck-world-sizes=1,100000: world size 100000" in out.stderr
    assert "--paracheck-allow-large-world" in out.stderr
