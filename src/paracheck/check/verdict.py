"""The verdict table as people read it (Note [The verdict table] in ``paracheck.check.table``):
its rows (``RowVerdict``), and the failures grouped by cause (``causes_of``), one block each
(``cause_text``)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from paracheck.check.failure import (
    PROPERTIES,
    PropertyFailure,
    _diagnosis,
    _last_line,
    case_line,
    replay_command,
    saved_case_path,
    stack_frames,
    target_frame,
)

__all__ = ["RowVerdict", "cause_of", "cause_text", "causes_of"]


@dataclass
class RowVerdict:
    """One row of the verdict table (Note [The verdict table] in ``paracheck.check.table``):
    ``status`` is PASS, FAIL, "not supported", "not drawn" or "not reached"; ``why`` says why a
    row was not searched; ``failure`` is the failure found in the row, ``also`` the properties
    found in earlier rows that the row's cases broke too."""

    name: str  # "core", "+buffer", "all features"
    feature: str | None  # the optional feature the row adds to the core (None: core or all)
    status: str = "not reached"
    why: str = ""
    failure: PropertyFailure | None = None
    also: list[PropertyFailure] = field(default_factory=list)
    cases: int = 0
    seconds: float = 0.0

    def line(self, width: int, number: dict | None = None) -> str:
        number = number or {}

        def cause(f: PropertyFailure) -> str:
            n = number.get(id(f))
            return f"{f.property} (cause {n})" if n else f.property

        name = self.name.ljust(width)
        if self.status == "FAIL":
            found = [cause(self.failure)] if self.failure is not None else []
            found += [cause(f) + " as above" for f in self.also]
            return f"{name}  FAIL  {', '.join(found)}  [{self.cases} cases, {self.seconds:.1f} s]"
        if self.status == "PASS":
            return f"{name}  PASS  [{self.cases} cases, {self.seconds:.1f} s]"
        return f"{name}  {self.status}: {self.why}".rstrip(": ")

    def to_dict(self) -> dict:
        return {
            "row": self.name,
            "feature": self.feature,
            "status": self.status,
            "why": self.why,
            "property": None if self.failure is None else self.failure.property,
            "also": [f.property for f in self.also],
            "cases": self.cases,
            "seconds": round(self.seconds, 3),
        }


def cause_of(failure: PropertyFailure) -> tuple:
    """What a failure comes from, as far as its case shows: the first diverging tensor and its
    rank, the collectives the ranks disagree on, or the exception and the frame that raised it.
    Failures of one cause are reported as one block (``causes_of``)."""
    result = failure.result
    err = result.error
    if err is not None:
        if failure.property == "raised" and getattr(err, "failures", None):
            first = err.failures[0]
            text = re.sub(r"\d+", "N", _last_line(first.detail))
            return ("raised", text, target_frame(first.detail, failure.own))
        # A hang: where in the target's own code the hung ranks wait tells two hangs apart (the
        # same wait in a later case is the same cause; the counts in the ranks' disagreement
        # differ from case to case).
        frames = frozenset(
            frame
            for f in getattr(err, "failures", ())
            if f.kind == "hung"
            for frame in stack_frames(f.detail, failure.own)
        )
        if frames:
            return (failure.property, frames)
        return (failure.property, getattr(err, "disagreement", "") or failure.property)
    d = result.divergence_of(failure.property)
    if d is None or (d.name is None and d.index is None):
        return (failure.property,)
    return ("tensor", d.name if d.name is not None else d.index, d.rank)


def causes_of(failures) -> list[list[PropertyFailure]]:
    """``failures`` grouped by ``cause_of``, in the order found; within a group, the most specific
    property first (``PROPERTIES`` order)."""
    groups: dict[tuple, list[PropertyFailure]] = {}
    for f in failures:
        groups.setdefault(cause_of(f), []).append(f)
    keys = list(PROPERTIES)

    def rank(f: PropertyFailure) -> int:
        return keys.index(f.property) if f.property in keys else len(keys)

    return [sorted(group, key=rank) for group in groups.values()]


def cause_text(
    group: list[PropertyFailure],
    number: int,
    target,
    backend: str = "gloo",
    *,
    timeout: float | None = None,
    rank_memory: float | None = None,
    case_files: bool = True,
) -> str:
    """One block of the verdict table's failures of one cause: the headline and fix of its most
    specific property, the others it breaks, its shrunk case in one line, what diverged and the
    command that replays it from the case's file (``saved_case_path``, beside the example database:
    with ``case_files`` False, as with no database, the command carries the case's JSON; the case
    whole is in the JSON report too)."""
    f = group[0]
    rows = list(dict.fromkeys(g.row for g in group if g.row))
    out = [f"cause {number}: {f.header(target.name)}"]
    if rows:
        out.append(f"  rows: {', '.join(rows)}")
    for other in group[1:]:
        out.append(f"  also: {other.property}: {other.meaning}")
    out += [f"  note: {n}" for n in f.notes]
    err = f.result.error
    if err is not None and f.property == "raised" and err.failures:
        first = err.failures[0]
        out.append(f"  {_last_line(first.detail)}")
        frame = target_frame(first.detail, f.own)
        if frame:
            out.append(f"  at {frame}")
        hint = _diagnosis(err.report())
        if hint:
            out.append(f"  {hint}")
    elif err is not None and f.property in ("hang", "died") and getattr(err, "disagreement", ""):
        from paracheck.world.runner import OUTSIDE

        lead = "" if err.disagreement.startswith(OUTSIDE) else "the ranks disagree: "
        out.append(f"  {lead}{err.disagreement}")
    if f.fix:
        out.append(f"  fix: {f.fix}")
    how = (
        "shrunk"
        if f.shrunk and f.fully_shrunk
        else ("as found" if not f.shrunk else "not fully shrunk")
    )
    out.append(f"  case ({how}): {case_line(f.case)}")
    if err is None:
        out.append("  what diverged: " + f.result.describe(f.property).replace("\n", "\n    "))
    else:
        out.append("  what failed:")
        out.append("    " + f.result.describe(f.property).rstrip().replace("\n", "\n    "))
    if f.result.outputs and err is None:
        for rank, text in sorted(f.result.outputs.items()):
            out.append(f"  rank {rank} printed: " + text.rstrip().replace("\n", "\n    "))
    out.append(
        "  replay: "
        + replay_command(
            target,
            f.case,
            backend,
            timeout=timeout,
            rank_memory=rank_memory,
            case_file=saved_case_path(f.case) if case_files else None,
        )
    )
    return "\n".join(out)
