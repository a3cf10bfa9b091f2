"""The verdict table as people read it (Note [The verdict table] in ``paracheck.check.table``):
its rows (``RowVerdict``), and the failures grouped by cause (``causes_of``), one block each
(``cause_text``)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from paracheck.check.failure import (
    PROPERTIES,
    PropertyFailure,
    _last_line,
    case_line,
    diagnosis,
    replay_command,
    saved_case_path,
    stack_frames,
    stuck_at,
    target_frame,
)

__all__ = [
    "BY_ROW",
    "RowVerdict",
    "by_row",
    "cause_key",
    "cause_of",
    "cause_text",
    "causes_of",
    "same_cause",
    "uninformative",
]


@dataclass
class RowVerdict:
    """One row of the verdict table (Note [The verdict table] in ``paracheck.check.table``):
    ``status`` is PASS, FAIL, "not supported", "not drawn" or "not reached"; ``why`` says why a
    row was not searched (or stopped early); ``failure`` is the first cause found in the row,
    ``more`` the other causes of its own (Note [Causes, not properties]), ``also`` the causes
    found in other rows that the row's cases broke too. ``beyond``: a row of a feature the
    target's contract does not promise (``paracheck.check.features.beyond_contract``)."""

    name: str  # "core", "+buffer", "+accumulation+unused-always", "all features"
    feature: str | None  # the optional feature the row adds to the core (None: core or all)
    status: str = "not reached"
    why: str = ""
    failure: PropertyFailure | None = None
    also: list[PropertyFailure] = field(default_factory=list)
    cases: int = 0  # the cases the row ran (its shrinking included), each counted in one row
    earlier: int = 0  # the cases it judged again that earlier rows had run (their results kept)
    seconds: float = 0.0
    # Of ``seconds``, those Dynamo spent compiling the compiled cases the row ran (Note [Compiled
    # cases] in ``paracheck.cases._compile``).
    compiling: float = 0.0
    more: list[PropertyFailure] = field(default_factory=list)
    beyond: bool = False
    pair: tuple[str, ...] = ()  # a row of two features together: both
    shown: bool = False  # printed as the table streams (Note [Numbered once, as printed])

    @property
    def cost(self) -> str:
        """What the row's search took: "3 cases, 4.2 s", with ", 2.9 s of it compiling" where it
        compiled (Note [Compiled cases] in ``paracheck.cases._compile``), and "(and 2 of earlier
        rows)" where it drew cases earlier rows ran: the rows' counts add up to the cases run."""
        text = f"{self.cases} case{'' if self.cases == 1 else 's'}"
        if self.earlier:
            text += f" (and {self.earlier} of earlier rows)"
        text += f", {self.seconds:.1f} s"
        return text + (f", {self.compiling:.1f} s of it compiling" if self.compiling else "")

    @property
    def own(self) -> list[PropertyFailure]:
        """The causes found in this row and filed under it, first found first."""
        return ([self.failure] if self.failure is not None else []) + self.more

    def line(self, width: int, number: dict | None = None) -> str:
        number = number or {}

        def cause(f: PropertyFailure) -> str:
            n = number.get(id(f))
            return f"{f.property} (cause {n})" if n else f.property

        name = self.name.ljust(width)
        if self.status == "FAIL":
            found = [cause(f) for f in self.own]
            found += [cause(f) + " as above" for f in self.also]
            stopped = f"; {self.why}" if self.why else ""
            return f"{name}  FAIL  {', '.join(found)}  [{self.cost}{stopped}]"
        if self.status == "PASS":
            return f"{name}  PASS  [{self.cost}]"
        if self.cases:  # searched, then neither PASS nor FAIL (a budget spent): what it took
            return f"{name}  {self.status}: {self.why}  [{self.cost}]"
        return f"{name}  {self.status}: {self.why}".rstrip(": ")

    def to_dict(self) -> dict:
        return {
            "row": self.name,
            "feature": self.feature,
            "features": list(self.pair) if self.pair else None,
            "beyond_contract": self.beyond,
            "status": self.status,
            "why": self.why,
            "property": None if self.failure is None else self.failure.property,
            "more": [f.property for f in self.more],
            "also": [f.property for f in self.also],
            "cases": self.cases,
            "cases_of_earlier_rows": self.earlier,
            "seconds": round(self.seconds, 3),
            "compiling_seconds": round(self.compiling, 3),
        }


