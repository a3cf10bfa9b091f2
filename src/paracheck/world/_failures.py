"""How a job fails: each rank's view (``RankFailure``) and the exceptions ``World.collect``
raises with them (``paracheck.world.runner`` re-exports them; ``paracheck.errors`` lists them).

Also the reading of a rank's traceback or stack: the collective it failed or hangs in, and the
order in which failures are reported (the rank whose own code failed first).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from paracheck.errors import ParacheckError

_COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "broadcast",
    "reduce",
    "barrier",
    "all_to_all",
    "all_to_all_single",
    "gather",
    "scatter",
    "send",
    "recv",
    "wait",
    "monitored_barrier",
    "all_gather_object",
    "broadcast_object_list",
)


@dataclass
class RankFailure:
    rank: int
    kind: str  # "raised" | "hung" | "died" | "memory" (over its memory cap)
    detail: str  # traceback, stack, or exit description
    collective: str | None = None
    output: str = ""  # what the rank printed during the job, clipped (Note [Captured output])
    status: dict | None = None  # its collective counts (paracheck.world._collectives), where read
    # Where a library raised on an object of the user's code that paracheck's harness handed it,
    # one sentence naming the object (Note [Raised on the target's objects] in
    # paracheck.world._blame); None otherwise.
    called_on: str | None = None


class WorldError(ParacheckError):
    """A job failed on one or more ranks; ``failures`` holds each rank's view."""

    kind = "failed"

    def __init__(self, message: str, failures: list[RankFailure]):
        super().__init__(message)
        self.failures = failures
        self.disagreement = ""  # RankHang: what the ranks disagree on, in one sentence

    def report(self, *, full: bool | None = None) -> str:
        """Every rank's failure: a raised rank's traceback from the user's code on (Note [A
        rank's traceback]; ``full``, or ``PARACHECK_FULL_TRACEBACK=1``: every frame)."""
        if full is None:
            full = os.environ.get(FULL_TRACEBACK, "") not in ("", "0")
        parts = [str(self)]
        for f in self.failures:
            where = f" in collective {f.collective}" if f.collective else ""
            detail = f.detail
            if not full and f.kind == "raised":
                detail = hide_harness_frames(detail)
            elif not full and f.kind == "hung":
                detail = hide_harness_stack(detail)
            parts.append(f"--- rank {f.rank} {f.kind}{where} ---\n{detail.rstrip()}")
            if f.output:
                parts.append(f"--- rank {f.rank} printed ---\n{f.output.rstrip()}")
        return "\n".join(parts)


class WorldStartError(ParacheckError, RuntimeError):
    """The World's rank processes did not start (or restart): no case was judged."""


class RankError(WorldError):
    kind = "raised"


class RankHang(WorldError):
    kind = "hung"

    def __init__(
        self,
        message: str,
        failures: list[RankFailure],
        *,
        disagreement: str = "",
        definite: bool = False,
        stalled: bool = False,
        seconds: float = 0.0,
        progressing: bool = False,
        load: float | None = None,
    ):
        super().__init__(message, failures)
        self.disagreement = disagreement
        self.definite = definite  # a deadlock by the collective counts, not only a timeout
        # No rank still in the job ran or issued a collective for ``World.stall_seconds``
        # (Note [Timeout verdicts]).
        self.stalled = stalled
        self.rerun = False  # the verdict of a second run on fresh ranks (Note [Timeout verdicts])
        self.seconds = seconds  # from submission to the verdict
        # A rank still in the job ran or issued a collective in the last second before the
        # verdict, and the runnable processes per CPU then (Note [Too slow to judge]).
        self.progressing = progressing
        self.load = load
        self.limit: float | None = None  # the timeout of the second run, where there was one

    @property
    def confirmed(self) -> bool:
        """Whether the ranks' own state proves the hang (a deadlock, or a stall), so that running
        the job again could not end otherwise (Note [Timeout verdicts])."""
        return self.definite or self.stalled

    @property
    def overloaded(self) -> bool:
        """Whether the machine had more than ``OVERLOADED`` runnable processes per CPU at the
        verdict (Note [Too slow to judge])."""
        return self.load is not None and self.load >= OVERLOADED

    def too_slow(self) -> str | None:
        """Why this timeout is no verdict on the target (Note [Too slow to judge]), or None."""
        if self.confirmed or not self.rerun or not self.progressing or not self.overloaded:
            return None
        limit = f"the {self.limit:g} s timeout" if self.limit else "the timeout"
        return (
            f"still running at {limit} twice, its ranks computing or communicating to the end, "
            f"on a machine with {self.load:.1f} runnable processes per CPU: too slow to judge "
            "here, not stuck; give the check a longer --timeout or a quieter machine"
        )


