"""What one failure says, as people and CI read it: one table of properties (``PROPERTIES``: what
each means, and what usually fixes it), a failure of one property (``PropertyFailure``: the
features of its shrunk case it needs, the case, what diverged, a command that replays it), and
the helpers that read a rank's traceback. ``paracheck.check.report`` assembles them into a
check's report."""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field

from paracheck.check.run import CaseResult

__all__ = [
    "PROPERTIES",
    "Property",
    "PropertyFailure",
    "case_line",
    "order",
    "own_fragments",
    "property_info",
    "replay_command",
    "saved_case_path",
    "target_frame",
]


@dataclass(frozen=True)
class Property:
    meaning: str  # what a failure of it means, in a phrase: the first line of a report
    hint: str  # what usually fixes it


# The properties a check reports, in the order a case that breaks several reports them. The keys
# are ``Divergence.property`` (``paracheck.check.properties.property_of``) and, for rank failures,
# "hang", "raised", "died" and "memory-cap".
PROPERTIES: dict[str, Property] = {
    "raised": Property(
        "your code raised on a rank",
        "the exception is raised in the target's code (its frame is shown first); replay the case "
        "to debug it in one process per rank",
    ),
    "died": Property(
        "a rank process died",
        "look for os._exit, a crash in an extension (the signal is shown), memory exhaustion, or "
        "(gloo::EnforceNotMet) a collective whose tensor differs in size between ranks",
    ),
    "memory-cap": Property(
        "a rank exceeded its memory cap: a resource failure, not a wrong result",
        "the rank's resident memory passed the cap (--rank-memory GB; by default an equal share of "
        "the machine's memory) within this case, on a fresh process: look for tensors kept across "
        "steps (a list appended every step, a loss history that holds the autograd graph); raise "
        "the cap if the case really needs the memory",
    ),
    "hang": Property(
        "the ranks hang: they did not all finish (they disagree on the collectives they issue, or one "
        "never returns)",
        "every rank must issue the same collectives in the same order, with the same sizes and "
        "the same source rank (a partition computed the same way on every rank); decide what to "
        "communicate "
        "from what every rank knows (all-reduce a presence flag), never from one rank's local state "
        "(such as its gradient being None)",
    ),
    "structure": Property(
        "a rank recorded a different number of steps or parameters than the oracle",
        "the target must train every parameter of the module it wraps, for every step",
    ),
    "initial-state": Property(
        "ranks do not start from rank 0's parameters and buffers",
        "broadcast every parameter and every buffer from rank 0 in the constructor",
    ),
    "gradients": Property(
        "gradients not averaged over ranks: a synchronised .grad differs from the oracle's average",
        "after finish_gradient_synchronization(), every trainable parameter's .grad must be the "
        "sum over ranks divided by the world size, on every rank (None where no rank had one)",
    ),
    "float64-bound": Property(
        "a synchronised gradient is further from the exact (float64) gradient than rounding in "
        "the case's precision can move it",
        "the gradient must be the average over ranks of the local gradients the case's program "
        "computes: compute the forward and backward in the precision asked, and reduce in the "
        "gradients' dtype or wider",
    ),
    "bucket-structure": Property(
        "the all-reduce calls do not respect bucket_size_mb",
        "pack gradients into buckets of at most bucket_size_mb * 2**20 bytes (a larger "
        "parameter alone), reduce each gradient exactly once, and do not split buckets "
        "further than the cap requires",
    ),
    "parameters": Property(
        "parameters after a step differ from the oracle's",
        "the update is wrong although the gradients were right: check the optimizer's groups "
        "and hyper-parameters, and (sharded) the broadcast of updated parameters from their owner",
    ),
    "master-weights": Property(
        "a float32 master weight differs from the oracle's: the update was not applied to a "
        "float32 copy of the parameter",
        "keep a float32 master of every bfloat16 parameter the optimizer steps, step the masters "
        "on the gradients cast to float32, then copy each master into its parameter; "
        "master_params() returns them, one per parameter of param_groups",
    ),
    "optimizer-state": Property(
        "optimizer state differs from the oracle's",
        "the state every rank's state_dict() returns (its own shard, or every shard "
        "consolidated) must equal the oracle's, keyed as a single-process optimizer keys it; "
        "ranks returning the same parameter's state must agree",
    ),
    "state-consolidated": Property(
        "the consolidated optimizer state differs from the oracle's",
        "consolidate every rank's shard into state_dict(), on every rank",
    ),
    "rank-agreement": Property(
        "ranks disagree: their parameters after a step are not bitwise identical",
        "every rank must apply the same update to the same values (reduce, then update; "
        "broadcast from one owner)",
    ),
    "memory": Property(
        "a rank holds other optimizer-state bytes than its declared partition implies, or "
        "(no partition declared) two ranks step the same parameter's state",
        "each rank must hold and step optimizer state for the parameters it owns, and only those",
    ),
    "balance": Property(
        "the partition breaks its balance bound or does not own every parameter exactly once",
        "partition the trainable parameters by size (frozen ones weigh nothing), every one "
        "owned by exactly one rank",
    ),
    "traffic": Property(
        "a step's collectives differ from the analytic communication model",
        "communicate only trainable parameters, once per step, with the collectives the "
        "design calls for",
    ),
    "grads-sharded": Property(
        "a ZeRO-2 rank keeps more gradient than its shard after the synchronisation",
        "after finish_gradient_synchronization(), keep only this rank's reduce-scattered piece of "
        "each gradient: free (set to None, or resize to 0) the full-size gradients and buffers",
    ),
    "params-sharded": Property(
        "an FSDP rank holds whole parameters where it should hold only its shards",
        "between the layers' gathers, keep each parameter as this rank's shard only: free the "
        "gathered tensor after the layer's forward and backward, and keep no view of it",
    ),
    "reduced-once": Property(
        "a gradient was communicated more than once per synchronised backward, or inside no_sync()",
        "reduce each parameter's gradient once per synchronised backward (sum a tied weight's "
        "uses locally first) and keep gradients local inside no_sync()",
    ),
    "freed": Property(
        "whole parameters gathered during a step are still held after its backward",
        "free every gathered parameter after its layer's forward and again after its backward "
        "(drop every reference, or resize its storage to zero)",
    ),
    "gathered-layers": Property(
        "more modules' parameters were gathered at once than the prefetch depth allows",
        "gather at most prefetch modules ahead of the running one, and free each module's "
        "parameters after use (Note [Gathered layers and the prefetch depth])",
    ),
    "gather-dtype": Property(
        "parameters were all-gathered in another dtype than the compute dtype",
        "cast each shard to the compute dtype before its all-gather, not the gathered "
        "parameter after it (Note [Gathering in the compute dtype])",
    ),
    "reduce-dtype": Property(
        "gradients were communicated in another dtype than the one the target declares",
        "cast the gradients to the declared dtype before the all-reduce (not after it), and "
        "reduce every gradient in it (Note [Declared reduction dtype])",
    ),
    "world-size-relation": Property(
        "W ranks fed equal batches do not train like one rank fed all of them",
        "average the summed gradients over the world size, and reduce every trainable "
        "parameter's gradient",
    ),
    "bucket-size-independence": Property(
        "the result depends on bucket_size_mb",
        "every bucket, the last partly filled one included, must be reduced and copied back "
        "whatever the cap",
    ),
    "repeatability": Property(
        "two runs of the same case differ bitwise: the result cannot be reproduced",
        "reduce in an order fixed by the ranks and buckets, not by when contributions arrive; "
        "wait for every communication before reading its buffer; avoid atomics and "
        "nondeterministic kernels (torch.use_deterministic_algorithms)",
    ),
}


