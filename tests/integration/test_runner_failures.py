"""The runner reports a raising, hanging or dying rank by rank, then keeps serving cases."""

import sys
import time

import pytest

from paracheck.world import RankDied, RankError, RankHang, World

JOBS = """
import os
import torch
import torch.distributed as dist

def ok(_):
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    return dist.get_world_size(), t.item()

def raise_on_1(_):
    if dist.get_rank() == 1:
        raise ValueError("planted failure on rank 1")
    t = torch.ones(3)
    dist.all_reduce(t)

def mismatched_collectives(_):
    # rank 0 issues one all-reduce more than rank 1: the classic DDP hang.
    t = torch.ones(3)
    dist.all_reduce(t)
    if dist.get_rank() == 0:
        dist.all_reduce(t)

def extra_on_1_of_3(_):
    # rank 1 issues a seventh all-reduce that ranks 0 and 2 never join; they return.
    t = torch.ones(3)
    for _ in range(6):
        dist.all_reduce(t)
    print(f"rank {dist.get_rank()} says hello")
    if dist.get_rank() == 1:
        dist.all_reduce(t)

def sizes_differ_on_1(n):
    # rank 1 passes one element more to the same all-reduce.
    t = torch.ones(n + (dist.get_rank() == 1))
    dist.all_reduce(t)

def kinds_differ_on_1(_):
    # rank 0 broadcasts where rank 1 all-reduces a tensor of the same size and dtype: the first
    # collective of each, never matched, and neither rank raises (gloo waits in both).
    if dist.get_rank() == 0:
        dist.broadcast(torch.ones(4, dtype=torch.float64), src=0)
    else:
        dist.all_reduce(torch.ones(4, dtype=torch.float64))


def spin_on_1(_):
    if dist.get_rank() == 1:
        while True:
            pass

def exit_on_1(_):
    if dist.get_rank() == 1:
        os._exit(7)
    t = torch.ones(3)
    dist.all_reduce(t)

def print_lines(_):
    r = dist.get_rank()
    for i in range(100):
        print(f"python line {i} from rank {r}")
        os.write(1, f"fd line {i} from rank {r}\\n".encode())

def segv_on_0(_):
    if dist.get_rank() == 0:
        import ctypes
        ctypes.string_at(0)

class Held:
    # Pickled (sent to the driver) only once the file `path` exists: the rank's status says
    # "returned" long before its answer arrives.
    def __init__(self, path):
        self.path = path
    def __reduce__(self):
        import time
        while not os.path.exists(self.path):
            time.sleep(0.01)
        return (int, (7,))

def answer_when(path):
    t = torch.ones(1)
    dist.all_reduce(t)
    return Held(path)

def sleep_on_1(_):
    import time
    if dist.get_rank() == 1:
        time.sleep(1e6)
    dist.all_reduce(torch.ones(3))

def busy_on_1(seconds):
    # Rank 1 computes outside any collective for `seconds`, its peer waits in an all-reduce.
    import time
    if dist.get_rank() == 1:
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            pass
    t = torch.ones(1)
    dist.all_reduce(t)
    return t.item()
"""


@pytest.fixture(scope="module")
def small_world(tmp_path_factory):
    d = tmp_path_factory.mktemp("jobs")
    (d / "paracheck_test_jobs.py").write_text(JOBS)
    sys.path.insert(0, str(d))
    w = World(3, timeout=3.0)
    yield w
    w.close()
    sys.path.remove(str(d))


def _healthy(world):
    assert world.run("paracheck_test_jobs:ok", None, world_size=3) == [(3, 6.0)] * 3


def test_world_serves_every_size_up_to_its_own(small_world):
    """One pool runs world sizes 1..3 with a default group of exactly that size."""
    for w, total in ((1, 1.0), (2, 3.0), (3, 6.0), (2, 3.0)):
        assert small_world.run("paracheck_test_jobs:ok", None, world_size=w) == [(w, total)] * w


def test_raising_rank_reports_its_traceback_and_pool_survives(small_world):
    """A rank that raises fails the job with that rank's traceback first; the next job passes."""
    t0 = time.monotonic()
    with pytest.raises(RankError) as info:
        small_world.run("paracheck_test_jobs:raise_on_1", None, world_size=2)
    assert time.monotonic() - t0 < small_world.timeout
    first = info.value.failures[0]
    assert first.rank == 1 and "planted failure on rank 1" in first.detail
    _healthy(small_world)


def test_mismatched_collectives_reported_as_hang_with_collective(small_world):
    """A hang names the stuck rank, its stack and the collective; ranks recover without respawn."""
    pids = small_world.pids
    t0 = time.monotonic()
    with pytest.raises(RankHang) as info:
        small_world.run("paracheck_test_jobs:mismatched_collectives", None, world_size=2)
    elapsed = time.monotonic() - t0
    assert elapsed < small_world.timeout * 1.2 + 4.5
    hung = [f for f in info.value.failures if f.kind == "hung"]
    assert [f.rank for f in hung] == [0]
    assert hung[0].collective == "all_reduce"
    assert "mismatched_collectives" in hung[0].detail
    _healthy(small_world)
    assert small_world.pids == pids  # recovered in place