# Note [Too slow to judge]
#   A job past the World's whole timeout whose ranks still ran or issued collectives (Note
#   [Timeout verdicts]) is run again on fresh ranks, and a second timeout was reported as a hang.
#   On two cores with four checks of four ranks and eight busy processes beside them (a load of
#   13 to 17), a correct DDP's compiled case at world size 4, 12 s alone, went past 20 s twice,
#   its ranks in the target's bucket waits and backward to the end: the target was told to fix a
#   hang it does not have. Where the machine has more than ``OVERLOADED`` runnable processes per
#   CPU (its one-minute load average) when the second run times out, and a rank of the job still
#   ran or issued a collective in its last second, the case is not judged: it is skipped, saying
#   so and what to change. A stall (no rank ran or issued a collective for ``stall_seconds``) on
#   a machine so loaded is run again on fresh ranks before it is reported: under that load, the
#   compiled cases of two correct DDPs stalled (their ranks compiling, their stacks not read in
#   time) where the same cases, replayed four at once under the same load, were seen compiling.
#   A deadlock is judged whatever the load, as are a stall and a rank spinning at its timeout on
#   a machine not so loaded; a rank spinning forever on one so loaded is the one hang this leaves
#   unreported, and it says why.
OVERLOADED = 2.0


def load_per_cpu() -> float | None:
    """The one-minute load average per CPU this process may run on, or None where unknown."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 0
    try:
        return os.getloadavg()[0] / cpus if cpus else None
    except OSError:
        return None


class RankDied(WorldError):
    kind = "died"


class RankOverMemory(RankDied):
    """A rank's resident memory exceeded the World's ``rank_memory`` cap during the job, on fresh
    rank processes (Note [Rank memory cap]); the rank was stopped and replaced. ``summary`` says
    which rank, the cap and the step, e.g. "rank 1 exceeded 0.5 GB at step 3"."""

    kind = "memory"

    def __init__(self, message: str, failures: list[RankFailure], *, summary: str):
        super().__init__(message, failures)
        self.summary = summary


class PeerFailed(ParacheckError, RuntimeError):
    """Raised by rank code that stops because another rank failed (the other rank reports its own
    error). The runner lists such ranks after the rank whose own code failed."""


class PoolLost(ParacheckError, RuntimeError):
    """The attached agents cannot run another job: an agent is gone, or one stayed stuck in a job
    that no timeout or abort freed. Not a ``WorldError``: no case failed for it (Note [A lost
    pool] in paracheck.world.attached)."""


DEATHS = ("died", "memory")  # a rank process that ended during a job


def collective_of(stack: str) -> str | None:
    """The innermost torch.distributed collective in a faulthandler stack dump (most recent first)."""
    for line in stack.splitlines():
        m = re.search(r'File "([^"]+)", line \d+ in (\w+)', line)
        if (
            m
            and "torch/distributed" in m.group(1).replace("\\", "/")
            and m.group(2) in _COLLECTIVES
        ):
            return m.group(2)
    return None


def collective_of_traceback(text: str) -> str | None:
    """The innermost torch.distributed collective in a Python traceback (most recent last)."""
    frames = re.findall(r'File "([^"]+)", line \d+, in (\w+)', text)
    for path, name in reversed(frames):
        if "torch/distributed" in path.replace("\\", "/") and name in _COLLECTIVES:
            return name
    return None


def order_failures(failures: list[RankFailure]) -> list[RankFailure]:
    # The rank whose own code raised comes first; peers that merely lost their connection after.
    def secondary(f: RankFailure) -> bool:
        if f"{PeerFailed.__name__}:" in f.detail:  # the exception's line of the traceback
            return True
        t = f.detail.lower()
        return any(
            s in t
            for s in ("connection closed", "connection reset", "timed out", "timeout", "gloo")
        )

    return sorted(failures, key=lambda f: (secondary(f), f.rank))


# Note [A rank's traceback]
#   A rank's traceback opens with the frames of paracheck's rank program (``world/_rank.py``, the
#   kind's ``check/ranks/...``, the case builders): four to six of them before the first line of
#   the user's code, on every raised failure. They are left out of the report, as pytest leaves
#   out its own, with a line that counts them: a traceback starts at the user's code. Where no
#   frame is the user's, the last frame of paracheck's before a library's (torch's) is kept, for
#   it shows what paracheck called on the target's objects (an LR scheduler built on the
#   target's optimizer); where paracheck raised in its own code, every frame is kept (the
#   evidence of a bug in paracheck). Below the user's frame, paracheck's wrappers around torch's
#   collectives (``world/_collectives.py``) are left out too. A hung rank's stack (a faulthandler
#   dump, most recent call first) is read the same way: the rank program below the user's
#   outermost frame, the wrappers above it and paracheck's reader thread are left out, counted,
#   and a dump with no frame of the user's stays whole. ``PARACHECK_FULL_TRACEBACK=1`` keeps
#   every frame. The failure's ``detail`` keeps them all: the diagnoses read it whole.
# Path fragments of paracheck's harness: its frames are never the target's. (paracheck's own
# designs, ``paracheck/ddp``, ``paracheck/zero``, ..., and its mutants are targets.)
HARNESS_PATHS = (
    "/paracheck/check/",
    "/paracheck/world/",
    "/paracheck/oracle/",
    "/paracheck/cases/",
    "/paracheck/workloads/",
    "/paracheck/accounting/",
)
# Path fragments of a library's frames (torch, the standard library, an installed package).
LIBRARY_PATHS = (
    "/torch/",
    "/site-packages/",
    "/dist-packages/",
    "/lib/python3",
    "<frozen",
    "<string>",
)
FULL_TRACEBACK = "PARACHECK_FULL_TRACEBACK"  # set (not 0): reports keep paracheck's frames
_COUNTER_FRAME = "/paracheck/world/_collectives.py"  # its wrappers of torch's collectives
_TB_FRAME = re.compile(r'^\s*File "([^"]+)", line \d+, in \S+')


def frame_kind(path: str) -> str:
    """ "harness", "library" or "user" (Note [A rank's traceback])."""
    path = path.replace("\\", "/")
    if "/paracheck/mutants/" not in path and any(s in path for s in HARNESS_PATHS):
        return "harness"
    return "library" if any(s in path for s in LIBRARY_PATHS) else "user"


def _passes_through(block: list[str]) -> bool:
    """Whether a frame of the collective wrappers (its "File" line and source lines) is its call
    of torch's own function, where an error raised is torch's."""
    return any(re.match(r"\s*return (fn|original_wait)\(", line) for line in block[1:])


# A frame of a faulthandler dump (a hung rank's stack): most recent call first, no comma.
_DUMP_FRAME = re.compile(r'^\s*File "([^"]+)", line \d+ in (\S+)\s*$')


def _hidden_words(kinds: list[str], what: str = "calling your code") -> str:
    ours, others = kinds.count("harness"), len(kinds) - kinds.count("harness")
    words = f"{ours} paracheck frame{'' if ours == 1 else 's'}" if ours else ""
    if others:
        words += " and " if words else ""
        words += f"{others} library frame{'' if others == 1 else 's'} {what}"
    return f"  ... {words} hidden ({FULL_TRACEBACK}=1 shows them)"


def hide_harness_stack(text: str) -> str:
    """A hung rank's faulthandler dump with paracheck's frames left out where the user's code is
    in the thread (Note [A rank's traceback]): the callers below its outermost frame (the rank
    program), paracheck's wrappers around torch's collectives above it, and paracheck's own
    threads, each counted. A dump with no frame of the user's (paracheck hung in its own code) is
    kept whole: every frame is evidence."""
    lines = text.splitlines()
    if not any(
        (m := _DUMP_FRAME.match(line)) and frame_kind(m.group(1)) == "user" for line in lines
    ):
        return text
    out: list[str] = []
    helper_threads = 0
    i = 0
    while i < len(lines):
        head = lines[i]
        if not head.endswith("(most recent call first):"):
            out.append(head)
            i += 1
            continue
        j = i + 1
        frames: list[tuple[str, str]] = []  # (kind, line)
        while j < len(lines) and _DUMP_FRAME.match(lines[j]):
            m = _DUMP_FRAME.match(lines[j])
            assert m is not None
            path, fn = m.group(1), m.group(2)
            kind = frame_kind(path)
            if kind == "harness" and _COUNTER_FRAME in path.replace("\\", "/"):
                kind = "counter" if fn in ("counted", "wait") else kind
            frames.append((kind, lines[j]))
            j += 1
        kinds = [k for k, _ in frames]
        if "user" not in kinds:
            thread = all(k == "harness" or '/threading.py"' in line for k, line in frames)
            if "harness" in kinds and thread and not head.startswith("Current thread"):
                helper_threads += 1  # paracheck's own thread (its rank program's reader)
                while j < len(lines) and not lines[j].strip():
                    j += 1
            else:
                out.append(head)
                out += [line for _, line in frames]
            i = j
            continue
        last = len(kinds) - 1 - kinds[::-1].index("user")
        n = kinds[:last].count("counter")
        out.append(head)
        for k, (kind, line) in enumerate(frames[: last + 1]):
            if kind != "counter":
                out.append(line)
            elif k == kinds.index("counter"):
                out.append(
                    f"  ... {n} paracheck frame{'' if n == 1 else 's'} counting collectives "
                    f"hidden ({FULL_TRACEBACK}=1 shows them)"
                )
        callers = [("harness" if k == "counter" else k) for k in kinds[last + 1 :]]
        if callers:
            out.append(_hidden_words(callers))
        i = j
    if helper_threads:
        n = helper_threads
        out.insert(
            0,
            f"... {n} paracheck thread{'' if n == 1 else 's'} hidden ({FULL_TRACEBACK}=1 shows them)",
        )
    return "\n".join(out) + ("\n" if text.endswith("\n") else "")


def hide_harness_frames(text: str) -> str:
    """``text`` (Python tracebacks, chained ones included) with the leading frames of paracheck's
    harness left out of each, and a line counting them (Note [A rank's traceback])."""
    lines = text.splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        out.append(lines[i])
        if not lines[i].startswith("Traceback (most recent call last):"):
            i += 1
            continue
        # The frames of this traceback: a "File" line and its source lines, up to the first
        # line that is not indented (the exception's).
        frames: list[tuple[str, list[str]]] = []
        j = i + 1
        while j < len(lines) and lines[j].startswith(" "):
            m = _TB_FRAME.match(lines[j])
            if m:
                frames.append((frame_kind(m.group(1)), [lines[j]]))
            elif frames:
                frames[-1][1].append(lines[j])
            else:
                frames.append(("user", [lines[j]]))  # not a frame: kept as it is
            j += 1
        kinds = [k for k, _ in frames]
        lead = 0
        while lead < len(kinds) and kinds[lead] == "harness":
            lead += 1
        if "user" in kinds[lead:]:
            first_user = kinds.index("user", lead)
            hidden = kinds[:first_user]
        elif lead < len(kinds):
            hidden = kinds[: lead - 1] if lead else []  # keep paracheck's call into the library
        else:
            hidden = []  # raised inside paracheck: every frame is evidence
        # Below the user's first frame, paracheck's wrappers around torch's collectives (they
        # count them) stand between the user's call and torch's: left out too, counted where the
        # first of them was. As the last frame, one is kept unless it is the wrapper's call of
        # torch's function (an error of the wrapper's own is evidence).
        wrappers = {
            k
            for k in range(len(hidden) + 1, len(frames))
            if "user" in kinds[len(hidden) : k]
            and _COUNTER_FRAME in frames[k][1][0]
            and (k < len(frames) - 1 or _passes_through(frames[k][1]))
        }
        if hidden:
            ours, others = hidden.count("harness"), len(hidden) - hidden.count("harness")
            words = f"{ours} paracheck frame{'' if ours == 1 else 's'}"
            if others:
                words += (
                    f" and {others} library frame{'' if others == 1 else 's'} calling your code"
                )
            out.append(f"  ... {words} hidden ({FULL_TRACEBACK}=1 shows them)")
        for k, (_, block) in enumerate(frames[len(hidden) :], start=len(hidden)):
            if k == min(wrappers, default=-1):
                n = len(wrappers)
                out.append(
                    f"  ... {n} paracheck frame{'' if n == 1 else 's'} counting collectives "
                    f"hidden ({FULL_TRACEBACK}=1 shows them)"
                )
            if k not in wrappers:
                out.extend(block)
        i = j
    return "\n".join(out) + ("\n" if text.endswith("\n") else "")
