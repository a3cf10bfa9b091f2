"""Note [Exposed communication model] and the gate's explanation of a schedule change, on
hand-built schedules (no processes)."""

import pytest

from paracheck.accounting.schedule import (
    LINKS,
    Link,
    ScheduleEvent,
    StepSchedule,
    exposed_communication,
    schedule_changes,
)

ELEMS = 1000  # trainable elements, float32
TOKENS = 10


def _allreduce(phase, share, nbytes=4000, where="DDP._launch"):
    elems = int(ELEMS * share)
    return ScheduleEvent(
        "collective", "all_reduce", phase, 4 * elems, elems, where, nbytes, "float32", 2
    )


def _schedule(*events):
    return StepSchedule(tuple(events), 4 * ELEMS, ELEMS, TOKENS)


def test_exposed_time_is_latency_plus_bus_bytes_over_bandwidth_after_backward():
    """An all-reduce launched after backward is exposed whole: latency + 2(W-1)/W S / bandwidth."""
    link = Link("test", 1e9, 1e-5)
    got = exposed_communication(_schedule(_allreduce("after_backward", 1.0)), link, flops=1e12)
    assert got["exposed_s"] == pytest.approx(1e-5 + 4000 / 1e9)
    assert got["compute_s"] == pytest.approx(6 * TOKENS * ELEMS / 1e12)


def test_an_all_reduce_launched_early_in_backward_hides_behind_the_rest():
    """Launched at 0% of backward, a collective shorter than backward is not exposed at all."""
    link = Link("test", 1e12, 0.0)  # 4 ns for 4000 bytes; backward lasts 40 ns at 1e12 FLOP/s
    got = exposed_communication(_schedule(_allreduce("backward", 0.0)), link, flops=1e12)
    assert got["exposed_s"] == pytest.approx(0.0, abs=1e-18)


def test_balanced_link_exposes_all_of_naive_and_part_of_overlapped():
    """On the balanced link communication takes as long as backward: all of it exposed when
    launched after backward, half when launched in two halves at 50% and 100%."""
    naive = _schedule(_allreduce("after_backward", 1.0))
    assert exposed_communication(naive, None)["exposed_share"] == pytest.approx(1.0)
    halves = _schedule(_allreduce("backward", 0.5, 2000), _allreduce("backward", 1.0, 2000))
    assert exposed_communication(halves, None)["exposed_share"] == pytest.approx(0.5)


def test_a_wait_in_backward_stalls_compute():
    """A wait right after a launch at 0% stalls backward by the whole collective."""
    link = Link("test", 1e9, 0.0)
    launch = _allreduce("backward", 0.0)
    wait = ScheduleEvent("wait", "work.wait", "backward", 0, 0, "DDP._settle")
    got = exposed_communication(_schedule(launch, wait), link, flops=1e12)
    assert got["exposed_s"] == pytest.approx(4000 / 1e9)


def test_world_size_recosts_the_ring_factor():
    """At W = 4 an all-reduce moves 2(W-1)/W = 1.5 times its payload, against 1 at W = 2."""
    s = _schedule(_allreduce("after_backward", 1.0))
    link = Link("test", 1e9, 0.0)
    assert exposed_communication(s, link, world_size=4)["exposed_s"] == pytest.approx(
        1.5 * exposed_communication(s, link)["exposed_s"]
    )


def test_links_are_named_with_positive_bandwidth():
    assert set(LINKS) == {"nvlink-h100", "pcie4", "ethernet-100g"}
    assert all(link.bandwidth > 0 and link.latency > 0 for link in LINKS.values())


def test_bad_arguments_name_themselves():
    s = _schedule()
    with pytest.raises(ValueError, match="flops=0"):
        exposed_communication(s, LINKS["pcie4"], flops=0)
    with pytest.raises(ValueError, match="world_size=0"):
        exposed_communication(s, LINKS["pcie4"], world_size=0)


def test_changes_name_the_collective_that_moved_after_backward():
    """The gate's line for a launch that moved: which collective, and where it was."""
    base = _schedule(_allreduce("backward", 0.25), _allreduce("backward", 0.62))
    head = _schedule(_allreduce("backward", 0.25), _allreduce("after_backward", 1.0))
    assert schedule_changes("bucketed", base, head) == [
        "bucketed: all-reduce #2 launched after backward (was at 62% of gradient bytes)"
    ]


def test_changes_name_an_added_sync_and_where():
    sync = ScheduleEvent(
        "sync", "item", "after_backward", 4 * ELEMS, ELEMS, "DDP.finish_gradient_synchronization"
    )
    assert schedule_changes("flat", _schedule(), _schedule(sync)) == [
        "flat: a sync added in DDP.finish_gradient_synchronization (after backward)"
    ]


def test_an_unchanged_schedule_has_no_changes():
    s = _schedule(_allreduce("backward", 0.5))
    assert schedule_changes("x", s, s) == []
