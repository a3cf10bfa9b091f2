"""Each rank's memory cap (Note [Rank memory cap]): its default, and how a rank that stopped
itself over it is read back."""

from __future__ import annotations

import json
import os

from paracheck.world._rank import memory_record_path

# Note [Rank memory cap]
#   A target that keeps tensors alive (a list appended every step) grows without limit in a
#   persistent rank until the kernel's OOM killer kills some process: reported as "killed by
#   signal SIGKILL", or as flaky where the replayed case ran on a fresh process and survived. So
#   each rank watches its own resident memory while a job runs (a thread reads /proc/self/statm
#   every 50 ms; RLIMIT_AS does not work with torch, which reserves far more address space than
#   it touches) and stops itself with SIGKILL past the cap the job was sent with, after writing
#   the memory, the cap and the step its job is in (``set_step``, called by the check's training
#   loops) to ``rank<r>.memory``. The driver reports that as ``RankOverMemory``, "rank r
#   exceeded N GB at step s": a resource failure, not a wrong result. ``set_step`` also checks
#   the memory at each step's start, so that a step that ended over the cap is the one named:
#   the thread alone could see it only after the next step began.
#   What is watched is resident *anonymous* memory (RSS less the pages of files and shared
#   memory): a rank's tensors and objects. The pages of torch's libraries are not the target's,
#   and they differ between processes: a rank forked by the zygote maps 130 MB fewer of them
#   than a started one (measured: RSS 0.23 against 0.36 GB, anonymous 0.22 GB for both), so with
#   RSS the step at which a case passes the cap depended on how its rank was started.
#   Memory a process kept from earlier jobs (a module-level list, a cache, freed memory the
#   allocator kept) counts too, but is not the job's doing, and a job's verdict must not depend
#   on the jobs before it. So a job that exceeds the cap on a process that served earlier jobs
#   is run once more with every rank of it on a fresh process, and only a job over the cap from
#   fresh processes is reported: the same case replayed is over it again, at the same step.
#   The default cap (``default_rank_memory``) is an equal share of the machine's memory (the
#   physical memory, or the cgroup's limit where lower) among the ranks and the driver,
#   total / (size + 1), and at least 1 GiB (a rank holds about 0.22 GB of its own once torch is
#   imported): a rank past it, were its peers the same, would leave the machine without memory,
#   while a check's cases need a few MB each.


def _machine_memory() -> int:
    """Bytes of memory this process may use: physical memory, or its cgroup's limit if lower."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    limits = []
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        lines = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # cgroup v2
            limits.append(f"/sys/fs/cgroup{path.rstrip('/')}/memory.max")
        elif "memory" in controllers.split(","):
            limits.append(f"/sys/fs/cgroup/memory{path.rstrip('/')}/memory.limit_in_bytes")
            limits.append("/sys/fs/cgroup/memory/memory.limit_in_bytes")
    for path in limits:
        try:
            with open(path) as f:
                total = min(total, int(f.read().strip()))
        except (OSError, ValueError):  # absent, or "max"
            pass
    return total


def default_rank_memory(size: int) -> float:
    """The default memory cap of each of ``size`` ranks, in GB (2**30 bytes): an equal share of
    the machine's memory among the ranks and the driver, at least 1 (Note [Rank memory cap])."""
    return max(1.0, _machine_memory() / (size + 1) / 2**30)


def gb(n: float) -> str:
    return f"{n / 2**30:.3g} GB"


def exceeded(record: dict) -> str:
    """The words "exceeded 0.5 GB at step 3", from a rank's memory record (Note [Rank memory
    cap])."""
    step = record.get("step")
    return f"exceeded {gb(record.get('cap', 0))}" + (f" at step {step}" if step is not None else "")


def memory_record(stack_dir: str, rank: int, job: int) -> dict | None:
    """The memory record rank ``rank`` wrote when it stopped itself over its cap during job
    ``job`` (Note [Rank memory cap]); None where it did not (it died otherwise)."""
    try:
        with open(memory_record_path(stack_dir, rank)) as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
    return record if record.get("job") == job else None
