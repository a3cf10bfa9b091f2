"""Attached mode: agents that torchrun started on two simulated nodes (two torchrun commands on
this host, --nnodes 2 --node-rank 0/1, two agents each, gloo) and one driver here, through
torchrun's own rendezvous store."""

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paracheck.check.kinds import KINDS
from paracheck.check.properties.repeatability import first_difference
from paracheck.check.property import check_target
from paracheck.check.targets import load_object, resolve_target
from paracheck.world import PoolLost, RankHang
from paracheck.world.attached import AttachedWorld
from tests.integration._attached_jobs import SKIPS_A_GRADIENT

# One pool of agents per module: its tests stay on one xdist worker (--dist loadgroup).
pytestmark = pytest.mark.xdist_group("attached")

ROOT = Path(__file__).resolve().parents[2]
JOBS = "tests.integration._attached_jobs"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _dead_port():
    """A port at which nothing answers, for as long as the block runs: bound, never listened on,
    so a connection is refused and no other process (another test's World) can take it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


def torchrun_nodes(
    port: int, log_dir: Path, *agent_args: str, per_node: int = 2
) -> list[subprocess.Popen]:
    """Two torchrun commands, nodes 0 and 1 of 2, ``per_node`` agents each, rendezvous on
    ``port``."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT), env.get("PYTHONPATH", "")])
    nodes = []
    for k in (0, 1):
        log = open(log_dir / f"node{k}.log", "w")
        nodes.append(
            subprocess.Popen(
                [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
                 "--node-rank", str(k), "--nproc-per-node", str(per_node), "--master-addr", "127.0.0.1",
                 "--master-port", str(port), "-m", "paracheck.agent", *agent_args],
                env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )
        )  # fmt: skip
    return nodes


def _end(nodes) -> list[int | None]:
    codes = []
    for n in nodes:
        try:
            codes.append(n.wait(timeout=60))
        except subprocess.TimeoutExpired:
            n.kill()
            codes.append(None)
    return codes


