"""What the driver reads of the ranks while a job is late: their collective counts and activity
(``Watch``, through the pool's methods: ``paracheck.world._pool.Pool``), whether they are deadlocked (Note [Definite deadlock]), and the sentence a hang or
death report gives of what they disagree on (``describe_disagreement``, ``describe_death``)."""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from paracheck.world._pool import Pool

# Note [Definite deadlock]
#   Every rank of a correct program issues the same sequence of collectives on a group. So when a
#   rank of the job has returned after issuing n collectives on the default group, and every rank
#   still running is blocked inside a collective (or a Work.wait) after issuing more than n, those
#   collectives can never complete: the job is deadlocked, whatever the timeout. The driver checks
#   this every 0.1 s while some ranks have answered, and needs it on two polls in a row (a wait
#   on an earlier, matched collective completes in between). It reports such a hang at once;
#   other late jobs (every rank still running, or a rank busy outside any collective) are reported
#   at their timeout. The counts are also what the hang report says the ranks disagree on.
#
#   The same holds, with no rank finished, when every rank of the job is inside the same
#   collective on the default group (its n-th, of one kind) and that collective is one whose
#   tensor must be the same on every rank (``SIZED``: all_reduce, broadcast, reduce) but the
#   ranks passed tensors of different sizes or dtypes: it cannot complete correctly on any
#   backend (gloo aborts a rank or waits; NCCL waits for the missing elements). So does a job
#   whose running ranks are all inside their n-th collective on the default group, each its last
#   ``SIZED`` one, and those are not of one kind (a broadcast on one rank, an all_reduce on
#   another): the n-th collective of a correct program is the same on every rank. Without this,
#   such a job was a stall at best (3 s of no progress; measured 4 s a case with the rank's
#   recovery), and on NCCL or attached ranks, which are never judged stalled, a timeout run twice.
#   Polled the same way once a job has run for half a second.

# Note [Started ranks]
#   A rank starts a job's code when its status record names the job (``CollectiveCounter.begin``,
#   just before it calls the job's function); before that it creates the job's process group,
#   which waits for every rank of the job, and imports the job's function. On two cores shared
#   with other checks and busy processes that took seconds, with no rank running the job's code,
#   and a watch that judged the job from its submission called it a stall 3.7 s in, with each
#   rank "not started": a hang the target was told to fix. A job that has not started is slow,
#   not stuck. So nothing is judged of a job before every rank of it started: no deadlock, no
#   stall, and the case's timeout counts from the moment the last rank started (its record's
#   ``began_ns``, on the driver's clock: ``Watch.began``), not from the submission. A job whose
#   ranks do not all start within the World's ``begin_timeout`` (default: its ``start_timeout``)
#   is no verdict on the target either: paracheck could not start it (``WorldStartError``),
#   unless a rank of it has already failed, which is the job's verdict, judged from the
#   submission as before. The job's function is imported before the group's rendezvous, so that
#   a rank slow to import it keeps its peers there, not inside their first collective.
_RUNNING = 0.02  # the share of one CPU above which a rank counts as running


