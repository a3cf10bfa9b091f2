"""What one failure says, as people and CI read it: the table of properties (``PROPERTIES``,
declared in ``paracheck.check.properties.catalog``: what each means, and what usually fixes it),
a failure of one property (``PropertyFailure``: the
features of its shrunk case it needs, the case, what diverged, a command that replays it), and
the helpers that read a rank's traceback. ``paracheck.check.report`` assembles them into a
check's report."""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field

from paracheck.check.properties.catalog import PROPERTIES, Property, Words
from paracheck.check.run import CaseResult
from paracheck.world._failures import HARNESS_PATHS, LIBRARY_PATHS

__all__ = [
    "PROPERTIES",
    "Property",
    "PropertyFailure",
    "case_line",
    "diagnosis",
    "order",
    "own_fragments",
    "property_info",
    "replay_command",
    "saved_case_path",
    "stuck_at",
    "target_frame",
]


def property_info(name: str, case=None, kind: str | None = None) -> Words | Property:
    """What a failure of ``name`` means and what usually fixes it (a loop case's own words, a
    sharding kind's own terms)."""
    row = PROPERTIES.get(name)
    if row is None:
        return Words(f"the {name} property does not hold", "")
    if case is not None and getattr(case, "loss", "rank-mean") != "rank-mean":
        if row.for_loops is not None:
            return row.for_loops
    return row.for_kinds.get(kind or "", row)


# A tensor of another dtype than its parameter's, handed to torch by the target (a float64
# gradient assigned to a float32 parameter): torch raises in paracheck's call of step() or of
# the comparison, with no frame of the target's, but the mistake is the target's.
_DTYPE_MISMATCH = re.compile(
    r"(assigned grad has data of a different type|assign a gradient with dtype"
    r"|expected (scalar type|dtype) \w+ but found|expected dtype \w+ for .* but got dtype"
    r"|found dtype \w+ but expected|dtype mismatch|must have the same dtype)",
    re.IGNORECASE,
)


def order(props) -> list[str]:
    """``props`` in ``PROPERTIES`` order (unknown ones last, by name)."""
    keys = list(PROPERTIES)
    return sorted(set(props), key=lambda p: (keys.index(p) if p in keys else len(keys), p))


# -- where the target's code raised -----------------------------------------------------------

_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+), in (\S+)\s*$')
# Frames of these are paracheck's harness, never the target's; frames of ``_LIBRARY`` are a
# library's, unless the target itself lives there (``own_fragments``). The rank reads frames by
# the same lists (Note [A rank's traceback] in paracheck.world._failures).
_HARNESS = HARNESS_PATHS
_LIBRARY = LIBRARY_PATHS


def own_fragments(target_path: str) -> tuple[str, ...]:
    """Path fragments of the module a target named by import path comes from (its file, its
    folder where it is a package, and the folder of the package that holds it):
    frames there are the target's own even inside site-packages or torch (a user's package
    installed with ``pip install .``; ``torch.distributed.optim:ZeroRedundancyOptimizer``).
    Nothing for a file target (its frames are outside site-packages already)."""
    module = target_path.rpartition(":")[0]
    if not module or module.endswith(".py") or "/" in module or "\\" in module:
        return ()
    parts = module.split(".")
    whole = "/" + "/".join(parts)
    out = (whole + ".py", whole + "/")
    return out + (("/" + "/".join(parts[:-1]) + "/",) if len(parts) > 1 else ())


def _is_own(path: str, own: tuple[str, ...]) -> bool:
    """Whether a frame's file is the target's own code (``target_frame``'s rule)."""
    path = path.replace("\\", "/")
    return "/paracheck/mutants/" in path or not (
        any(s in path for s in _HARNESS)
        or (any(s in path for s in _LIBRARY) and not any(s in path for s in own))
    )


# A frame of a faulthandler dump: most recent call first, "line N in f" (no comma).
_DUMP_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+) in (\S+)\s*$')