# A training loop's step is judged whole (the ``loop`` kind): its gradients are what it hands
# ``optimizer.step()``, the declared loss's gradient over every rank's micro-batches.
LOOP_PROPERTIES: dict[str, Property] = {
    "gradients": Property(
        "the gradients optimizer.step() was given differ from the declared loss's gradient over "
        "every rank's micro-batches",
        "normalise the loss as declared (--loss token-mean: each micro-batch's summed loss over "
        "the valid tokens of the whole step on every rank, then sum the gradients over ranks; "
        "batch-mean: the mean over ranks and micro-batches), synchronise before clipping, "
        "unscale before clipping",
    ),
}


# A sharded optimizer's or a ZeRO wrapper's failures in its own terms: its owners, broadcasts and
# zero_grad(), not a DDP's finish_gradient_synchronization().
_SHARDED_GRADIENTS = Property(
    "the gradients step() was given differ from the oracle's average over ranks",
    "zero_grad() must clear the .grad of every parameter given to the optimizer, on every rank, "
    "not only those of the parameters this rank owns (a stale gradient adds into the next step's)",
)
_ZERO_GRADIENTS = Property(
    "a gradient after the wrapper's synchronisation differs from the oracle's average over ranks",
    "the gradient each owner steps must be the sum over ranks divided by the world size "
    "(reduce-scatter, or reduce to the owner), and zero_grad() must clear every parameter of the "
    "module, not only this rank's shard",
)
_OWNED_PARAMETERS = Property(
    "parameters after a step differ from the oracle's",
    "each parameter must be stepped by its owner alone, with its group's hyper-parameters, then "
    "broadcast from that owner (src: the owner's global rank) to every rank after every step, "
    "the groups added by add_param_group included",
)
KIND_PROPERTIES: dict[str, dict[str, Property]] = {
    "sharded": {"gradients": _SHARDED_GRADIENTS, "parameters": _OWNED_PARAMETERS},
    "zero": {"gradients": _ZERO_GRADIENTS, "parameters": _OWNED_PARAMETERS},
    "zero2": {"gradients": _ZERO_GRADIENTS, "parameters": _OWNED_PARAMETERS},
}


