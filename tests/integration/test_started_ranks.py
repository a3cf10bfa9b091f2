"""No hang is judged before every rank of a job started the job's code (Note [Started ranks]):
a job whose ranks are still creating their group or importing is slow, not stuck; a real hang
is still reported once they all started."""

import sys
import threading
import time

import pytest

from paracheck.world import RankHang, World
from paracheck.world._failures import WorldStartError
from paracheck.world._watch import Watch

# -- the watch alone, on statuses the test writes ----------------------------------------------


class _FakePool:
    """What ``Watch`` reads of a pool: statuses set by the test, ranks that use no CPU."""

    def __init__(self, statuses):
        self.statuses = statuses

    def status(self, rank):
        return self.statuses.get(rank)

    def activity(self, rank):
        return (0, False)

    def alive(self, rank):
        return True


def _watch(statuses, job, w):
    """A watch over ``statuses`` for which any rank idle at all is a stall (a window of 0 s),
    once every rank started."""
    return Watch(_FakePool(statuses), job, w, stall_seconds=0.0)


def _running(job, total, inside=None, sized=None):
    return {
        "job": job,
        "state": "running",
        "inside": inside,
        "inside_index": total,
        "sized": sized,
        "total": total,
        "world_total": total,
        "counts": {"all_reduce": total},
        "step": None,
        "began_ns": time.time_ns(),
    }


def test_no_deadlock_proof_while_a_rank_has_not_started():
    """Rank 0 finished after one all_reduce and rank 1 waits in its second: a definite deadlock
    by the counts, unless rank 2 has not started the job, whose collectives may still come."""
    done = dict(_running(5, 1), state="returned")
    statuses = {0: done, 1: _running(5, 2, inside="all_reduce")}
    watch = _watch(statuses, 5, 3)
    for _ in range(3):
        assert watch.began(time.monotonic()) is None
        watch.poll([1, 2])
        assert not watch.deadlocked([0], [1, 2])
    statuses[2] = _running(5, 2, inside="all_reduce")
    assert watch.began(time.monotonic()) is not None
    assert [watch.deadlocked([0], [1, 2]) for _ in range(2)] == [False, True]


def test_no_stall_while_a_rank_has_not_started():
    """No rank uses a CPU and the stall window is 0 s: a stall, but only once every rank of the
    job started; a status of an earlier job is not a start."""
    statuses = {0: _running(7, 1, inside="all_reduce"), 1: _running(6, 3)}
    watch = _watch(statuses, 7, 2)
    watch.poll([0, 1])
    assert watch.began(time.monotonic()) is None
    assert not watch.stalled([0, 1])
    statuses[1] = _running(7, 0)
    watch.poll([0, 1])
    assert watch.began(time.monotonic()) is not None
    assert watch.stalled([0, 1])


def test_a_start_is_read_on_the_drivers_clock_within_the_job():
    """A rank's start, written on its wall clock, is kept between the submission and now (an
    attached rank's clock may be off)."""
    since = time.monotonic()
    early = dict(_running(3, 0), began_ns=time.time_ns() - 10**12)  # 1000 s ago
    watch = _watch({0: early}, 3, 1)
    assert since <= watch.began(since) <= time.monotonic()


# -- a World whose rank 1 starts the job only when the test lets it ------------------------------

# Imported by each rank when the job runs, before the job's code starts: the ranks wait, using
# no CPU to speak of, until the test creates a file (a group's creation or an import that waits).
LATE = """
import os
import time

import torch
import torch.distributed as dist

while not os.path.exists({go!r}):
    time.sleep(0.05)

def ok(_):
    t = torch.ones(1)
    dist.all_reduce(t)
    return t.item()

def block_on_1(go):
    # Rank 1 waits inside the job's code, rank 0 waits for it in an all_reduce.
    if dist.get_rank() == 1:
        while not os.path.exists(go):
            time.sleep(0.05)
    dist.all_reduce(torch.ones(1))
"""


@pytest.fixture(scope="module")
def late_world(tmp_path_factory):
    d = tmp_path_factory.mktemp("late_jobs")
    for name in ("late_a", "late_b"):
        (d / f"paracheck_{name}.py").write_text(LATE.format(go=str(d / f"{name}.go")))
    sys.path.insert(0, str(d))
    # The group's timeout (from the World's) outlasts rank 1's late start; the cases' are 0.5 s.
    w = World(2, timeout=30.0)
    w.stall_seconds = 0.5
    yield w, d
    w.close()
    sys.path.remove(str(d))


def test_a_rank_that_starts_late_is_slow_not_hung(late_world):
    """The ranks start the job only when the test lets them, well after the stall window and the
    case's timeout measured from the submission: the job's result, not a hang; then a rank that
    blocks inside the job's code is still a stall."""
    world, d = late_world
    ticket = world.submit("paracheck_late_a:ok", None, world_size=2, timeout=0.5)

    def release():
        # Well past what a judge counting from the submission allowed (a stall, the timeout).
        time.sleep(max(0.0, ticket[3] - time.monotonic()) + world.stall_seconds + 2.0)
        (d / "late_a.go").touch()

    thread = threading.Thread(target=release, daemon=True)
    thread.start()
    assert world.collect(ticket) == [2.0, 2.0]
    thread.join()
    with pytest.raises(RankHang) as info:
        world.run("paracheck_late_a:block_on_1", str(d / "never.go"), world_size=2, timeout=0.5)
    assert info.value.stalled
    assert "rank 0 is in its 1st all_reduce" in info.value.disagreement


def test_a_job_whose_ranks_never_start_is_no_verdict_on_the_target(late_world):
    """The ranks never start the job: paracheck could not run it (``WorldStartError``), not a
    hang; the pool is restarted and serves the next job."""
    world, d = late_world
    world.begin_timeout = 2.0
    try:
        with pytest.raises(WorldStartError, match=r"rank\(s\) \[0, 1\] did not start"):
            world.run("paracheck_late_b:ok", None, world_size=2, timeout=0.5)
    finally:
        del world.begin_timeout
    (d / "late_b.go").touch()  # the restarted ranks import the module again: let them through
    assert world.run("paracheck_late_b:ok", None, world_size=2) == [2.0, 2.0]
