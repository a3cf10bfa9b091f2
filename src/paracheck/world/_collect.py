"""Collecting one job: its ranks' answers, and its verdict where some do not come as results.

A rank that raised -> ``RankError``; a rank that died or stopped itself over its memory cap ->
``RankDied``/``RankOverMemory``, once the dead ranks are replaced; a job whose ranks deadlocked
(Note [Definite deadlock]), stalled, or did not finish within its timeout -> ``RankHang``, once
the stuck ranks are freed or replaced (Note [Timeout verdicts]). ``World.collect`` calls
``collect_once``, and runs a job again where it says so; what the driver reads of a rank comes
through the pool's methods (``paracheck.world._pool.Pool``: ``status``, ``output``, ``stacks``,
``free``, ...), which a ``LocalPool`` answers from its processes and an ``AgentPool`` from its
agents.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import NamedTuple, NoReturn

from paracheck.world._failures import (
    DEATHS,
    RankDied,
    RankError,
    RankFailure,
    RankHang,
    RankOverMemory,
    WorldError,
    WorldStartError,
    collective_of,
    collective_of_traceback,
    load_per_cpu,
    order_failures,
)
from paracheck.world._memory import exceeded
from paracheck.world._pool import Pool, await_answers
from paracheck.world._rank import recv, send
from paracheck.world._watch import Watch, describe_death, describe_disagreement

__all__ = ["JobLimits", "Ticket", "collect_once"]


class Ticket(NamedTuple):
    """A job submitted (``World.submit``), for ``World.collect``: its number, function, world
    size, the deadline (monotonic) its timeout gives from the submission, when it was submitted,
    its payload and timeout, whether every rank of it was a fresh process, and whether it is a
    timeout's run again (Note [Timeout verdicts])."""

    job: int
    fn: str
    world_size: int
    deadline: float
    submitted: float
    payload: object
    timeout: float
    fresh: bool
    rerun: bool


@dataclass(frozen=True)
class JobLimits:
    """The World's limits a collection judges a job by (Note [Timeout verdicts], Note [Started
    ranks]): its whole ``timeout``, how long its ranks may take to start the job's code
    (``begin_timeout``), how long a rank that finished may take to answer past the timeout, and
    how long no rank may run before the job is a stall (None: never)."""

    timeout: float
    begin_timeout: float
    answer_seconds: float
    stall_seconds: float | None


# Note [Timeout verdicts]
#   A job is hung when its ranks can no longer finish it, not when a clock says so. Three things
#   made a correct case read as a hang on a loaded machine, and each is ruled out before a
#   timeout is judged:
#   * The driver computes the oracle between ``submit`` and ``collect`` and may itself be
#     descheduled, so it can reach ``collect`` after the deadline with every answer already in
#     the pipes (measured: a 1x1 MLP's first case, both ranks idle in their job loop, reported as
#     a hang when 20 checks shared 32 cores). Answers already sent are read first, and a job is
#     judged only on at least one second of the driver watching it.
#   * A rank whose status says it finished (``returned``, ``raised``) is still pickling and
#     sending its answer: it is waited for (up to ``answer_seconds`` past the World's timeout,
#     while its process lives).
#   * A rank busy outside any collective (a long backward at four ranks per core) changes no
#     collective count, so counts alone called it stuck: a rank that used a CPU (2% of one over
#     the last half second or more), or has a thread waiting for a disk when polled, is making
#     progress too, and a job that progresses waits up to the World's timeout.
#   Conversely, when no rank still in the job ran, issued a collective or changed state for
#   ``stall_seconds`` (3 s), nothing can end the job: every such rank sleeps or waits for a peer
#   that does. That is a stall, reported at once like a deadlock (Note [Definite deadlock])
#   whatever the timeout. An idle rank uses about 0.5% of a CPU (its watchdog thread; measured),
#   a rank that wants a CPU on two cores shared by 17 runnable processes gets about 12%. Only
#   local gloo ranks are judged so: an NCCL rank may wait for its GPU without using a CPU, and an
#   attached rank's process is on another machine.
#   A timeout that neither a deadlock nor a stall proves (a rank still spinning at the World's
#   timeout) is run once more on fresh rank processes with the World's whole timeout before it
#   is reported; a pass then is the case's verdict.