def stack_frames(dump: str, own: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The innermost frame of the target's own code in each thread of a faulthandler dump (a
    hung rank's stack), as "file:line in function", in the dump's order."""
    frames: list[str] = []
    seen = False  # this thread's innermost own frame is taken
    for line in dump.splitlines():
        if line.startswith(("Thread ", "Current thread ")):
            seen = False
            continue
        m = _DUMP_FRAME.match(line)
        if m and not seen and _is_own(m.group(1), own):
            frames.append(f"{m.group(1)}:{m.group(2)} in {m.group(3)}")
            seen = True
    return tuple(frames)


def stuck_at(err, own: tuple[str, ...] = ()) -> str | None:
    """Where in the target's code stuck or dead ranks were, as "file:line in function": the
    innermost own frame of a hung rank's stack, else of a dead rank's peer's traceback (Note [A
    death's peers] in ``paracheck.world._collect``); None where no frame of the target's is
    known."""
    failures = getattr(err, "failures", None) or ()
    for f in failures:
        if f.kind == "hung":
            frames = stack_frames(f.detail, own)
            if frames:
                return frames[0]
    for f in failures:
        if f.kind == "raised":
            frame = target_frame(f.detail, own)
            if frame:
                return frame
    return None


def target_frame(traceback_text: str, own: tuple[str, ...] = ()) -> str | None:
    """The innermost frame of a traceback that is the target's own code (outside paracheck's
    harness, and outside torch, the standard library and site-packages unless under one of the
    ``own`` path fragments: ``own_fragments``), as "file:line in function: source"."""
    lines = traceback_text.splitlines()
    found = None
    for i, line in enumerate(lines):
        m = _FRAME.match(line)
        if not m:
            continue
        if not _is_own(m.group(1), own):
            continue
        src = lines[i + 1].strip() if i + 1 < len(lines) and not _FRAME.match(lines[i + 1]) else ""
        found = f"{m.group(1)}:{m.group(2)} in {m.group(3)}" + (f": {src}" if src else "")
    return found


def _last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1].strip() if lines else ""


def diagnosis(traceback_text: str) -> str | None:
    try:
        from paracheck.check.diagnose import cpu_tensor_on_nccl, cuda_only_call
    except ImportError:
        return None
    try:
        return cuda_only_call(traceback_text) or cpu_tensor_on_nccl(traceback_text)
    except Exception:  # noqa: BLE001 - a diagnosis must never hide the report
        return None


# -- the report objects -------------------------------------------------------------------------


# Where a failure's case is written for its replay command, relative to the working directory
# (beside the example database, ``.paracheck/examples``); without a database, in a folder of the
# temporary directory (``scratch_cases_dir``). Either way the replay names it by its absolute path.
CASES_DIR = os.path.join(".paracheck", "cases")


def scratch_cases_dir() -> str:
    """The folder of the case files of checks without an example database (``--no-database``,
    the pytest plugin's replays): one per user in the temporary directory."""
    import tempfile

    uid = getattr(os, "getuid", lambda: "user")()
    return os.path.join(tempfile.gettempdir(), f"paracheck-cases-{uid}")


def saved_case_path(case, folder: str | None = None) -> str | None:
    """``case`` written as JSON to ``folder/<digest>.json`` (default ``CASES_DIR``; the same case,
    the same file), as an absolute path; None where it cannot be written."""
    text = case.to_json()
    folder = os.path.abspath(CASES_DIR if folder is None else folder)
    path = os.path.join(folder, hashlib.sha1(text.encode()).hexdigest()[:12] + ".json")
    try:
        if not os.path.exists(path):
            os.makedirs(folder, exist_ok=True)
            tmp = f"{path}.{os.getpid()}.tmp"
            with open(tmp, "w") as f:
                f.write(text + "\n")
            os.replace(tmp, path)
    except OSError:
        return None
    return path


def _replayable_name(name: str) -> str:
    """A target's name as a replay command run from any directory finds it: a file's path made
    absolute (``path/to/file.py:C`` names the file from the root of the filesystem)."""
    from paracheck.check.loading import is_file_spec

    module, sep, obj = name.rpartition(":")
    if sep and is_file_spec(module):
        return os.path.abspath(module) + ":" + obj
    return name


def _only_from_here(name: str) -> bool:
    """Whether the package of import path ``name`` is found only through the working directory
    (a project's own package, run from its root): the replay must then run from there too."""
    import importlib.machinery
    import sys

    module = name.rpartition(":")[0]
    if not module or ":" not in name:
        return False
    from paracheck.check.loading import is_file_spec

    if is_file_spec(module):
        return False
    here = os.getcwd()
    elsewhere = [p for p in sys.path if p not in ("", ".", here)]
    top = module.split(".")[0]
    try:
        if importlib.machinery.PathFinder.find_spec(top, elsewhere) is not None:
            return False
        return importlib.machinery.PathFinder.find_spec(top, [here]) is not None
    except (ImportError, ValueError):
        return False


def replay_command(
    target,
    case,
    backend: str = "gloo",
    *,
    timeout: float | None = None,
    rank_memory: float | None = None,
    case_file: str | None = None,
) -> str:
    """The command that replays exactly ``case`` on ``target`` with the options that change the
    verdict: backend, kind (import paths), the selected properties, the hang timeout, the ranks'
    memory cap. It runs from any directory: the case is read from ``case_file`` (else written to
    ``scratch_cases_dir``) by its absolute path, a file target is named by its absolute path, and a
    package found only through the working directory is imported from there (``cd DIR &&``). The
    case's JSON is carried itself only where no file could be written."""
    import shlex

    from paracheck.check.settings import replay_options
    from paracheck.check.targets import BUILTIN_TARGETS

    builtin = target.name in BUILTIN_TARGETS
    name = target.name if builtin else _replayable_name(target.name)
    parts = [f"paracheck check {shlex.quote(name)}", f"--backend {backend}"]
    if not builtin and ":" in target.name:
        parts.append(f"--kind {target.kind}")
    if target.properties is not None:
        parts.append("--properties " + ",".join(sorted(target.properties)))
    options = getattr(target, "cli_options", None)
    extra = options() if callable(options) else ""
    carried = replay_options(timeout=timeout, rank_memory=rank_memory)
    if case_file is None:
        case_file = saved_case_path(case, scratch_cases_dir())
    if case_file is not None:
        given = shlex.quote(os.path.abspath(case_file))
    else:  # nowhere to write: the JSON itself, however long
        given = shlex.quote(case.to_json())
    cd = f"cd {shlex.quote(os.getcwd())} && " if not builtin and _only_from_here(name) else ""
    return cd + " ".join(parts) + carried + extra + f" --case {given}"


def case_line(case) -> str:
    """``case`` in one line (``Case.describe``): world size, model, optimizer and each group's
    hyper-parameters, steps, accumulation, bucket, and every other field not at its default."""
    return case.describe()


@dataclass
class PropertyFailure:
    """One failing property: its shrunk case and the case features the failure needs."""

    property: str
    result: CaseResult
    needs: list[str] | None = None  # feature names (paracheck.check.features); None: not worked out
    fully_shrunk: bool = True
    found_after: int = 0  # cases run before the first case that broke it
    without: str | None = None  # found among cases without this feature (another bug behind it)
    notes: list[str] = field(default_factory=list)
    shrunk: bool = True  # False: a given case, reported as it is
    first: CaseResult | None = None  # the first case found to break it, before shrinking
    own: tuple[str, ...] = ()  # own_fragments of the target's path: where its frames are
    kind: str | None = None  # the target's kind: its failures in its own terms
    row: str | None = None  # the verdict table's row it was found in (None: no table)

    @property
    def case(self):
        return self.result.case

    @property
    def info(self) -> Words | Property:
        return property_info(self.property, self.case, self.kind)

    @property
    def meaning(self) -> str:
        if (
            self.property == "raised"
            and self.result.error is not None
            and self.result.error.failures
        ):
            first = self.result.error.failures[0]
            if _DTYPE_MISMATCH.search(_last_line(first.detail)):
                return (
                    f"your code raised on rank {first.rank}: it gave torch a tensor of another "
                    "dtype than the parameter's (a gradient, a buffer or a shard)"
                )
            if target_frame(first.detail, self.own) is None and "Traceback" in first.detail:
                called_on = getattr(first, "called_on", None)
                if called_on:
                    # torch raised on an object of the target's that paracheck handed it (Note
                    # [Raised on the target's objects] in paracheck.world._blame).
                    return f"your code's objects raised on rank {first.rank}: {called_on}"
                # No frame of the target's own code, and torch raised on no object of its:
                # paracheck's harness raised, which must not be blamed on the target.
                return (
                    f"paracheck's harness raised on rank {first.rank}, with no frame of your code "
                    f"in the traceback: an interface it could not read, or a bug in paracheck "
                    f"(the traceback below says which)"
                )
            return f"your code raised on rank {first.rank}"
        if self._died_in_a_mismatch:
            return (
                "a rank process died in a collective its peer issued with another size (gloo "
                "aborts the process): the ranks disagree on the collectives they issue"
            )
        summary = getattr(self.result.error, "summary", "")  # RankOverMemory's
        if self.property == "memory-cap" and summary:
            return f"{summary}: a resource failure, not a wrong result"
        d = self.result.divergence_of(self.property)
        if self.property == "gradients" and d is not None and d.what == "grad":
            # The headline says what the detail says: a gradient present or absent where the
            # oracle's is not is no averaging mistake.
            if d.detail.startswith("expected no gradient, got a tensor"):
                return (
                    "a gradient is a tensor where the oracle's is None: no rank used the parameter "
                    "(or it is frozen), so its .grad must stay None"
                )
            if d.detail.startswith("expected a gradient, got None"):
                return "a gradient is None where the oracle's is a tensor: some rank used the parameter"
        return self.info.meaning

    @property
    def _died_in_a_mismatch(self) -> bool:
        """Whether a rank died in a collective whose tensors' sizes differ between the ranks (the
        world recorded the disagreement): the hang's cause, not a crash's."""
        err = self.result.error
        return self.property == "died" and bool(getattr(err, "disagreement", ""))

    @property
    def fix(self) -> str:
        """What usually fixes it: the property's hint, or where paracheck's harness raised, how
        to find out what it called; a dtype mistake of the target, its own fix."""
        meaning = self.meaning
        if meaning.startswith("your code's objects raised") and "param_groups lack" in meaning:
            return (
                "keep every key of a torch.optim param group (lr and the optimizer's defaults) in "
                "the target's param_groups: torch's LR schedulers, GradScaler and the user's own "
                "code read them there, not from the optimizer it wraps"
            )
        if meaning.startswith("your code's objects raised"):
            return (
                "torch read or called something of the target's object that it lacks or refuses "
                "(the traceback's last frames say what): give it what torch expects of that object"
            )
        if meaning.startswith("paracheck's harness raised"):
            return (
                "the last frames say what was called: a call into torch or your package from "
                "paracheck's rank program is a way of calling the target that it does not support "
                "(say so in a paracheck issue, with the replay command); replay the case to see it"
            )
        if self._died_in_a_mismatch:
            # One root with the hang at that collective: its fix (Note [A death's peers] in
            # paracheck.world._collect).
            return property_info("hang", self.case, self.kind).hint
        if self.property == "raised" and "another dtype than the parameter's" in self.meaning:
            return (
                "give every gradient, buffer and shard the dtype of its parameter (cast the "
                "reduced gradient back: grad.copy_(reduced) rather than grad = reduced)"
            )
        return self.info.hint

    def labels(self) -> list[str]:
        from paracheck.check.features import label

        return [label(n) for n in self.needs or ()]

    def header(self, target_name: str) -> str:
        return f"FAIL {target_name}: {self.property}: {self.meaning}"

    def text(
        self,
        target,
        backend: str = "gloo",
        *,
        timeout: float | None = None,
        rank_memory: float | None = None,
    ) -> str:
        out = [self.header(target.name)]
        if self.without:
            from paracheck.check.features import label

            out.append(
                f"  found among cases without the feature another failure needs ({label(self.without)[5:]})"
            )
        if self.needs is not None:
            out.append(
                "  needs: "
                + ("; ".join(self.labels()) if self.needs else "nothing beyond the case below")
            )
        if not self.fully_shrunk:
            out.append(
                "  not fully shrunk: the shrinking budget ran out; this is the smallest failing case found"
            )
        out += [f"  note: {n}" for n in self.notes]
        err = self.result.error
        if err is not None and self.property == "raised" and err.failures:
            first = err.failures[0]
            frame = target_frame(first.detail, self.own)
            out.append(f"  {_last_line(first.detail)}")
            if frame:
                out.append(f"  at {frame}")
            hint = diagnosis(err.report())
            if hint:
                out.append(f"  {hint}")
        elif (
            err is not None
            and self.property in ("hang", "died")
            and getattr(err, "disagreement", "")
        ):
            from paracheck.world.runner import OUTSIDE

            lead = "" if err.disagreement.startswith(OUTSIDE) else "the ranks disagree: "
            out.append(f"  {lead}{err.disagreement}")
        if err is not None and self.property in ("hang", "died"):
            at = stuck_at(err, self.own)
            if at:
                out.append(f"  at {at}")
        hint = self.fix
        if hint:
            out.append(f"  fix: {hint}")
        if self.shrunk:
            out.append(f"  first failing case: #{self.found_after + 1}; shrunk case:")
        else:
            out.append("  the case:")
        out.append("    " + self.case.to_json(indent=2).replace("\n", "\n    "))
        out.append("  what failed:" if err is not None else "  what diverged:")
        out.append("    " + self.result.describe(self.property).replace("\n", "\n    "))
        if self.result.outputs and err is None:
            for rank, text in sorted(self.result.outputs.items()):
                out.append(f"  rank {rank} printed:")
                out.append("    " + text.rstrip().replace("\n", "\n    "))
        out.append("  replay exactly this case:")
        out.append(
            "    "
            + replay_command(target, self.case, backend, timeout=timeout, rank_memory=rank_memory)
        )
        return "\n".join(out)

    def to_dict(
        self,
        target,
        backend: str = "gloo",
        *,
        timeout: float | None = None,
        rank_memory: float | None = None,
    ) -> dict:
        d = self.result.divergence_of(self.property)
        return {
            "property": self.property,
            "meaning": self.meaning,
            "needs": None if self.needs is None else list(self.needs),
            "needs_text": self.labels(),
            "fully_shrunk": self.fully_shrunk,
            "found_after": self.found_after,
            "found_without": self.without,
            "notes": list(self.notes),
            "case": self.case.to_dict(),
            "detail": self.result.describe(self.property),
            "divergence": None
            if d is None
            else {
                "step": d.step,
                "what": d.what,
                "rank": d.rank,
                "index": d.index,
                "name": d.name,
                "max_abs_diff": d.max_abs_diff,
                "tolerance": d.tolerance,
                "detail": d.detail,
            },
            "hang": None
            if not (self.result.error is not None and self.property == "hang")
            else {
                "disagreement": getattr(self.result.error, "disagreement", ""),
                "definite": getattr(self.result.error, "definite", False),
            },
            "outputs": {str(k): v for k, v in self.result.outputs.items()},
            "replay": replay_command(
                target, self.case, backend, timeout=timeout, rank_memory=rank_memory
            ),
        }
