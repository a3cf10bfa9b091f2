"""``paracheck selftest``: the harness against its own catalogue of broken implementations.

Trust in a pass comes from showing that the same check fails on known bugs. For every mutant in
``paracheck.mutants`` and every built-in target, run the default check; print a table (name,
verdict, examples needed, seconds, shrunk case in one line) and the kill rate. Exit 0 only if
every mutant is killed and every built-in target passes.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import replace

__all__ = [
    "margin",
    "margin_text",
    "markdown_table",
    "mutant_target",
    "row_line",
    "run_selftest",
    "selftest_rows",
    "selftest_settings",
]


def selftest_rows(
    *,
    profile: str = "ci",
    only=None,
    world_sizes=None,
    timeout: float = 10.0,
    world=None,
    max_examples: int | None = None,
    dtype: str = "float64",
):
    """Yield one row per mutant / built-in target: dict(name, kind, expected, verdict, ok, examples, seconds, case).
    ``world_sizes`` None: the plan's default (``paracheck.check.plan``)."""
    from paracheck.check.kinds import KINDS
    from paracheck.check.plan import world_sizes as planned_world_sizes
    from paracheck.check.property import check_target
    from paracheck.check.report import case_line
    from paracheck.check.settings import PROFILES
    from paracheck.check.targets import BUILTIN_TARGETS, resolve_target
    from paracheck.mutants import MUTANTS
    from paracheck.world import World

    n = max_examples or PROFILES[profile]["max_examples"]
    if only is not None:
        known = set(BUILTIN_TARGETS) | set(MUTANTS)
        unknown = sorted(set(only) - known)
        if unknown or not only:
            raise ValueError(
                f"only={sorted(only)!r}: {'no names' if not only else f'unknown {unknown}'}; "
                f"choose among the built-in targets (paracheck.check.targets.BUILTIN_TARGETS) "
                f"and the mutants (paracheck.mutants.MUTANTS)"
            )
    settings = selftest_settings(world_sizes, max_examples=n, timeout=timeout, dtype=dtype)
    own = world is None
    world = world or World(max(planned_world_sizes(settings)), timeout=timeout)
    try:
        items = [("target", name, resolve_target(name), None) for name in BUILTIN_TARGETS]
        items += [
            ("mutant", m.name, mutant_target(m), m.precision)
            for m in MUTANTS.values()
            if m.kind in KINDS
        ]
        for role, name, target, precision in items:
            if only and name not in only:
                continue
            t0 = time.monotonic()
            # A mutant's own precision replaces the selftest's dtype.
            report = check_target(target, world, settings.replace(precision=precision))
            seconds = time.monotonic() - t0
            if role == "target":
                ok = report.passed
                verdict = "pass" if ok else "FAIL"
            else:
                ok = not report.passed
                how = f" ({report.failures[0].property})" if report.failures else ""
                verdict = ("killed" + how) if ok else "SURVIVED"
            yield {
                "role": role,
                "name": name,
                "ok": ok,
                "verdict": verdict,
                "examples": report.examples,
                "seconds": seconds,
                "case": case_line(report.failure.case) if report.failure is not None else "",
                "detail": report.failures[0].header(name) if report.failures else "",
                "properties": [f.property for f in report.failures],
                "margin": margin(report.failures[0]) if report.failures else None,
                "margin_found": margin(report.failures[0], found=True) if report.failures else None,
            }
    finally:
        if own:
            world.close()


# Note [Two margins]
#   A mutant's margin is read on two cases: the first case of the search that broke the property
#   ("found": a case as the strategy draws them, where the bug shows as it would in use) and the
#   case Hypothesis shrank it to ("shrunk"). Shrinking makes the case small, not the error large:
#   where a bug's effect is continuous in what shrinks (a learning rate, two nearly equal
#   gradients, a 1x1 layer), the smallest failing case is one whose error only just passes the
#   tolerance, and its margin tends to 1 however tight the tolerance is; the tighter the
#   tolerance, the further shrinking goes. The found margin says how far past the tolerance the
#   bug lands where it first shows; the shrunk one, how small a case still shows it.
def margin(failure, *, found: bool = False) -> float | None:
    """How far past its tolerance the killing divergence went: ``max |got - expected|`` over the
    largest allowed difference on the shrunk case, or with ``found`` on the first case found to
    break the property (Note [Two margins]; a lower bound on the worst element's ratio). inf
    ("exact") where the property is an exact rule or nothing could be compared numerically (a
    tensor absent, or not finite where the oracle's is); None where the target raised, hung or
    died."""
    from paracheck.check.properties.catalog import PROPERTIES

    result = failure.result
    if found and getattr(failure, "first", None) is not None:
        result = failure.first
    d = result.divergence_of(failure.property)
    if d is None or result.error is not None:
        return None
    # An exact rule's margin is "exact" (``Property.toleranced``).
    row = PROPERTIES.get(failure.property)
    exact = row is None or not row.toleranced
    if exact or d.tolerance <= 0 or d.max_abs_diff != d.max_abs_diff:
        return float("inf")
    return d.max_abs_diff / d.tolerance