@pytest.fixture(scope="module")
def attached(tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("torchrun")
    port = _free_port()
    nodes = torchrun_nodes(port, log_dir, "--backend", "gloo", "--wait", "120")
    try:
        # Four agents importing torch on a busy 2-core machine can take over the default 30 s
        # to register: wait as long as they wait for a driver.
        world = AttachedWorld(f"127.0.0.1:{port}", timeout=20.0, start_timeout=120.0)
    except BaseException:
        for n in nodes:
            n.kill()
        raise
    yield world
    world.close()
    logs = "".join((log_dir / f"node{k}.log").read_text() for k in (0, 1))
    assert _end(nodes) == [0, 0], logs


def test_the_pool_spans_both_launches_and_redraws_world_sizes(attached):
    assert attached.size == 4 and attached.backend == "gloo"
    for w in (1, 2, 3, 4):
        got = attached.run(f"{JOBS}:where", None, world_size=w)
        assert [g[2:] for g in got] == [(r, w) for r in range(w)]
        assert attached.run(f"{JOBS}:sums", None, world_size=w) == [w * (w + 1) / 2] * w


KINDS_CHECKED = ("naive", "bucketed", "sharded", "zero2", "fsdp")


@pytest.mark.parametrize("name", KINDS_CHECKED)
def test_a_case_gives_the_same_bits_attached_as_on_one_host(attached, world, name):
    """The same Case, the same rank program: every record bit for bit equal."""
    target = resolve_target(name)
    strategy = load_object(KINDS[target.kind].strategy)(world_sizes=(1, 2, 3, 4))

    @settings(max_examples=4, derandomize=True, database=None, deadline=None)
    @given(st.data())
    def same(data):
        case = data.draw(strategy)
        if target.kind in ("zero", "zero2"):
            case = replace(case, zero_grad_module=True)
        job = target.job(case)
        here = world.run(target.rank_fn, job, world_size=case.world_size)
        there = attached.run(target.rank_fn, job, world_size=case.world_size)
        assert first_difference(here, there) is None, case.to_json()

    same()


@pytest.mark.parametrize("name", ["flat", "zero1", "fsdp"])
def test_built_ins_pass_at_world_sizes_one_to_four_drawn_from_one_pool(attached, name):
    report = check_target(resolve_target(name), attached, world_sizes=(1, 2, 3, 4), max_examples=8)
    assert report.passed, report.failure.describe()


def test_a_mutant_is_killed_on_attached_ranks(attached):
    from paracheck.mutants import MUTANTS
    from paracheck.selftest import mutant_target

    report = check_target(
        mutant_target(MUTANTS["ddp-no-divide"]), attached, world_sizes=(2, 3), max_examples=10
    )
    assert not report.passed


def test_a_deadlock_is_reported_with_the_stuck_stack_and_the_pool_recovers(attached):
    t0 = time.monotonic()
    with pytest.raises(RankHang) as info:
        attached.run(f"{JOBS}:one_rank_reduces_alone", None, world_size=2, timeout=10.0)
    hang = info.value
    reported = time.monotonic()
    assert hang.definite and reported - t0 < 10.0
    stuck = [f for f in hang.failures if f.kind == "hung"]
    assert [f.rank for f in stuck] == [1] and stuck[0].collective == "all_reduce", hang.report()
    assert "one_rank_reduces_alone" in stuck[0].detail
    assert "rank 1 is in its 1st all_reduce" in hang.disagreement
    # torch's flight recorder names it too, with its sizes (its number counts the group's).
    assert re.search(r"gloo:all_reduce #\d+ on default_pg, input sizes \[\[1\]\]", stuck[0].detail)
    assert attached.run(f"{JOBS}:sums", None, world_size=4) == [10.0] * 4
    assert time.monotonic() - reported <= 10.0


def test_ranks_stuck_in_python_are_interrupted_and_the_pool_recovers(attached):
    with pytest.raises(RankHang) as info:
        attached.run(f"{JOBS}:spins", None, world_size=3, timeout=3.0)
    reported = time.monotonic()
    stuck = [f for f in info.value.failures if f.kind == "hung"]
    assert [f.rank for f in stuck] == [0, 1, 2]
    assert all("in spins" in f.detail for f in stuck), info.value.report()
    assert "ranks recovered" in str(info.value)
    assert attached.run(f"{JOBS}:sums", None, world_size=4) == [10.0] * 4
    assert time.monotonic() - reported <= 10.0


def test_a_hang_mutant_is_reported_and_a_correct_target_passes_after_it_on_the_same_agents(
    attached,
):
    """The DDP that skips parameters whose local gradient is None hangs on a case where rank 1
    leaves a weight unused: reported with the stuck rank's stack, its collective and the counts;
    the agents recover, and a search of the naive DDP passes right after on the same agents."""
    from paracheck.cases import Case
    from paracheck.mutants import MUTANTS
    from paracheck.selftest import mutant_target

    mutant = mutant_target(MUTANTS["ddp-skip-none-grad"])
    case = Case.from_dict(SKIPS_A_GRADIENT)
    report = check_target(mutant, attached, world_sizes=(2,), explicit=[case], max_examples=1)
    assert [f.property for f in report.failures] == ["hang"], report.text("gloo")
    hang = report.failures[0].result.error
    assert isinstance(hang, RankHang) and hang.definite, hang
    assert "ranks recovered" in str(hang), hang
    stuck = [f for f in hang.failures if f.kind == "hung"]
    assert [f.rank for f in stuck] == [0] and stuck[0].collective == "all_reduce", hang.report()
    assert "finish_gradient_synchronization" in stuck[0].detail, hang.report()
    assert hang.disagreement.startswith("rank 0 is in its 3rd all_reduce of 1 float64 element")
    assert "rank 1 finished after 2 all_reduce" in hang.disagreement
    assert attached.lost is None
    after = check_target(
        resolve_target("naive"), attached, world_sizes=(1, 2, 3, 4), max_examples=8
    )
    assert after.passed, after.failure.describe()


def test_a_second_driver_is_refused(attached):
    with pytest.raises(RuntimeError, match="already serve another driver"):
        AttachedWorld(attached.address, timeout=5.0, start_timeout=5.0)


def test_a_check_started_on_every_rank_by_torchrun_is_refused(monkeypatch, capsys, no_world):
    from paracheck.cli import main

    for name, value in (("RANK", "1"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "1")):
        monkeypatch.setenv(name, value)
    assert main(["check", "naive", "--max-examples", "1"]) == 2
    err = capsys.readouterr().err
    assert "does not run Hypothesis on every rank in lock-step" in err
    assert "--attach MASTER_ADDR:MASTER_PORT" in err


@pytest.mark.parametrize(
    "args, says",
    [
        (["--attach", "no-port"], "--attach='no-port' must be HOST:PORT"),
        (["--attach", "127.0.0.1:1", "--rank-memory", "2"], "--rank-memory=2.0 does not apply"),
    ],
)
def test_attach_refuses_bad_values_naming_them(capsys, no_world, args, says):
    from paracheck.cli import main

    assert main(["check", "naive", *args]) == 2
    assert says in capsys.readouterr().err


@pytest.fixture
def no_world(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("a World was started for a usage error")

    monkeypatch.setattr("paracheck.world.World.__init__", refuse)


def agent_zero_checks(tmp_path, *check_args: str) -> tuple[list, list[str]]:
    """``torchrun ... -m paracheck.agent -- check ARGS`` on two nodes of one agent each: every
    node's exit code and output."""
    nodes = torchrun_nodes(
        _free_port(), tmp_path, "--backend", "gloo", "--", "check", *check_args, per_node=1
    )
    codes = _end(nodes)
    return codes, [(tmp_path / f"node{k}.log").read_text() for k in (0, 1)]


def test_agent_zero_runs_the_driver_and_every_node_ends_with_its_verdict(tmp_path):
    """``torchrun ... -m paracheck.agent -- check TARGET``: one line, two nodes, one verdict."""
    codes, logs = agent_zero_checks(tmp_path, "flat", "--max-examples", "4")
    assert codes == [0, 0], logs
    assert "PASS flat: verdict table of " in logs[0] and "world sizes [1, 2]" in logs[0], logs[0]
    assert "rank 1/2: stopped by the driver" in logs[1], logs[1]


def test_agents_end_when_the_driver_agent_zero_started_fails_to_attach(tmp_path):
    codes, logs = agent_zero_checks(tmp_path, "flat", "--world-sizes", "3")
    assert codes[0] != 0 and codes[1] != 0, logs
    assert "world size 3 exceeds the 2 agents" in logs[0], logs[0]
    assert "exited (2) before attaching" in logs[1], logs[1]


@pytest.mark.slow  # a torchrun job of its own, ended by the death: about a minute on 2 cores
def test_an_agent_that_dies_ends_the_check_with_its_verdict_and_one_line(tmp_path):
    """An agent gone mid-case (torchrun ends its job): the death is the target's verdict, the
    check says the torchrun job must be started again and checks no further target; no
    traceback."""
    codes, logs = agent_zero_checks(
        tmp_path, f"{JOBS}:ExitsOnRankOne", "naive", "--world-sizes", "2", "--no-database"
    )
    assert codes[0] == 1, logs
    assert f"FAIL {JOBS}:ExitsOnRankOne: 1 failing property (died)" in logs[0], logs[0]
    assert "note: the check stopped here: the agents at" in logs[0], logs[0]
    line = re.search(r"^paracheck: the agents at \S+ cannot run another case.*$", logs[0], re.M)
    assert line is not None, logs[0]
    assert "agent(s) [1] are gone" in line[0] and line[0].endswith(
        "start the torchrun job again (not checked: naive)"
    ), line[0]
    assert f'File "{ROOT / "src"}' not in logs[0], logs[0]  # no traceback of paracheck's


def test_attach_to_a_dead_address_is_refused_within_its_timeout(capsys, no_world):
    from paracheck.cli import main

    with _dead_port() as port:
        t0 = time.monotonic()
        code = main(["check", "naive", "--attach", f"127.0.0.1:{port}", "--attach-timeout", "2"])
        assert code == 2
        assert time.monotonic() - t0 < 60.0
    err = capsys.readouterr().err
    assert f"--attach='127.0.0.1:{port}': no torchrun job answers there within 2 s" in err, err
    assert f"--master-port {port} -m paracheck.agent" in err, err
    assert "Traceback" not in err and "frame #" not in err, err


@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_ends_a_driver_still_connecting(monkeypatch, no_world, signum, code):
    """Ctrl-C or SIGTERM while the driver waits for a torchrun job: it ends at once, not when
    --attach-timeout (here 120 s) runs out."""
    from paracheck.cli import main
    from paracheck.world import attached

    waiting = threading.Event()
    listening = attached._listening

    def watched(*args):
        waiting.set()
        return listening(*args)

    def send() -> None:
        waiting.wait(60.0)
        os.kill(os.getpid(), signum)

    monkeypatch.setattr(attached, "_listening", watched)
    # A shell without job control starts its background commands with SIGINT ignored, and Python
    # keeps an inherited SIG_IGN (so does the CLI, as users of nohup and & expect): Ctrl-C's
    # default here, unblocked, however the test run was started. (Once, in a full run, the SIGINT
    # case waited out its 120 s with the SIGTERM case passing beside it.)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    try:
        threading.Thread(target=send, daemon=True).start()
        t0 = time.monotonic()
        with _dead_port() as port:
            address = f"127.0.0.1:{port}"
            assert main(["check", "naive", "--attach", address, "--attach-timeout", "120"]) == code
        assert time.monotonic() - t0 < 60.0
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        signal.signal(signal.SIGINT, previous)


class _LostAgents:
    """The part of an AttachedWorld a check uses, for agents already lost (Note [A lost pool])."""

    backend, timeout, size = "gloo", 20.0, 2
    lost = "the agents at 127.0.0.1:1 cannot run another case (agent(s) [1] are gone)"

    def submit(self, *args, **kwargs):
        raise PoolLost(self.lost)

    def close(self) -> None:
        pass


def test_agents_lost_before_a_target_is_judged_give_no_verdict_and_exit_2(monkeypatch, capsys):
    """A target on which nothing was found before the agents were lost has no verdict: no PASS,
    the one line naming what was not checked, exit 2."""
    import json

    from paracheck.cli import main

    monkeypatch.setattr("paracheck.cli._check_options._attached_pool", lambda args: {"size": 2})
    monkeypatch.setattr("paracheck.cli.check._make_world", lambda *a, **k: _LostAgents())
    case = json.dumps(SKIPS_A_GRADIENT)
    assert main(["check", "naive", "flat", "--attach", "127.0.0.1:1", "--case", case]) == 2
    out, err = capsys.readouterr()
    assert "PASS" not in out and "FAIL" not in out, out
    assert err.strip().endswith(
        "paracheck: the agents at 127.0.0.1:1 cannot run another case (agent(s) [1] are gone) "
        "(not checked: naive, flat)"
    ), err