# Note [Causes, not properties]
#   A cause is what failed, never the property's name alone: the exception's last line and the
#   frame of the target's own code that raised it; for a hang or a dead rank, the frames of the
#   target's code where the stuck ranks wait (or the collectives they disagree on), one cause
#   whether a rank died or not (a rank that aborts in a collective its peers never reach leaves
#   the others hung: one bug); for a divergence, the property the divergence starts from
#   (``_FOLLOWS``): parameters stepped with a wrong gradient are the gradient's cause, parameters
#   wrong with right gradients another; and how it diverged (``Divergence.how``: a rounding, a value scaled
#   by a small whole factor or its inverse, another wrong value, a gradient where none is due).
#   Not the diverging tensor or rank: one bug diverges first
#   on a different tensor in each model drawn (``layers.0.weight`` of an MLP, ``fc1.weight`` of
#   a toy model), and was reported once per model. In the verdict table a cause is also its row
#   (``causes_of``): a divergence of the core and one only a feature adds are two bugs, told
#   apart by running the feature's case without it (Note [Finding every cause] in
#   ``paracheck.check.table``). So two bugs of one property are two blocks, and "as above" means
#   the same cause. What names a line of the target's code is one cause in every row
#   (``by_row``): an exception's type at the line that raised it (its message may carry the
#   case's values: a dtype, a size), ranks stuck at a line of it; a rank killed with nothing
#   recorded (no frame, no collective) is the stuck cause known, if one is (``uninformative``).
#   A feature row's divergence that is a known one moved by the feature (another tensor or way
#   first, a rescaled value) is found so by running the case without the feature (``_is_new``).

# A divergence of the key's property at a step follows from one of these at the same step or
# before (a parameter stepped with a wrong gradient, a state built from one): its cause is theirs.
_FOLLOWS = {
    "parameters": ("initial-state", "gradients"),
    "master-weights": ("initial-state", "gradients", "parameters"),
    "optimizer-state": ("initial-state", "gradients", "parameters"),
    "state-consolidated": ("initial-state", "gradients", "parameters", "optimizer-state"),
    "rank-agreement": ("initial-state", "gradients", "parameters"),
    # A resumed trajectory wrong before the save (or after a load of a state built wrong) is the
    # wrong step's cause, not the state dict's.
    "reshard": ("initial-state", "gradients", "parameters", "optimizer-state"),
}
_STUCK = ("hang", "died")
# "their 2nd all_reduce got tensors of different sizes", "rank 1 is in its 7th broadcast; ...".
_COLLECTIVE = re.compile(r"\b\d+(?:st|nd|rd|th) (\w+)")


# The properties compared with the oracle's trajectory, where one row's divergence and
# another's are two bugs when the other row's case without its feature passes (Note [Finding
# every cause] in ``paracheck.check.table``). Any other property (a bucket structure, a balance,
# a traffic count) is one cause wherever it is found: a feature changes only the sizes at which
# it shows.
BY_ROW = frozenset(
    {
        "initial-state",
        "gradients",
        "parameters",
        "master-weights",
        "optimizer-state",
        "state-consolidated",
        "rank-agreement",
    }
)


def by_row(key: tuple) -> bool:
    """Whether a cause is also its row (``BY_ROW``): a divergence of the oracle's trajectory, an
    exception raised outside the target's own code, stuck ranks with no frame of the target's
    known but the collective. An exception raised at a line of the target's code, or ranks stuck
    at lines of it (or with nothing recorded: ``uninformative``), is one cause in every row
    (Note [Causes, not properties])."""
    if key[0] == "diverged":
        return key[1] in BY_ROW
    if key[0] == "raised":
        return not key[2]
    if key[0] == "stuck":
        return not key[1] and not uninformative(key)
    return True


def uninformative(key: tuple) -> bool:
    """Whether a ``cause_key`` of stuck ranks names neither a frame of the target's code nor a
    collective (a rank killed in gloo with no disagreement recorded): nothing tells it apart from
    another stuck cause."""
    return key[0] == "stuck" and not key[1] and not key[2]


def same_cause(a: tuple, b: tuple) -> bool:
    """Whether two ``cause_key``s are one cause: equal, or for stuck ranks the same collective
    (or none known on one side) with a frame of the target's code in common (or none known on
    one side): a rank that died in a mismatched all-reduce, whose disagreement was not recorded,
    beside a peer hung in that all-reduce (Note [Causes, not properties])."""
    if a == b:
        return True
    if a[0] != "stuck" or b[0] != "stuck":
        return False
    if a[2] and b[2] and a[2] != b[2]:
        return False
    return not a[1] or not b[1] or bool(a[1] & b[1])