def property_info(name: str, case=None, kind: str | None = None) -> Property:
    """What a failure of ``name`` means and what usually fixes it (a loop case's own words, a
    sharding kind's own terms)."""
    if case is not None and getattr(case, "loss", "rank-mean") != "rank-mean":
        if name in LOOP_PROPERTIES:
            return LOOP_PROPERTIES[name]
    if name in KIND_PROPERTIES.get(kind or "", {}):
        return KIND_PROPERTIES[kind][name]
    return PROPERTIES.get(name, Property(f"the {name} property does not hold", ""))


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
# Frames of these are paracheck's harness, never the target's.
_HARNESS = (
    "/paracheck/check/",
    "/paracheck/world/",
    "/paracheck/oracle/",
    "/paracheck/cases/",
    "/paracheck/workloads/",
    "/paracheck/accounting/",
)
# Frames of these are a library's, unless the target itself lives there (``own_fragments``).
_LIBRARY = ("/torch/", "/site-packages/", "/dist-packages/", "/lib/python3", "<frozen", "<string>")


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
        path = m.group(1).replace("\\", "/")
        if "/paracheck/mutants/" not in path and (
            any(s in path for s in _HARNESS)
            or (any(s in path for s in _LIBRARY) and not any(s in path for s in own))
        ):
            continue
        src = lines[i + 1].strip() if i + 1 < len(lines) and not _FRAME.match(lines[i + 1]) else ""
        found = f"{m.group(1)}:{m.group(2)} in {m.group(3)}" + (f": {src}" if src else "")
    return found


def _last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1].strip() if lines else ""


def _diagnosis(traceback_text: str) -> str | None:
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
# (beside the example database, ``.paracheck/examples``).
CASES_DIR = os.path.join(".paracheck", "cases")


def saved_case_path(case) -> str | None:
    """``case`` written as JSON to ``CASES_DIR/<digest>.json`` (the same case, the same file);
    None where it cannot be written (the replay command then carries the JSON itself)."""
    text = case.to_json()
    path = os.path.join(CASES_DIR, hashlib.sha1(text.encode()).hexdigest()[:12] + ".json")
    try:
        if not os.path.exists(path):
            os.makedirs(CASES_DIR, exist_ok=True)
            with open(path + ".tmp", "w") as f:
                f.write(text + "\n")
            os.replace(path + ".tmp", path)
    except OSError:
        return None
    return path


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
    memory cap."""
    from paracheck.check.settings import replay_options
    from paracheck.check.targets import BUILTIN_TARGETS

    parts = [f"paracheck check {target.name}", f"--backend {backend}"]
    if target.name not in BUILTIN_TARGETS and ":" in target.name:
        parts.append(f"--kind {target.kind}")
    if target.properties is not None:
        parts.append("--properties " + ",".join(sorted(target.properties)))
    options = getattr(target, "cli_options", None)
    extra = options() if callable(options) else ""
    carried = replay_options(timeout=timeout, rank_memory=rank_memory)
    given = case_file if case_file is not None else f"'{case.to_json()}'"
    return " ".join(parts) + carried + extra + f" --case {given}"


def case_line(case) -> str:
    """``case`` in one line: world size, model, optimizer and groups, steps, accumulation, bucket."""
    m = case.model
    model = f"{m.kind}" + (f"{list(m.widths)}" if m.kind == "mlp" else "")
    groups = len(case.optimizer.groups)
    loss = getattr(case, "loss", "rank-mean")
    if loss != "rank-mean":  # a training loop's case: no bucket; its loss and windows
        return (
            f"W={case.world_size} {model} {case.optimizer.name}x{groups}g steps={case.steps} "
            f"acc={case.accumulation} loss={loss}"
            + (" padded" if case.padded else "")
            + (" empty-micro" if case.empty_micro else "")
            + (f" last-window={case.last_window}" if case.last_window is not None else "")
            + (f" clip={case.clip_norm:g}" if case.clip_norm is not None else "")
        )
    return (
        f"W={case.world_size} {model} {case.optimizer.name}x{groups}g steps={case.steps} "
        f"acc={case.accumulation} bucket="
        + ("None" if case.unbounded_bucket else f"{case.bucket_size_mb or 25.0:.2g}MB")
        + (f" prefetch={case.prefetch}" if getattr(case, "prefetch", 0) else "")
        + (" compute=bfloat16" if getattr(case, "masters_from_float32", False) else "")
        + (
            f" delay={case.delay_at}@r{case.delay_rank}:{case.delay_s * 1e3:g}ms"
            if getattr(case, "delay_at", None)
            else ""
        )
    )


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
    def info(self) -> Property:
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
                # No frame of the target's own code: paracheck's harness raised while reading
                # it, which must not be blamed on the target.
                return (
                    f"paracheck's harness raised on rank {first.rank}, with no frame of your code "
                    f"in the traceback: an interface it could not read, or a bug in paracheck "
                    f"(the traceback below says which)"
                )
            return f"your code raised on rank {first.rank}"
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
    def fix(self) -> str:
        """What usually fixes it: the property's hint, or where paracheck's harness raised, how
        to find out what it called; a dtype mistake of the target, its own fix."""
        if self.meaning.startswith("paracheck's harness raised"):
            return (
                "the last frames say what was called: a call into torch or your package from "
                "paracheck's rank program is a way of calling the target that it does not support "
                "(say so in a paracheck issue, with the replay command); replay the case to see it"
            )
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
            hint = _diagnosis(err.report())
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