def margin_text(value: float | None) -> str:
    """``margin`` for a table: "2.5e+02", "exact" (inf) or "-" (None)."""
    if value is None:
        return "-"
    return "exact" if value == float("inf") else f"{value:.1e}"


def markdown_table(rows: list[dict], dtype: str) -> str:
    """The mutants of ``rows`` as a Markdown table: what is wrong, the property that killed it, the
    examples needed and the margins (error over tolerance, ``margin``) at ``dtype``: on the case
    found, and on the shrunk case (Note [Two margins])."""
    from paracheck.mutants import MUTANTS

    out = [
        f"| mutant | kind | bug | killed by | examples | margin found ({dtype}) "
        f"| margin shrunk ({dtype}) |",
        "| --- | --- | --- | --- | ---: | ---: | ---: |",
    ]
    for row in rows:
        if row["role"] != "mutant":
            continue
        m = MUTANTS[row["name"]]
        by = row["properties"][0] if row["ok"] and row["properties"] else row["verdict"]
        out.append(
            f"| `{m.name}` | {m.kind} | {m.bug} | {by} | {row['examples']} | "
            f"{margin_text(row.get('margin_found'))} | {margin_text(row.get('margin'))} |"
        )
    return "\n".join(out) + "\n"


def selftest_settings(
    world_sizes=None, *, max_examples: int, timeout: float = 10.0, dtype="float64"
):
    """The selftest's ``CheckSettings``: ``check_target``'s defaults (Note [One set of defaults]:
    one search over the whole contract, the same cases as the figures of the mutants were
    measured on, no time budget, seed 0, no example database; a mutant is killed by its first
    failing property: the rest of the search is not needed) at ``world_sizes`` (None: the plan's
    default), ``max_examples``, ``timeout`` and ``dtype``; the kind's cases built for a bug
    run first, as the verdict table of ``paracheck check`` runs them (``first_cases``)."""
    from paracheck.check.settings import CheckSettings

    return CheckSettings(
        world_sizes=world_sizes,
        max_examples=max_examples,
        timeout=timeout,
        dtype=dtype,
        first_cases=True,
    )


def mutant_target(m):
    """The ``Target`` a mutant is checked as: of a kind whose targets declare options (a loop:
    ``Kind.options``), with those its function declares (the loss semantics and clip); any other
    with the properties the mutant names and the reduction dtype its class declares
    (``paracheck_reduce_dtype``)."""
    from paracheck.check.kinds import KINDS
    from paracheck.check.targets import Target, resolve_target, with_reduce_dtype

    if KINDS[m.kind].options:
        return replace(resolve_target(m.path, m.kind), name=m.name)
    props = None if m.properties is None else frozenset(m.properties)
    return with_reduce_dtype(Target(m.name, m.path, m.kind, _takes_bucket(m.path), props))


def _takes_bucket(path: str) -> bool:
    from paracheck.check.targets import resolve_target

    try:
        return resolve_target(path).takes_bucket
    except Exception:  # noqa: BLE001
        return False


def row_line(row: dict) -> str:
    """One row of the table: name, role, verdict, examples, seconds, the margins on the case found
    and the shrunk case (error over tolerance, ``margin_text``) and the shrunk case."""
    return (
        f"{row['name']:34} {row['role']:7} {row['verdict']:24} {row['examples']:>8} "
        f"{row['seconds']:>8.1f} {margin_text(row.get('margin_found')):>8} "
        f"{margin_text(row.get('margin')):>8}  {row['case']}"
    ).rstrip()


def run_selftest(
    *,
    profile="ci",
    only=None,
    world_sizes=None,
    timeout=10.0,
    world=None,
    dtype="float64",
    max_examples: int | None = None,
    rows: list | None = None,
) -> int:
    """Print the table and the kill rate; 0 when every mutant is killed and every built-in target
    passes. ``rows`` receives each row as it is printed (a caller that is interrupted reports
    them)."""
    t0 = time.monotonic()
    rows = [] if rows is None else rows
    print(
        f"{'name':34} {'role':7} {'verdict':24} {'examples':>8} {'seconds':>8} {'found':>8} "
        f"{'shrunk':>8}  shrunk case"
    )
    for row in selftest_rows(
        profile=profile,
        only=only,
        world_sizes=world_sizes,
        timeout=timeout,
        world=world,
        dtype=dtype,
        max_examples=max_examples,
    ):
        rows.append(row)
        print(row_line(row), flush=True)
    mutants = [r for r in rows if r["role"] == "mutant"]
    targets = [r for r in rows if r["role"] == "target"]
    killed = [r for r in mutants if r["ok"]]
    print()
    if mutants:
        med = statistics.median(r["examples"] for r in killed) if killed else float("nan")
        print(
            f"kill rate: {len(killed)}/{len(mutants)} = {100 * len(killed) / len(mutants):.0f}%; "
            f"median examples to kill: {med}"
        )
    print(
        f"built-in targets passing: {sum(r['ok'] for r in targets)}/{len(targets)}; "
        f"total {time.monotonic() - t0:.1f} s"
    )
    return 0 if all(r["ok"] for r in rows) else 1
