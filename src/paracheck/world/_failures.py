"""How a job fails: each rank's view (``RankFailure``) and the exceptions ``World.collect``
raises with them (``paracheck.world.runner`` re-exports them; ``paracheck.errors`` lists them).

Also the reading of a rank's traceback or stack: the collective it failed or hangs in, and the
order in which failures are reported (the rank whose own code failed first).
"""

from __future__ import annotations

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


class WorldError(ParacheckError):
    """A job failed on one or more ranks; ``failures`` holds each rank's view."""

    kind = "failed"

    def __init__(self, message: str, failures: list[RankFailure]):
        super().__init__(message)
        self.failures = failures
        self.disagreement = ""  # RankHang: what the ranks disagree on, in one sentence

    def report(self) -> str:
        parts = [str(self)]
        for f in self.failures:
            where = f" in collective {f.collective}" if f.collective else ""
            parts.append(f"--- rank {f.rank} {f.kind}{where} ---\n{f.detail.rstrip()}")
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
    ):
        super().__init__(message, failures)
        self.disagreement = disagreement
        self.definite = definite  # a deadlock by the collective counts, not only a timeout
        # No rank still in the job ran or issued a collective for ``World.stall_seconds``
        # (Note [Timeout verdicts]).
        self.stalled = stalled
        self.rerun = False  # the verdict of a second run on fresh ranks (Note [Timeout verdicts])
        self.seconds = seconds  # from submission to the verdict

    @property
    def confirmed(self) -> bool:
        """Whether the ranks' own state proves the hang (a deadlock, or a stall), so that running
        the job again could not end otherwise (Note [Timeout verdicts])."""
        return self.definite or self.stalled


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


_DEATHS = ("died", "memory")  # a rank process that ended during a job


def _collective_of(stack: str) -> str | None:
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


def _collective_of_tb(text: str) -> str | None:
    """The innermost torch.distributed collective in a Python traceback (most recent last)."""
    frames = re.findall(r'File "([^"]+)", line \d+, in (\w+)', text)
    for path, name in reversed(frames):
        if "torch/distributed" in path.replace("\\", "/") and name in _COLLECTIVES:
            return name
    return None


def _order_failures(failures: list[RankFailure]) -> list[RankFailure]:
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
