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
      during init / forward-backward-sync / optimizer step, per variant; the host cost of a
      step, Note [Host cost per step] in ``paracheck.accounting.record``: operators dispatched,
      launches, allocations, Python hook calls; the communication schedule, Note [Communication
      schedule of a step] in ``paracheck.accounting.schedule``: device syncs, waits inside
      backward, launches and bytes after backward, exposed communication under the stated links,
      a regression row naming the collective that moved or where a sync or wait was added (its
      host calls are reported by ``paracheck bench``, not gated); on CUDA also the
      allocator's peaks of Note [CUDA memory points]) are measured twice per side, in the first
      and the last round. They FAIL on any increase, however small. A side whose two readings
      differ is reported UNSTABLE (a warning: that quantity is then not exact and is not gated).
    * Timings, per variant. A job times ``steps`` steps (per step the slowest rank) and keeps
      its fastest step: load from other processes only ever adds time, so the fastest step is
      the reading least disturbed by it. What is timed is wall time by default (``--timing
      wall``): a slowdown that blocks (a sleep, a wait on a lock or a collective, I/O) shows in
      wall time only, a CPU-bound one in both. ``--timing cpu`` times the rank processes' CPU
      time instead (blind to blocking slowdowns; steadier where the machine is shared).
    * A pass starts with one untimed job per side and variant (a fresh worker's first job pays
      for imports and first connections), then R interleaved rounds give per side R job readings and per round one ratio
      head/base of the two jobs run back to back. The *median of the paired ratios* decides
      (a load that drifts during the run affects both jobs of a round alike; one disturbed
      round cannot move a median): a pass says "slower" when it exceeds ``1 + threshold``
      (default 0.10, or each variant's own threshold measured by ``--calibrate``: Note
      [Thresholds from measured noise] in ``paracheck.gate.rule``), "faster" when it is below
      ``1 - threshold``. The ratio of the two sides'
      fastest jobs is reported, not judged. It once had to exceed ``1 + threshold`` too, and
      then only to exceed 1; on 2-core slices of a shared 16-core machine, 12 of 82 planted
      25% slowdowns were missed that way, with median ratios of x1.15-x1.32 and ratios of
      minima of x0.84-x1.08. One side's fastest job is an extreme value: it
      says more about one quiet moment than about the code. The median's own noise is
      handled by the second pass.
    * Confidence: a pass that says "slower" or "faster" only makes the variant a *suspect*.
      Suspects are measured again in a second pass of ``confirm_rounds`` rounds (default twice
      ``rounds``) by freshly started workers and ranks (a process's own luck, where the loader
      and allocator put things and which cores its ranks share, can bias one side for its whole
      life; it must not be able to confirm itself). A timing FAILS only when both passes say
      "slower"; "faster" twice is reported, never a failure. R is rounded up to an even number
      so that each side runs first in exactly half of the rounds.
    * Exit 1 when something FAILS (a table says what), 0 otherwise, 2 when the gate cannot
      measure (an unknown ref, a target that does not import at head, a rank that raised).
      ``--json PATH`` writes the verdict and every reading, also when the gate cannot measure.
    * How often this rule raises a false alarm on identical commits and how often it catches a
      planted 10% / 25% slowdown on a given machine: ``python scripts/gate_operating.py``.
"""

from paracheck.gate.rule import (
    EXACT_QUANTITIES,
    GateRow,
    PassTiming,
    exact_verdict,
    false_alarm_bound,
    format_rows,
    noise_threshold,
    timing_verdict,
)
from paracheck.gate.run import GateConfig, GateError, calibrate_gate, read_thresholds, run_gate

__all__ = [
    "EXACT_QUANTITIES",
    "GateConfig",
    "GateError",
    "GateRow",
    "PassTiming",
    "exact_verdict",
    "calibrate_gate",
    "false_alarm_bound",
    "format_rows",
    "noise_threshold",
    "read_thresholds",
    "run_gate",
    "timing_verdict",
]
