"""What a check found, as people and CI read it: one table of properties, the report objects,
their text (``CheckReport.text()``) and JSON (``CheckReport.to_dict()``).

Every failure is reported as the property it breaks (``PROPERTIES``: what the property means,
and what usually fixes it), the features of the shrunk case it needs
(``paracheck.check.features``), the case itself, what diverged, and a command that replays it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from paracheck.check.run import CaseResult

__all__ = [
    "PROPERTIES",
    "Property",
    "PropertyFailure",
    "CheckReport",
    "case_line",
    "case_report",
    "replay_command",
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


def property_info(name: str, case=None) -> Property:
    """What a failure of ``name`` means and what usually fixes it (a loop case's own words)."""
    if case is not None and getattr(case, "loss", "rank-mean") != "rank-mean":
        if name in LOOP_PROPERTIES:
            return LOOP_PROPERTIES[name]
    return PROPERTIES.get(name, Property(f"the {name} property does not hold", ""))


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
    "/paracheck/cases.py",
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


def replay_command(
    target,
    case,
    backend: str = "gloo",
    *,
    timeout: float | None = None,
    rank_memory: float | None = None,
) -> str:
    """The command that replays exactly ``case`` on ``target`` with the options that change the
    verdict: backend, kind (import paths), the selected properties, the hang timeout, the ranks'
    memory cap."""
    from paracheck.check.targets import BUILTIN_TARGETS

    parts = [f"paracheck check {target.name}", f"--backend {backend}"]
    if target.name not in BUILTIN_TARGETS and ":" in target.name:
        parts.append(f"--kind {target.kind}")
    if target.properties is not None:
        parts.append("--properties " + ",".join(sorted(target.properties)))
    if timeout is not None:
        parts.append(f"--timeout {timeout:g}")
    if rank_memory is not None:
        parts.append(f"--rank-memory {rank_memory:g}")
    options = getattr(target, "cli_options", None)
    extra = options() if callable(options) else ""
    return " ".join(parts) + extra + f" --case '{case.to_json()}'"


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

    @property
    def case(self):
        return self.result.case

    @property
    def meaning(self) -> str:
        if (
            self.property == "raised"
            and self.result.error is not None
            and self.result.error.failures
        ):
            first = self.result.error.failures[0]
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
        return property_info(self.property, self.case).meaning

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
        hint = property_info(self.property, self.case).hint
        if self.meaning.startswith("paracheck's harness raised"):
            hint = (
                "the last frames say what was called: a call into torch or your package from "
                "paracheck's rank program is a way of calling the target that it does not support "
                "(say so in a paracheck issue, with the replay command); replay the case to see it"
            )
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


@dataclass
class CheckReport:
    """The verdict of ``check_target``: every failing property, each with its own shrunk case."""

    target: object
    passed: bool
    examples: int  # cases run before the first failure (or in total when passed)
    seconds: float
    failures: list[PropertyFailure] = field(default_factory=list)
    worst_ratio: float = 0.0
    world_sizes: tuple[int, ...] = ()
    notes: list[str] = field(default_factory=list)
    cases_run: int = 0  # distinct cases run, shrinking and labelling included
    timeout: float | None = None  # the hang timeout the replay commands carry
    # The example database (paracheck.check.database): its directory (None: none), the saved
    # cases run before the search, those of them dropped because they pass now, the cases saved.
    database: str | None = None
    replayed: int = 0
    dropped: int = 0
    saved: int = 0
    rank_memory: float | None = None  # the ranks' memory cap (GB) the replay commands carry
    # The largest ratio of a gradient's difference from the float64 gradient to its bound over
    # the cases the float64-bound property judged (None: none judged).
    worst_bound: float | None = None

    @property
    def failure(self) -> CaseResult | None:
        """The first failing property's shrunk case (None when passed)."""
        return self.failures[0].result if self.failures else None

    def saved_cases(self) -> str:
        """What the example database did: "replayed 1 saved case (passes now: dropped)"."""
        out = []
        if self.replayed:
            s = "" if self.replayed == 1 else "s"
            text = f"replayed {self.replayed} saved case{s} first"
            if self.dropped:
                text += (
                    f" ({'it passes' if self.replayed == 1 else f'{self.dropped} pass'} now: "
                    "dropped)"
                )
            out.append(text)
        if self.saved:
            s = "" if self.saved == 1 else "s"
            out.append(f"saved {self.saved} failing case{s} in {self.database}")
        return "; ".join(out)

    def summary(self) -> str:
        extra = self.saved_cases()
        extra = f"; {extra}" if extra else ""
        bound = (
            ""
            if self.worst_bound is None
            else f", float64 bound reached at most {self.worst_bound:.2f} of its allowance"
        )
        if self.passed and self.cases_run == 1 and self.examples == 1 and not self.replayed:
            return f"PASS {self.target.name}: the given case"
        if self.passed:
            return (
                f"PASS {self.target.name}: {self.examples} cases, world sizes {list(self.world_sizes)}, "
                f"{self.seconds:.1f} s, worst relative error {self.worst_ratio:.1e}{bound}{extra}"
            )
        props = ", ".join(
            f.property + (f" (without {f.without})" if f.without else "") for f in self.failures
        )
        return (
            f"FAIL {self.target.name}: {len(self.failures)} failing propert{'y' if len(self.failures) == 1 else 'ies'} "
            f"({props}); first found after {self.examples} case(s), {self.cases_run} cases run in "
            f"{self.seconds:.1f} s{extra}"
        )

    def text(self, backend: str = "gloo") -> str:
        out = [self.summary()]
        out += [f"  note: {n}" for n in self.notes]
        for f in self.failures:
            out.append(
                f.text(self.target, backend, timeout=self.timeout, rank_memory=self.rank_memory)
            )
        return "\n".join(out)

    def to_dict(self, backend: str = "gloo") -> dict:
        return {
            "target": self.target.name,
            "path": self.target.path,
            "kind": self.target.kind,
            "passed": self.passed,
            "first_failure_at_case": None if self.passed else self.examples,
            "cases_run": self.cases_run,
            "seconds": round(self.seconds, 3),
            "world_sizes": list(self.world_sizes),
            "worst_relative_error": self.worst_ratio,
            "worst_float64_bound_ratio": self.worst_bound,
            "failed_properties": [f.property for f in self.failures],
            "failures": [
                f.to_dict(self.target, backend, timeout=self.timeout, rank_memory=self.rank_memory)
                for f in self.failures
            ],
            "notes": list(self.notes),
            "database": None
            if self.database is None
            else {
                "path": self.database,
                "replayed": self.replayed,
                "dropped": self.dropped,
                "saved": self.saved,
            },
        }


def case_report(
    target, result: CaseResult, *, timeout: float | None = None, rank_memory: float | None = None
) -> CheckReport:
    """The report of one given case (``paracheck check --case``): every property it breaks, as is."""
    failures = [
        PropertyFailure(
            p, result, None, True, 0, None, [], shrunk=False, own=own_fragments(target.path)
        )
        for p in order(result.failed_properties)
    ]
    return CheckReport(
        target,
        result.ok,
        1,
        result.seconds,
        failures,
        result.worst_ratio,
        (result.case.world_size,),
        # A case the target declares out of its interface is not run: say so, never a bare pass.
        [f"not supported, not run: {result.extra['skipped']}"]
        if (result.extra or {}).get("skipped")
        else [],
        cases_run=1,
        timeout=timeout,
        rank_memory=rank_memory,
    )