def collect_once(
    pool: Pool, ticket: Ticket, limits: JobLimits, outputs: dict[int, str]
) -> list | None:
    """The results of the job of ``ticket``, in rank order, or its failure raised; None where a
    rank of it went over its memory cap on a process that ran earlier jobs, and the job is to be
    run again with every rank of it fresh (Note [Rank memory cap]; its ranks have been replaced).
    ``outputs`` is filled with what each rank of the job printed."""
    return _Collection(pool, ticket, limits, outputs).run()


# How long the survivors of a death may take to fail out of the job (their peers are gone), and
# how long stuck ranks may take to answer once freed, before they are replaced.
_FAIL_OUT_SECONDS = 3.0
_FREED_SECONDS = 2.0


class _Collection:
    """The answers to one job as they come in, and the job's verdict once they stop coming."""

    def __init__(self, pool: Pool, ticket: Ticket, limits: JobLimits, outputs: dict[int, str]):
        self.pool, self.ticket, self.limits, self.outputs = pool, ticket, limits, outputs
        self.job, self.fn, self.w = ticket.job, ticket.fn, ticket.world_size
        self.started = ticket.submitted
        # The case's timeout counts from the moment the last rank started the job's code (Note
        # [Started ranks]); until then the deadline is the World's start timeout.
        self.timeout = ticket.deadline - self.started
        self.began: float | None = None
        # Moved on while a late job is judged (Note [Timeout verdicts]).
        self.deadline = self.started + limits.begin_timeout
        # A late case that still makes progress waits up to this (Note [Timeout verdicts]).
        self.hard = self.started + limits.timeout
        self.results: dict[int, object] = {}
        self.failures: list[RankFailure] = []
        self.pending = dict(enumerate(pool.conns))
        self.watch = Watch(pool, self.job, self.w, limits.stall_seconds)

    def run(self) -> list | None:
        """The job's results in rank order, or None to run it again (``collect_once``); raise its
        failure."""
        self._wait()
        dead = [f for f in self.failures if f.kind in DEATHS]
        if dead:
            self._after_deaths(dead)
            return None  # a rank over its memory cap on a used process: run again
        stuck = self._running()
        if stuck:
            self._hang(stuck)
        w, fn = self.w, self.fn
        if self.failures:
            # Ranks that finished still hold the old group: re-create it everywhere.
            self.pool.regroup()
            raise RankError(
                f"{len(self.failures)} rank(s) raised during {fn} (world size {w})",
                order_failures(self.failures),
            )
        missing = [r for r in range(w) if r not in self.results]
        if missing:
            # Every rank of the job answered, raised, died or hung above; this says so if not.
            raise RankError(
                f"rank(s) {missing} gave no result for {fn} (world size {w}) and no failure: "
                f"paracheck's runner lost their answer",
                [RankFailure(r, "raised", "no answer recorded for this job") for r in missing],
            )
        return [self.results[r] for r in range(w)]

    def _running(self) -> list[int]:
        """The ranks of the job that have not answered."""
        return sorted(r for r in self.pending if r < self.w)

    # -- waiting ----------------------------------------------------------------------------
    def _wait(self) -> None:
        """Read answers until every rank answered, a rank died, the ranks deadlocked or stalled,
        or the job is judged late."""
        while self.pending:
            now = time.monotonic()
            if self.began is None:
                self._begin()
            if now >= self.deadline:
                if self.began is None:
                    self._not_started()
                if self._judged_late(now):
                    break
                continue
            # Poll the ranks' collective counts while some have answered and others not (where a
            # deadlock shows), in the last second before the deadline, and until every rank
            # started the job (Note [Started ranks]).
            polling = (
                (self.results and any(r < self.w for r in self.pending))
                or self.deadline - now < 1.5
                or now >= self.started + 0.5
                or self.began is None
            )
            ready = wait(
                list(self.pending.values()),
                timeout=min(self.deadline - now, 0.1 if polling else self.started + 0.5 - now),
            )
            self._receive(ready)
            if any(f.kind in DEATHS for f in self.failures):
                break
            if polling:
                running = self._running()
                self.watch.poll(running)
                if not self.failures and (
                    self.watch.deadlocked(sorted(self.results), running)
                    or self.watch.stalled(running)
                ):
                    break  # Note [Definite deadlock], Note [Timeout verdicts]

    def _begin(self) -> None:
        """Arm the case's timeout once every rank of the job started its code, or once a rank
        failed (a failure is the job's verdict whether its peers started or not): Note [Started
        ranks]."""
        began = self.watch.began(self.started)
        if began is None and self.failures:
            began = self.started
        if began is not None:
            self.began = began
            self.deadline = began + self.timeout
            self.hard = began + self.limits.timeout

    def _not_started(self) -> NoReturn:
        """Some rank of the job did not start its code within the World's start timeout, and no
        rank failed: no verdict on the job (Note [Started ranks]). The pool is restarted."""
        late = [r for r in range(self.w) if self.watch.status(r) is None]
        self.pool.restart()
        raise WorldStartError(
            f"rank(s) {late} did not start {self.fn} (world size {self.w}) within "
            f"{self.limits.begin_timeout:g} s of its submission (creating its process group and "
            f"importing its function); {self.pool.restarted_words}"
        )

    def _judged_late(self, now: float) -> bool:
        """Past the deadline: True where the job is judged now; False where it is waited for
        longer (the deadline moved on). See Note [Timeout verdicts]: answers already sent are
        read before anything is judged late (the driver may have been busy past the deadline), a
        rank that finished is waited for, and the ranks are judged on what was watched."""
        watch = self.watch
        ready = wait(list(self.pending.values()), timeout=0)
        if ready:
            self._receive(ready)
            return False
        running = self._running()
        watch.poll(running)
        if watch.answering(running) and now < self.hard + self.limits.answer_seconds:
            self.deadline = now + 0.1
            return False
        if watch.watched_for() < 1.0:
            self.deadline = now + 1.0 - watch.watched_for()
            return False
        # A case past its timeout whose ranks still run or issue collectives is slow, not hung
        # (a loaded machine): give it another timeout's worth, up to the World's.
        if watch.progressed(within=1.0) and now < self.hard:
            self.deadline = min(self.hard, now + (self.deadline - (self.began or self.started)))
            return False
        return True

    def _receive(self, ready) -> None:
        """Read the answers on the connections ``ready``; a connection that ended is a death."""
        pool = self.pool
        for conn in ready:
            rank = pool.conns.index(conn)
            try:
                msg = recv(conn)
            except (EOFError, OSError):
                self.failures.append(pool.death(rank, self.job))
                del self.pending[rank]
                continue
            if msg[0] != self.job:
                continue  # a late answer to an earlier, abandoned job
            del self.pending[rank]
            output = msg[3] if len(msg) > 3 else ""
            if output:
                self.outputs[rank] = output
            if msg[1] == "ok":
                self.results[rank] = msg[2]
            elif msg[1] == "error":
                self.failures.append(_raised(rank, msg, output))

    # -- deaths -----------------------------------------------------------------------------
    def _after_deaths(self, dead: list[RankFailure]) -> None:
        """Ranks ended during the job (``dead``): replace them, then raise ``RankOverMemory`` or
        ``RankDied``; or, where a rank went over its memory cap on a process that served earlier
        jobs, return None: the job is run again with every rank of it fresh (Note [Rank memory
        cap])."""
        pool, w = self.pool, self.w
        ranks = sorted(f.rank for f in dead)
        # Read before the dead ranks are replaced (a new process truncates its status).
        mismatch = describe_death({r: self.watch.status(r) for r in range(w)}, ranks)
        rerun = any(f.kind == "memory" for f in dead) and not self.ticket.fresh
        stale = tuple(r for r in range(w) if r not in ranks) if rerun else ()
        # Replacing only the dead ranks costs one process start instead of the pool's; ranks
        # found dead meanwhile are added to ``ranks``.
        known = set(ranks)
        replaced, exits = self._replace_dead(ranks, also=stale)
        dead += [exits.get(r, RankFailure(r, "died", "died")) for r in ranks if r not in known]
        if replaced:
            action = f"rank(s) {sorted(set(ranks) | set(stale))} were restarted"
        else:
            pool.restart()
            action = pool.restarted_words
        if rerun:
            return None
        raised = sorted((f for f in self.failures if f.kind == "raised"), key=lambda f: f.rank)
        raise self._death_error(dead, mismatch, action, raised)

    def _replace_dead(
        self, dead: list[int], also: tuple[int, ...]
    ) -> tuple[bool, dict[int, RankFailure]]:
        """After ranks ``dead`` died in the job: let the survivors still in it fail out (their
        peers are gone, so their collectives fail), have every survivor drop its group, and start
        new processes for the dead ranks and the ranks ``also``; ranks found dead meanwhile are
        added to ``dead``, with how they ended. False if that did not work (then restart the
        pool)."""
        pool = self.pool
        known = set(dead)
        waiting = {r: c for r, c in self.pending.items() if r not in dead}
        deadline = time.monotonic() + _FAIL_OUT_SECONDS
        while waiting and time.monotonic() < deadline:
            for conn in wait(list(waiting.values()), timeout=max(0.0, deadline - time.monotonic())):
                rank = pool.conns.index(conn)  # type: ignore[arg-type]
                try:
                    msg = recv(conn)
                except (EOFError, OSError):
                    dead.append(rank)  # a mismatched collective can abort every rank of the pair
                    waiting.pop(rank, None)
                    continue
                if msg[0] == self.job:
                    waiting.pop(rank, None)
                    if msg[1] == "error":
                        # The peer of a dead rank raised in the same call of the target's code:
                        # its traceback names that call (Note [A death's peers]).
                        self.failures.append(_raised(rank, msg, msg[3] if len(msg) > 3 else ""))
        dead += [r for r in range(pool.size) if r not in dead and not pool.alive(r)]
        exits = {r: pool.death(r, self.job) for r in dead if r not in known}
        if waiting:
            return False, exits
        for r in range(pool.size):
            if r not in dead:
                send(pool.conns[r], ("reset",))
        return pool.replace(sorted(set(dead) | set(also))), exits

    def _death_error(
        self, dead: list[RankFailure], mismatch: str, action: str, raised: list[RankFailure]
    ) -> WorldError:
        """The failure of a job whose ranks ``dead`` ended: the first over its memory cap, else
        every death, with what their last collective's tensors say (``mismatch``), then the
        tracebacks of the peers that ``raised`` (Note [A death's peers])."""
        w, fn = self.w, self.fn
        over = [f for f in dead if f.kind == "memory"]  # in the order they were found
        dead.sort(key=lambda f: (f.kind != "memory", f.rank))
        if over:
            summary = f"rank {over[0].rank} {exceeded(over[0].status or {})}"
            return RankOverMemory(
                f"{summary} during {fn} (world size {w}); {action}", dead, summary=summary
            )
        died = RankDied(
            f"{len(dead)} rank(s) died during {fn} (world size {w}): "
            + ", ".join(f"rank {f.rank} {f.detail}" for f in dead)
            + (f" ({mismatch})" if mismatch else "")
            + f"; {action}",
            dead + raised,
        )
        died.disagreement = mismatch
        return died

    # -- hangs ------------------------------------------------------------------------------
    def _hang(self, stuck: list[int]) -> NoReturn:
        """Ranks ``stuck`` did not answer: a deadlock, a stall or a timeout (Note [Definite
        deadlock], Note [Timeout verdicts]). Record their stacks and statuses, free or replace
        them, and raise ``RankHang``."""
        pool, w = self.pool, self.w
        definite = self.watch.deadlocked(sorted(self.results), stuck)
        stalled = not definite and self.watch.stalled(stuck)
        progressing = not definite and not stalled and self.watch.progressed(within=1.0)
        stacks = pool.stacks(stuck)
        statuses = {r: self.watch.status(r) for r in range(w)}
        seconds = time.monotonic() - self.started
        hung = []
        for r in stuck:
            stack = stacks.get(r) or "(no stack)"
            output = pool.output(r)
            hung.append(
                RankFailure(r, "hung", stack, collective_of(stack), output, statuses.get(r))
            )
        done = [
            RankFailure(
                r,
                "finished",
                "returned normally",
                None,
                self.outputs.get(r, ""),
                statuses.get(r),
            )
            for r in sorted(self.results)
        ]
        disagreement = describe_disagreement(statuses, stuck, sorted(self.results))
        action = self._recover(stuck)
        what = f"{self.fn} (world size {w})"
        if definite:
            head = (
                f"{what} deadlocked on rank(s) {stuck} after {seconds:.1f} s: {disagreement}; "
                f"{action}"
            )
        elif stalled:
            head = (
                f"{what} stalled on rank(s) {stuck} after {seconds:.1f} s: none of "
                f"them ran or issued a collective for {self.limits.stall_seconds:g} s"
                + (f"; {disagreement}" if disagreement else "")
                + f"; {action}"
            )
        else:
            head = (
                f"{what} did not finish within {seconds:.1f} s on rank(s) {stuck}"
                + (f": {disagreement}" if disagreement else "")
                + f"; {action}"
            )
        raise RankHang(
            head,
            hung + self.failures + done,
            disagreement=disagreement,
            definite=definite,
            stalled=stalled,
            seconds=seconds,
            progressing=progressing,  # Note [Too slow to judge]
            load=load_per_cpu(),
        )

    def _recover(self, stuck: list[int]) -> str:
        """Free the stuck ranks, or replace them, or restart the pool; say which."""
        pool = self.pool
        # Recovery, fastest first: ranks that finished drop their process group, which closes
        # their connections, so a peer stuck in a collective with them fails out of it at once
        # (measured on gloo: 1 s after the peer's destroy_process_group, against the group's
        # timeout). Only a peer that finished or raised can free a stuck rank so, or an
        # interruption of its job where the pool can make one.
        interrupted = pool.free(stuck, self.job)
        freed = interrupted or bool(self.results or self.failures)
        recovered = freed and await_answers(
            pool, stuck, self.job, time.monotonic() + _FREED_SECONDS
        )
        if not recovered:
            until = pool.unstick_deadline(self.started)
            recovered = until is not None and await_answers(pool, stuck, self.job, until)
        if recovered and all(pool.alive(r) for r in range(pool.size)):
            pool.regroup()
            return "ranks recovered"
        if pool.replace(stuck):
            return f"rank(s) {stuck} were killed and restarted"
        pool.restart()
        return pool.restarted_words


# Note [A death's peers]
# ~~~~~~~~~~~~~~~~~~~~~~
# gloo aborts a rank whose collective's tensor differs in size from its peer's
# (gloo::EnforceNotMet: no Python frame survives) and raises on the peer ("Connection closed by
# peer") inside the same call of the target's code. The peer's traceback is the only record of
# that call, so a death's error keeps it after the deaths: the verdict reads the target's frame
# from it (``paracheck.check.verdict.cause_key``), and one root shows as one cause whether a
# case ended in the death or in a hang at that call.


def _raised(rank: int, msg: tuple, output: str) -> RankFailure:
    """The failure of ``rank`` whose answer ``msg`` is an error: its traceback, the collective
    it names, and the object of the target's a library raised on (where the rank found one)."""
    called_on = msg[4] if len(msg) > 4 else None
    return RankFailure(
        rank, "raised", msg[2], collective_of_traceback(msg[2]), output, called_on=called_on
    )