def test_deadlock_is_reported_before_the_timeout_with_each_ranks_collective_count(small_world):
    """A rank in a collective its returned peers never issued is a certain deadlock: reported with the counts."""
    pids = small_world.pids
    with pytest.raises(RankHang) as info:
        small_world.run("paracheck_test_jobs:extra_on_1_of_3", None, world_size=3)
    hang = info.value
    assert hang.definite and hang.seconds < small_world.timeout
    assert (
        hang.disagreement
        == "rank 1 is in its 7th all_reduce of 3 float32 elements; ranks 0, 2 finished after 6 "
        "all_reduce"
    )
    hung = [f for f in hang.failures if f.kind == "hung"]
    assert [f.rank for f in hung] == [1] and "rank 1 says hello" in hung[0].output
    _healthy(small_world)
    assert (
        small_world.pids == pids
    )  # the finished ranks dropped their group: rank 1 recovered in place


@pytest.mark.parametrize("n", [1, 3, 1000])
def test_a_collective_given_tensors_of_different_sizes_is_named(small_world, n):
    """Rank 1 passes one element more to the same all-reduce. gloo then waits on both ranks
    (n=1), returns on one and waits on the other (n=3), or aborts one process (n=1000): the
    report names each rank's size, and a wait is a certain deadlock, reported at once (Note
    [Definite deadlock])."""
    with pytest.raises((RankHang, RankDied)) as info:
        small_world.run("paracheck_test_jobs:sizes_differ_on_1", n, world_size=2)
    err = info.value
    assert err.disagreement.startswith("their 1st all_reduce got tensors of different sizes: ")
    assert f" {n} float32 element" in err.disagreement
    assert f" {n + 1} float32 elements" in err.disagreement
    if isinstance(err, RankHang):
        assert err.definite
    _healthy(small_world)


def test_ranks_inside_collectives_of_different_kinds_are_a_definite_deadlock(small_world):
    """A broadcast on rank 0 where rank 1 is in an all_reduce, each its first collective: reported
    at once as a deadlock, not after the stall window (Note [Definite deadlock])."""
    with pytest.raises(RankHang) as info:
        small_world.run("paracheck_test_jobs:kinds_differ_on_1", None, world_size=2)
    hang = info.value
    assert hang.definite, hang.report()
    assert hang.disagreement == (
        "rank 0 is in its 1st broadcast of 4 float64 elements from rank 0; "
        "rank 1 is in its 1st all_reduce of 4 float64 elements"
    )
    assert not hang.stalled, hang.report()  # found by the counts, not by the stall window
    _healthy(small_world)


def test_python_level_hang_kills_and_restarts(small_world):
    """A rank stuck outside any collective is killed; the pool restarts and serves the next job.
    A spinning rank runs, so nothing proves it hung: the job runs once more on fresh ranks before
    the hang is reported (rank 1 replaced, ranks 0 and 1 for the second run, rank 1 again)."""
    restarts = small_world.restarts
    with pytest.raises(RankHang) as info:
        small_world.run("paracheck_test_jobs:spin_on_1", None, world_size=2)
    assert [f.rank for f in info.value.failures if f.kind == "hung"] == [1]
    assert "spin_on_1" in info.value.failures[0].detail
    assert info.value.rerun and not info.value.confirmed
    assert "run again on fresh ranks" in str(info.value)
    assert small_world.restarts == restarts + 3
    _healthy(small_world)


def test_printing_job_output_is_captured_per_rank(small_world, capfd):
    """A job's prints come back per rank (World.last_outputs), not on the driver's terminal."""
    small_world.run("paracheck_test_jobs:print_lines", None, world_size=2)
    assert "from rank" not in capfd.readouterr().out
    out = small_world.last_outputs
    assert out[0].startswith("python line 0 from rank 0") and "fd line 99 from rank 0" in out[0]
    assert "more lines) ..." in out[1] and len(out[1].splitlines()) <= 31


@pytest.mark.parametrize(
    "job,rank,text", [("exit_on_1", 1, "exited with code 7"), ("segv_on_0", 0, "SIGSEGV")]
)
def test_dying_rank_reported_with_exit_code_or_signal(small_world, job, rank, text):
    """A rank that dies is reported with its exit code or signal; the pool is restarted."""
    with pytest.raises(RankDied) as info:
        small_world.run(f"paracheck_test_jobs:{job}", None, world_size=2)
    dead = info.value.failures
    assert dead[0].rank == rank and text in dead[0].detail
    _healthy(small_world)


def test_bad_world_size_is_refused(small_world):
    """A world size outside 1..size is a usage error naming the value."""
    with pytest.raises(ValueError, match="world_size=4"):
        small_world.run("paracheck_test_jobs:ok", None, world_size=4)
    with pytest.raises(ValueError, match="size=0"):
        World(0)


