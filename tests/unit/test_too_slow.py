"""Note [Too slow to judge]: a job whose ranks still ran at its second timeout, on a machine with
more than two runnable processes per CPU, is skipped, not called a hang; a deadlock, a stall, a
first timeout or a spinning rank on a machine not so loaded is still a hang."""

import time

from paracheck.cases import Case
from paracheck.check.run import _raised
from paracheck.world._failures import OVERLOADED, RankFailure, RankHang


def _hang(*, rerun=True, progressing=True, load=7.5, definite=False, stalled=False):
    hang = RankHang(
        "run_ddp (world size 4) did not finish within 20.9 s on rank(s) [0, 1, 2, 3]",
        [RankFailure(r, "hung", "(no stack)") for r in range(4)],
        definite=definite,
        stalled=stalled,
        progressing=progressing,
        load=load,
    )
    hang.rerun = rerun
    hang.limit = 20.0 if rerun else None
    return hang


def test_a_second_timeout_still_running_on_an_overloaded_machine_is_skipped():
    result = _raised(Case(world_size=4, batch_sizes=(1, 1, 1, 1)), _hang(), time.monotonic())
    assert result.ok and result.error is None
    why = result.extra["skipped"]
    assert "20 s timeout twice" in why and "7.5 runnable processes per CPU" in why
    assert "--timeout" in why


def test_every_other_timeout_is_a_hang():
    for hang in (
        _hang(rerun=False),  # a first timeout is run again, not skipped
        _hang(progressing=False),  # no rank ran or communicated in its last second
        _hang(load=OVERLOADED / 2),  # a machine not overloaded: a spinning rank is a hang
        _hang(load=None),  # the load unknown
        _hang(definite=True),  # a deadlock, whatever the load
        _hang(stalled=True),  # a stall, whatever the load
    ):
        result = _raised(Case(world_size=4, batch_sizes=(1, 1, 1, 1)), hang, time.monotonic())
        assert result.error is hang and not result.ok