def cause_key(prop: str, result, own: tuple[str, ...] = ()) -> tuple:
    """What a failure of ``prop`` on ``result`` comes from (Note [Causes, not properties])."""
    err = result.error
    if err is not None:
        failures = getattr(err, "failures", None) or ()
        if prop == "raised" and failures:
            first = failures[0]
            text = re.sub(r"\d+", "N", _last_line(first.detail))
            frame = target_frame(first.detail, own)
            if frame:
                # The line of the target's code that raised, and the exception's type: its
                # message may name the case's values ("dtype 'float' ... 'Double'" in one case,
                # "'double' ... 'Float'" in another, one bug).
                text = re.match(r"[\w.]*", text).group(0) or text
            return ("raised", text, frame)
        # A hang: where in the target's own code the hung ranks wait tells two hangs apart (the
        # same wait in a later case is the same cause; the counts in the ranks' disagreement
        # differ from case to case).
        frames = frozenset(
            frame for f in failures if f.kind == "hung" for frame in stack_frames(f.detail, own)
        )
        group = "stuck" if prop in _STUCK else prop
        if group == "stuck":
            # A rank that died in a mismatched collective leaves its peers raised or hung in the
            # same call of the target's code: the frames of both are the cause.
            frames |= {
                frame.split(": ", 1)[0]
                for f in failures
                if f.kind == "raised"
                for frame in [target_frame(f.detail, own)]
                if frame
            }
        disagreement = getattr(err, "disagreement", "") or ""
        if group == "stuck":
            # The collective the ranks disagree on: a rank that died in it often leaves no frame
            # of the target's (its peers' tracebacks are not kept), a hang names its waits.
            op = _COLLECTIVE.search(disagreement)
            return (group, frames, op.group(1) if op else re.sub(r"\d+", "N", disagreement))
        if frames:
            return (group, frames)
        return (group, re.sub(r"\d+", "N", disagreement) or prop)
    d = result.divergence_of(prop)
    if d is None:
        return (prop,)
    upstream = _FOLLOWS.get(prop, ())
    keys = list(PROPERTIES)
    earlier = [x for x in result.divergences if x.property in upstream and x.step <= d.step]
    if earlier:
        d = min(earlier, key=lambda x: (x.step, keys.index(x.property)))
    return ("diverged", d.property, d.how)


def readings(result) -> list:
    """``result``, then ``result`` led by each other way its first step diverged (Note [Every
    way a step diverged] in ``paracheck.check.properties.equivalence``): each reading's failure
    may be a cause of its own (``cause_keys``)."""
    if result.error is not None:
        return [result]
    seen: set[str] = set()
    others = []
    for d in result.divergences:
        if d.property in seen:
            others.append(d)
        seen.add(d.property)
    return [result, *(result.led_by(d) for d in others)]


def cause_keys(prop: str, result, own: tuple[str, ...] = ()) -> list[tuple]:
    """Every cause ``result``'s failure of ``prop`` comes from, one per reading (``readings``),
    the first reading's first."""
    keys: list[tuple] = []
    for reading in readings(result):
        key = cause_key(prop, reading, own)
        if key not in keys:
            keys.append(key)
    return keys


def reading_of(prop: str, result, key: tuple, own: tuple[str, ...] = ()):
    """The reading of ``result`` (``readings``) that fails ``prop`` with the cause ``key``, or
    None."""
    if prop not in result.failed_properties:
        return None
    return next(
        (r for r in readings(result) if same_cause(cause_key(prop, r, own), key)),
        None,
    )


def cause_of(failure: PropertyFailure) -> tuple:
    """What a failure comes from, as far as its case shows (``cause_key``). Failures of one
    cause are reported as one block (``causes_of``)."""
    return cause_key(failure.property, failure.result, failure.own)


# Within one cause, the block's headline: the most specific property, a hang before a dead rank
# (the hang names the collective the ranks disagree on, and its fix says what to change).
def _headline_rank(f: PropertyFailure) -> tuple:
    keys = list(PROPERTIES)
    if f.property == "hang":
        return (keys.index("died"), 0)
    return (keys.index(f.property) if f.property in keys else len(keys), 1)


def causes_of(failures) -> list[list[PropertyFailure]]:
    """``failures`` grouped by ``cause_of`` and row (Note [Causes, not properties]), in the order
    found (Note [Numbered once, as printed] in ``paracheck.check.table``); within a group, the
    most specific property first (``PROPERTIES`` order, a hang before a dead rank)."""
    groups: list[tuple[str | None, tuple, list[PropertyFailure]]] = []
    for f in failures:
        key = cause_of(f)
        group = next(
            (
                g
                for row, k, g in groups
                if (row == f.row or not by_row(key) or not by_row(k)) and same_cause(k, key)
            ),
            None,
        )
        if group is None:
            groups.append((f.row, key, [f]))
        else:
            group.append(f)
    return [sorted(group, key=_headline_rank) for _, _, group in groups]


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
        hint = diagnosis(err.report())
        if hint:
            out.append(f"  {hint}")
    elif err is not None and f.property in ("hang", "died") and getattr(err, "disagreement", ""):
        from paracheck.world.runner import OUTSIDE

        lead = "" if err.disagreement.startswith(OUTSIDE) else "the ranks disagree: "
        out.append(f"  {lead}{err.disagreement}")
    if err is not None and f.property in ("hang", "died"):
        at = stuck_at(err, f.own)
        if at:
            out.append(f"  at {at}")
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