def _finished(world, ranks):
    """Whether every rank of ``ranks`` says, in its status file, that it finished the last job."""
    for r in ranks:
        st = world.pool.status(r)
        if st is None or st.get("job") != world.job or st["state"] == "running":
            return False
    return True


def test_answers_sent_before_the_driver_comes_back_are_results_not_a_hang(small_world):
    """The driver busy past a job's deadline (computing the oracle) finds its ranks' answers in
    the pipes: the job's results, not a hang (Note [Timeout verdicts])."""
    ticket = small_world.submit("paracheck_test_jobs:ok", None, world_size=2, timeout=0.5)
    while not _finished(small_world, [0, 1]):
        time.sleep(0.01)
    time.sleep(max(0.0, ticket[3] - time.monotonic()) + 0.1)  # past the deadline
    assert small_world.collect(ticket) == [(2, 3.0)] * 2


def test_a_rank_that_finished_is_waited_for_until_its_answer_arrives(small_world, tmp_path):
    """A rank whose status says it returned, but whose answer comes after the job's deadline and
    after the World's timeout, is waited for: its result, not a hang (Note [Timeout verdicts])."""
    import threading

    go = tmp_path / "go"
    ticket = small_world.submit(
        "paracheck_test_jobs:answer_when", str(go), world_size=2, timeout=0.5
    )

    def release():
        while not _finished(small_world, [0, 1]):
            time.sleep(0.01)
        time.sleep(max(0.0, ticket[3] - time.monotonic()) + small_world.timeout)
        go.touch()

    thread = threading.Thread(target=release)
    thread.start()
    try:
        assert small_world.collect(ticket) == [7, 7]
    finally:
        go.touch()
        thread.join()


def test_a_rank_busy_outside_collectives_past_the_case_timeout_is_not_a_hang(small_world):
    """A rank that computes (uses a CPU) past its case's timeout, its peer waiting in a
    collective, is slow, not hung: the job waits up to the World's timeout."""
    assert small_world.run("paracheck_test_jobs:busy_on_1", 2.0, world_size=2, timeout=0.3) == [
        2.0,
        2.0,
    ]


def test_a_stalled_rank_is_reported_before_the_timeout_and_not_run_again(small_world, monkeypatch):
    """A rank that sleeps, its peer waiting for it in a collective: no rank of the job runs, so
    it is a stall, reported after ``stall_seconds``, not the timeout, and not run again (on a
    machine with one runnable process per CPU: Note [Too slow to judge])."""
    from paracheck.world import _collect

    monkeypatch.setattr(_collect, "load_per_cpu", lambda: 1.0)
    small_world.stall_seconds = 1.0
    try:
        with pytest.raises(RankHang) as info:
            small_world.run("paracheck_test_jobs:sleep_on_1", None, world_size=2)
    finally:
        del small_world.stall_seconds  # the class's value again
    hang = info.value
    assert hang.stalled and not hang.rerun and hang.seconds < small_world.timeout
    assert "stalled on rank(s) [0, 1]" in str(hang)
    assert "rank 0 is in its 1st all_reduce" in hang.disagreement
    _healthy(small_world)


def test_a_stall_on_an_overloaded_machine_is_run_again_before_it_is_reported(
    small_world, monkeypatch
):
    """The same stall with more than two runnable processes per CPU at the verdict (Note [Too
    slow to judge]): run again on fresh ranks, and reported where it stalls again."""
    from paracheck.world import _collect

    monkeypatch.setattr(_collect, "load_per_cpu", lambda: 7.5)
    small_world.stall_seconds = 1.0
    try:
        with pytest.raises(RankHang) as info:
            small_world.run("paracheck_test_jobs:sleep_on_1", None, world_size=2)
    finally:
        del small_world.stall_seconds
    hang = info.value
    assert hang.stalled and hang.rerun and hang.confirmed
    assert "after it first stalled at" in str(hang) and "7.5 runnable processes" in str(hang)
    assert hang.too_slow() is None  # a stall, twice: reported whatever the load
    _healthy(small_world)


def test_a_dead_ranks_peer_keeps_its_traceback_of_the_call_they_shared(small_world):
    """Rank 1 exits while rank 0 waits in the all-reduce of ``exit_on_1``: the death's error
    keeps rank 0's traceback after the death, naming that line (Note [A death's peers])."""
    with pytest.raises(RankDied) as info:
        small_world.run("paracheck_test_jobs:exit_on_1", None, world_size=2)
    failures = info.value.failures
    assert [(f.rank, f.kind) for f in failures] == [(1, "died"), (0, "raised")], failures
    assert "in exit_on_1" in failures[1].detail and "dist.all_reduce(t)" in failures[1].detail
    assert "Traceback" not in str(info.value), str(info.value)  # its message: the deaths
    _healthy(small_world)
