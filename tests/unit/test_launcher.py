"""The launcher thread of Note [Launching off the autograd thread] (``paracheck.ddp._launch``):
calls made in the order queued, results and errors handed to the waiter, and launches kept on
the calling thread wherever a mode watches them or the group is not NCCL."""

import threading

import pytest
import torch

from paracheck.accounting.record import Recorder
from paracheck.ddp import _launch


def test_calls_run_in_order_on_another_thread_and_hand_back_their_results():
    launcher = _launch.Launcher()
    seen, threads = [], set()

    def call(i):
        seen.append(i)
        threads.add(threading.get_ident())
        return i * i

    pending = [launcher.submit(call, i) for i in range(50)]
    assert [p.work() for p in pending] == [i * i for i in range(50)]
    assert seen == list(range(50))
    assert threads and threading.get_ident() not in threads


def test_an_error_is_raised_by_the_waiter_and_later_calls_still_run():
    launcher = _launch.Launcher()

    def fail():
        raise RuntimeError("NCCL error: unhandled system error")

    class Work:
        waited = False

        def wait(self):
            Work.waited = True
            return True

    bad = launcher.submit(fail)
    good = launcher.submit(Work)
    with pytest.raises(RuntimeError, match="unhandled system error"):
        bad.wait()
    assert good.wait() is True and Work.waited


def test_launches_stay_on_the_calling_thread_under_a_mode_or_where_not_enabled():
    assert _launch.launcher_for(False) is None
    assert isinstance(_launch.launcher_for(True), _launch.Launcher)
    with Recorder(track_memory=False):
        assert _launch.launcher_for(True) is None
    with torch.device("cpu"):  # a function mode
        assert _launch.launcher_for(True) is None
    saved, _launch.ENABLED = _launch.ENABLED, False
    try:
        assert _launch.launcher_for(True) is None
    finally:
        _launch.ENABLED = saved


def test_cpu_tensors_and_gloo_groups_do_not_use_it():
    assert not _launch.uses_launcher(torch.zeros(2), None)
