"""``paracheck gate --base REF [--head REF] [TARGET ...]``: a merge gate that catches real
regressions and stays quiet on noise, in any git repository.

What it measures. With TARGETs (import paths ``package.module:Class`` of DDP wrappers, sharded
optimizers or ZeRO classes, as ``paracheck check`` takes them) each target trains the built-in LM
workload at both commits, measured by the *installed* paracheck: the repository (not paracheck's
own) is exported at each commit and that tree (``<tree>/src`` too when it exists) goes first on
``PYTHONPATH``, so ``import package`` finds the commit's code and ``import paracheck`` the
installed one. Without TARGETs, in paracheck's own repository, every built-in variant is measured
by each commit's own paracheck (``PYTHONPATH=<tree>/src``).

How it measures. Each commit's tree is exported with ``git archive`` (the repository's working
tree, index and refs are not touched) and gets its own worker process
(``paracheck.gate._worker``; Note [One worker per tree] in
``paracheck.gate.run``) and its own persistent ``World``, so each side runs its own code on
the same machine at the same time of day. The workers take turns job by job: round r measures
every variant on base then head when r is even, head then base when r is odd (ABBA), so a machine
that slows down or speeds up during the run affects both sides alike. asv is not used for this:
``asv continuous`` installs each commit into an environment (minutes per commit), runs the commits
one after the other rather than job by job, and its per-benchmark process start would dominate
our short jobs.

Note [The gate rule]
    * Exact quantities (Note [Exact quantities] in ``paracheck.accounting``: collectives,
      payload bytes and bus bytes per step, optimizer-state bytes per rank, peak tensor bytes
      during init / forward-backward-sync / optimizer step, per variant; a checkpoint's bytes
      written and read per rank and the peak while it loads, Note [Checkpoint bytes] in
      ``paracheck.bench._checkpoint``; the host cost of a
      step, Note [Host cost per step] in ``paracheck.accounting.record``: operators dispatched,
      launches, allocations, Python hook calls; the communication schedule, Note [Communication
      schedule of a step] in ``paracheck.accounting.schedule``: device syncs, waits inside
      backward, launches and bytes after backward, exposed communication under the stated links,
      a regression row naming the collective that moved or where a sync or wait was added (its
      host calls are reported by ``paracheck bench``, not gated); on CUDA also the
      allocator's peaks of Note [CUDA memory points]) are measured twice per side, in the first
      round and after the last. They FAIL on any increase, however small. A side whose two readings
      differ is reported UNSTABLE (a warning: that quantity is then not exact and is not gated).
    * Timings, per variant. A job times ``steps`` steps (per step the slowest rank) and keeps
      its fastest step: load from other processes only ever adds time, so the fastest step is
      the reading least disturbed by it. What is timed is wall time by default (``--timing
      wall``): a slowdown that blocks (a sleep, a wait on a lock or a collective, I/O) shows in
      wall time only, a CPU-bound one in both. ``--timing cpu`` times the rank processes' CPU
      time instead (blind to blocking slowdowns; steadier where the machine is shared).
    * One untimed job per side and variant first (a fresh worker's first job pays for imports
      and first connections), then interleaved rounds: round r runs base then head when r is
      even, head then base when odd, and gives one ratio head/base of two jobs run back to back
      (a load that drifts affects both alike). After every second round each undecided variant
      is judged by Note [Sequential sign test] in ``paracheck.gate.rule``: REGRESSION once a
      confidence interval on the median of its ratios lies wholly above ``1 + threshold``
      (default 0.10), ok once wholly below it ("faster" when below ``1 - threshold``, reported,
      never a failure). A decided variant is measured no more. The workers and their ranks are
      restarted every ``fresh_every`` rounds (a process's own luck, where the loader and
      allocator put things and which cores its ranks share, can bias one side for its whole
      life). Rounds stop when every variant is decided or the budget ends (``--rounds``, the
      most rounds, and ``--seconds``); a variant still undecided is INCONCLUSIVE, its interval
      and the spread of its ratios printed. The ratio of the two sides' fastest jobs is
      reported, not judged: one side's fastest job is an extreme value, it says more about one
      quiet moment than about the code (on 2-core slices of a shared machine, judging it too
      missed 12 of 82 planted 25% slowdowns).
    * Verdict: FAIL (exit 1) when an exact quantity or a timing regressed (exact quantities
      decide on their own, whatever the timings' noise), else INCONCLUSIVE (exit 3, or as
      ``--inconclusive fail|pass`` says) when a timing is undecided, else PASS (exit 0); exit 2
      when the gate cannot measure (an unknown ref, a target that does not import at head, a
      rank that raised). ``--json PATH`` writes the verdict and every reading, also when the
      gate cannot measure; ``--history DIR`` records the readings for ``paracheck report``.
    * How often this rule FAILs identical commits and how often it catches a planted slowdown
      on a given machine: ``python scripts/gate_operating.py`` (``scripts/load.py`` loads the
      machine meanwhile).
"""

from paracheck.gate.rule import (
    DEFAULT_ROUNDS,
    ERROR_RATE,
    EXACT_QUANTITIES,
    GateRow,
    PassTiming,
    RatioDecision,
    SequentialPlan,
    decide_ratio,
    exact_verdict,
    format_rows,
    sequential_plan,
)
from paracheck.gate.run import GateConfig, GateError, run_gate

__all__ = [
    "DEFAULT_ROUNDS",
    "ERROR_RATE",
    "EXACT_QUANTITIES",
    "GateConfig",
    "GateError",
    "GateRow",
    "PassTiming",
    "RatioDecision",
    "SequentialPlan",
    "decide_ratio",
    "exact_verdict",
    "format_rows",
    "run_gate",
    "sequential_plan",
]