def process_activity(pid: int) -> tuple[int, bool] | None:
    """The CPU time (ns) the threads of process ``pid`` used, and whether one of them is in an
    uninterruptible wait (a disk) now; None where /proc cannot say. (Whether one is running is no
    sign: an idle rank's watchdog thread is seen running about once a second.)"""
    base = f"/proc/{pid}/task"
    try:
        tids = os.listdir(base)
    except OSError:
        return None
    ns, busy = 0, False
    for tid in tids:
        try:
            with open(f"{base}/{tid}/schedstat", "rb") as f:
                ns += int(f.read().split()[0])
            with open(f"{base}/{tid}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended meanwhile
        busy = busy or state == b"D"
    return ns, busy


class Watch:
    """The ranks' collective counts and activity while one job is late (see Note [Definite
    deadlock], Note [Timeout verdicts])."""

    def __init__(self, pool: Pool, job: int, w: int, stall_seconds: float | None):
        self._pool = pool
        # No rank's activity is read where no stall is judged (None).
        self._stall_seconds = stall_seconds
        self.job = job
        self.w = w
        self._last: dict[int, tuple | None] = {}
        self._changed: dict[int, float] = {}
        self._suspect = 0
        self._first: float | None = None  # when the driver first polled the ranks
        # See Note [Timeout verdicts]: (time, rank -> CPU ns) of the last polls, and when a rank
        # still in the job was last seen running.
        self._cpu: list[tuple[float, dict[int, int]]] = []
        self._ran: float | None = None
        self._blind = False  # a rank's activity could not be read: never a stall
        # When each rank of the job started its code, on the driver's clock, and when the last
        # of them did (None until every rank of the job has): Note [Started ranks].
        self._began: dict[int, float] = {}
        self.began_at: float | None = None

    def status(self, rank: int) -> dict | None:
        st = self._pool.status(rank)
        return st if st is not None and st.get("job") == self.job else None

    def began(self, since: float) -> float | None:
        """When the last rank of the job started the job's code (Note [Started ranks]), on the
        driver's monotonic clock and no earlier than ``since`` (the submission); None while some
        rank of the job has not. A rank's start is read from its status record, which it writes
        on the wall clock: converted here, and kept within [since, now] (an attached rank's
        machine has a clock of its own)."""
        if self.began_at is not None:
            return self.began_at
        for r in range(self.w):
            if r in self._began:
                continue
            st = self.status(r)
            if st is None:
                return None
            now = time.monotonic()
            ago = (time.time_ns() - int(st.get("began_ns") or 0)) / 1e9
            self._began[r] = min(now, max(since, now - ago))
        self.began_at = max(self._began.values())
        return self.began_at

    def poll(self, ranks: list[int]) -> None:
        now = time.monotonic()
        if self._first is None:
            self._first = now
        cpu: dict[int, int] = {}
        for r in ranks:
            st = self.status(r)
            key = None if st is None else (st["total"], st["inside"], st["state"])
            if self._last.get(r) != key:
                self._last[r] = key
                self._changed[r] = now
            act = None if self._stall_seconds is None else self._pool.activity(r)
            if act is None:
                self._blind = True
                continue
            cpu[r] = act[0]
            if act[1]:
                self._ran = now
        # CPU time over the last half second or more: one poll's 0.1 s is too short to tell a
        # rank that waits for a CPU on a loaded machine from one that waits for nothing.
        older = [(t, c) for t, c in self._cpu if now - t >= 0.5]
        if older:
            t, before = older[-1]
            if any(c - before.get(r, c) >= _RUNNING * (now - t) * 1e9 for r, c in cpu.items()):
                self._ran = now
        self._cpu = [(t, c) for t, c in self._cpu if now - t < 1.0] + [(now, cpu)]

    def watched_for(self) -> float:
        return 0.0 if self._first is None else time.monotonic() - self._first

    def progressed(self, within: float) -> bool:
        """Whether a rank still in the job issued a collective, changed state or ran (used a CPU)
        within the last ``within`` seconds."""
        now = time.monotonic()
        ran = self._ran is not None and now - self._ran < within
        return ran or any(now - t < within for t in self._changed.values())

    def answering(self, running: list[int]) -> list[int]:
        """The ranks of ``running`` whose status says they finished the job: their answer is on
        its way (Note [Timeout verdicts])."""
        out = []
        for r in running:
            st = self.status(r)
            if st is not None and st["state"] != "running" and self._pool.alive(r):
                out.append(r)
        return out

    def stalled(self, running: list[int]) -> bool:
        """Whether no rank of ``running`` (the ranks still in the job, one at least) ran, issued a
        collective or changed state for the World's ``stall_seconds`` (Note [Timeout verdicts])."""
        window = self._stall_seconds
        if window is None or self._blind or not running or self._first is None:
            return False
        if self.began_at is None or self.answering(running):
            return False  # a rank has not started the job: slow, not stuck (Note [Started ranks])
        now = time.monotonic()
        last = max(
            [self._first, self.began_at, self._ran or 0.0]
            + [self._changed.get(r, 0.0) for r in running]
        )
        return now - last >= window

    def deadlocked(self, finished: list[int], running: list[int]) -> bool:
        if self.began_at is None:  # Note [Started ranks]: no proof while a rank has not started
            self._suspect = 0
            return False
        ok = (
            self._past_the_finished(finished, running)
            or (
                bool(running)
                and sizes_differ([self.status(r) for r in finished + running], inside=False)
                and all(_inside_sized(self.status(r)) for r in running)
            )
            or kinds_differ([self.status(r) for r in running])
        )
        self._suspect = self._suspect + 1 if ok else 0
        return self._suspect >= 2

    def _past_the_finished(self, finished: list[int], running: list[int]) -> bool:
        if not finished or not running:
            return False
        done = [self.status(r) for r in finished]
        lows = [st["world_total"] for st in done if st is not None]
        ok = bool(lows)
        for r in running:
            st = self.status(r)
            ok = (
                ok and st is not None and st["inside"] is not None and st["world_total"] > min(lows)
            )
        return ok


def _inside_sized(st: dict | None) -> bool:
    """Whether ``st`` is inside its last ``SIZED`` collective on the default group."""
    if st is None or st.get("sized") is None:
        return False
    x = st["sized"]
    return bool(st["inside"] == x[0] and st["world_total"] == x[2])


def sizes_differ(statuses: list[dict | None], *, inside: bool = True) -> bool:
    """Every status's last ``SIZED`` collective on the default group is the same one (the same
    kind at the same count) and the tensors passed to it differ in size or dtype (Note [Definite
    deadlock]). With ``inside``, every rank must still be inside it."""
    known = [st for st in statuses if st is not None and st.get("sized") is not None]
    if len(statuses) < 2 or len(known) < len(statuses):
        return False
    sized = [st["sized"] for st in known]
    if inside and not all(_inside_sized(st) for st in statuses):
        return False
    if len({tuple(x[:3]) for x in sized}) > 1:
        return False
    return len({tuple(x[3:5]) for x in sized}) > 1


def kinds_differ(statuses: list[dict | None]) -> bool:
    """Every status is inside its last ``SIZED`` collective on the default group, all at the same
    count of default-group collectives, and those are not all of one kind (Note [Definite
    deadlock]): a broadcast on one rank where another is in an all_reduce."""
    if len(statuses) < 2 or not all(_inside_sized(st) for st in statuses):
        return False
    sized = [st["sized"] for st in statuses]  # type: ignore[index]
    return len({x[2] for x in sized}) == 1 and len({x[0] for x in sized}) > 1


def _size_words(st: dict) -> str:
    """ " of N dtype elements" where ``st`` is inside its last SIZED collective."""
    if not _inside_sized(st):
        return ""
    x = st["sized"]
    root = f" from rank {x[5]}" if len(x) > 5 and x[0] == "broadcast" else ""
    root = f" to rank {x[5]}" if len(x) > 5 and x[0] == "reduce" else root
    return f" of {x[3]} {x[4]} element{'' if x[3] == 1 else 's'}{root}"


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _ranks(rs: list[int]) -> str:
    return ("rank " if len(rs) == 1 else "ranks ") + ", ".join(str(r) for r in rs)


def describe_disagreement(
    statuses: dict[int, dict | None], stuck: list[int], finished: list[int]
) -> str:
    """One sentence: which collective the stuck ranks are in and how many each rank issued, e.g.
    "rank 1 is in its 7th all_reduce; ranks 0, 2 finished after 6 all_reduce"; or, where they
    passed one collective tensors of different sizes, ``describe_sizes``."""
    if sizes_differ([statuses.get(r) for r in stuck + finished], inside=False):
        return describe_sizes({r: statuses[r] for r in stuck + finished}, [])
    known = [statuses.get(r) for r in stuck]
    if not finished and known and all(st is not None and st["inside"] is None for st in known):
        return (
            OUTSIDE
            + ": "
            + ", ".join(f"rank {r} after {statuses[r]['total']}" for r in stuck)  # type: ignore[index]
            + " collective(s); each is busy or blocked in its own code (its stack says where)"
        )
    parts = []
    op = None
    for r in stuck:
        st = statuses.get(r)
        if st is None:
            parts.append(f"rank {r} has not started the job's code")
            continue
        if st["inside"] is None:
            parts.append(f"rank {r} is outside any collective after {st['total']} collective(s)")
            continue
        op = op or st["inside"]
        parts.append(
            f"rank {r} is in its {_ordinal(st['inside_index'])} {st['inside']}"
            + _size_words(st)
            + (f" ({st['total']} collectives in all)" if st["total"] != st["inside_index"] else "")
        )
    groups: dict[tuple, list[int]] = {}
    for r in finished:
        st = statuses.get(r)
        if st is None:
            continue
        key = (st["counts"].get(op, 0) if op and op != "wait" else None, st["total"])
        groups.setdefault(key, []).append(r)
    for (n_op, total), rs in sorted(groups.items(), key=lambda kv: kv[1]):
        what = (
            f"{n_op} {op}" + (f" ({total} collectives in all)" if total != n_op else "")
            if n_op is not None
            else f"{total} collective(s)"
        )
        parts.append(f"{_ranks(rs)} finished after {what}")
    return "; ".join(parts)


# How ``describe_disagreement`` begins when no stuck rank is inside a collective: then the ranks
# do not disagree on their collectives, and the report says where they are instead.
OUTSIDE = "no rank is inside a collective"


_STATE_WORDS = {"running": "still in it", "raised": "raised", "returned": "returned"}


def describe_death(statuses: dict[int, dict | None], dead: list[int]) -> str:
    """``describe_sizes`` where the ranks' last sized collective explains a death, else empty."""
    ranks = sorted(statuses)
    if not sizes_differ([statuses[r] for r in ranks], inside=False):
        return ""
    return describe_sizes(statuses, dead)


def describe_sizes(statuses: dict[int, dict | None], dead: list[int]) -> str:
    """What each rank passed to its last ``SIZED`` collective, which ``sizes_differ`` found to be
    the same one with tensors of different sizes (gloo aborts a process on it,
    ``gloo::EnforceNotMet``, and raises on another, or one rank returns and another waits)."""
    known = {r: st for r, st in sorted(statuses.items()) if st is not None}
    kind, count = next(iter(known.values()))["sized"][:2]
    parts = []
    for r, st in known.items():
        n, dtype = st["sized"][3:5]
        how = "died" if r in dead else _STATE_WORDS.get(st.get("state", ""), "")
        parts.append(f"rank {r} ({how}) {n} {dtype} element{'' if n == 1 else 's'}")
    return f"their {_ordinal(count)} {kind} got tensors of different sizes: " + ", ".join(parts)
