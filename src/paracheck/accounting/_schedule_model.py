"""The schedule of one training step as values, and what it implies for overlap: the events
and quantities of ``paracheck.accounting.schedule``, the exposed-communication model, and the
changes between two schedules. Pure: no hooks, no recorder.

Note [Communication schedule of a step]
    An event is one of

    * a *collective*, as the recorder sees it (kind, payload bytes, dtype, process-group size);
    * a *wait*: a host call that waits on communication: ``Work.wait()`` (a synchronous
      collective is a launch and a wait: torch calls ``wait()`` itself), a functional
      collective's ``wait_tensor``, ``torch.cuda.Stream.wait_stream`` / ``wait_event``. torch
      DDP's reducer waits from C++ and is not seen;
    * a *sync*: a device-to-host synchronisation (Note [Device syncs counted on the CPU]).

    Each carries its *phase*, set by the driver of the step (``paracheck.bench.step``):
    ``forward`` (from the step's start: ``zero_grad``, ``on_train_batch_start``, forward and the
    loss), ``backward`` (inside ``loss.backward()``, its end-of-backward callbacks included),
    ``after_backward`` (``finish_gradient_synchronization()``) and ``step``
    (``optimizer.step()``); its *point in backward*: the gradient bytes already produced, counted
    as each parameter's gradient reaches its ``AccumulateGrad`` node (a pre-hook on that node,
    which runs before the gradient is accumulated and before every post-accumulate-grad hook, so a
    bucket launched by the hook of its last gradient is launched at a point that includes that
    gradient; 0 before backward, every byte after it); and *where*: the innermost function of the
    calling code outside torch, ``paracheck.accounting`` and ``paracheck.world`` (a qualified
    name, ``BucketedDDP._wait``).

    From the events, exactly and independently of the machine (``StepSchedule``):
    ``launches_after_backward`` and ``bytes_after_backward`` (collectives in the ``after_backward``
    and ``step`` phases, and their payload), ``bytes_before_backward_end`` (the others),
    ``waits_in_backward`` (waits before backward has produced its last gradient byte),
    ``device_syncs`` (all phases), and the exposed communication of Note
    [Exposed communication model]: ``exposed_comm_pct_balanced`` (percent of backward's time on
    the balanced link) and ``exposed_comm_us_<link>`` (microseconds on each named link). Every one
    is lower-is-better.

Note [Exposed communication model]
    Compute of a step, from its FLOPs at a stated rate: forward 2 T N, backward 4 T N FLOPs for T
    tokens and N trainable elements (a dense layer's forward is one matmul of 2 T n FLOPs, its
    backward two; attention's T^2 terms and the optimizer are left out), backward produces each
    parameter's gradient at the point of its elements (the gradient bytes of Note [Communication
    schedule of a step], counted in elements), and the optimizer step takes no time. One
    communication channel runs the collectives in launch order (as one NCCL stream does), each
    taking ``latency + bus_bytes / bandwidth`` (Note [Bus bytes]: a ring all-reduce moves
    2(W-1)/W of its payload); a collective starts when launched and when the previous one ends.
    A wait in forward or backward stalls compute until every collective launched before it has
    ended. The step ends when compute and the last collective have; the *exposed communication*
    is the step's time minus its compute time. Links (bus bandwidth, latency): ``nvlink-h100``
    300 GB/s, 10 us; ``pcie4`` 25 GB/s, 15 us; ``ethernet-100g`` 12.5 GB/s, 30 us; the compute
    rate ``COMPUTE_FLOPS`` is 400 TFLOP/s (an H100 at about 40% of its dense bf16 peak). The
    ``balanced`` link has no latency and the bandwidth at which the step's collectives take
    exactly as long as its backward: its exposed share (of that time) is scale-free, 1 where
    nothing overlaps, and measures overlap alone, even for a model too small to hide anything
    on a real link. Any W: ``world_size=`` re-costs every collective's bus factor for W ranks
    (the payloads of data-parallel designs do not depend on W).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from paracheck.accounting.cost import bus_bytes

PHASES = ("forward", "backward", "after_backward", "step")
_AFTER = frozenset({"after_backward", "step"})


@dataclass(frozen=True)
class Link:
    """A link of Note [Exposed communication model]: bus bandwidth (bytes/s) and latency (s)."""

    name: str
    bandwidth: float
    latency: float


LINKS = {
    link.name: link
    for link in (
        Link("nvlink-h100", 300e9, 10e-6),
        Link("pcie4", 25e9, 15e-6),
        Link("ethernet-100g", 12.5e9, 30e-6),
    )
}
COMPUTE_FLOPS = 400e12  # Note [Exposed communication model]

# The exact quantities a schedule adds to the gate (Note [The gate rule]); all lower-is-better.
# Host calls (Note [Host calls per step]) are reported, not gated: a helper function split out
# of a hook is one call more per parameter, and no regression.
SCHEDULE_QUANTITIES = (
    "device_syncs",
    "waits_in_backward",
    "launches_after_backward",
    "bytes_after_backward",
    "exposed_comm_pct_balanced",
    *(f"exposed_comm_us_{name.replace('-', '_')}" for name in LINKS),
)


@dataclass(frozen=True)
class ScheduleEvent:
    """One event of Note [Communication schedule of a step]. ``what`` is ``collective``,
    ``wait`` or ``sync``; ``kind`` the collective's kind (``all_reduce``) or how the host waited
    or synchronised (``work.wait``, ``item``, ``to_device``); ``grad_bytes`` / ``grad_elems`` the
    gradient produced before it."""

    what: str
    kind: str
    phase: str
    grad_bytes: int
    grad_elems: int
    where: str = ""
    payload_bytes: int = 0
    dtype: str = ""
    group_size: int = 1

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class StepSchedule:
    """The schedule of one step (Note [Communication schedule of a step]) and its derived,
    machine-independent quantities. ``tokens``: tokens per rank in the step (for Note [Exposed
    communication model]); ``grad_bytes`` / ``grad_elems``: every gradient the backward
    produced; ``host_calls``: Note [Host calls per step]."""

    events: tuple[ScheduleEvent, ...]
    grad_bytes: int
    grad_elems: int
    tokens: int
    host_calls: int = 0
    world_calls: int = 0  # of host_calls, those inside paracheck.world's wrappers

    @property
    def collectives(self) -> list[ScheduleEvent]:
        return [e for e in self.events if e.what == "collective"]

    def share(self, e: ScheduleEvent) -> float:
        """The share of the step's gradient bytes produced before ``e`` (0..1)."""
        return e.grad_bytes / self.grad_bytes if self.grad_bytes else 0.0

    def metrics(self) -> dict:
        colls = self.collectives
        after = [e for e in colls if e.phase in _AFTER]
        out = {
            "device_syncs": sum(e.what == "sync" for e in self.events),
            # A wait once every gradient byte exists (an end-of-backward callback, where torch
            # DDP finalises its reducer too) holds back nothing backward still had to compute.
            "waits_in_backward": sum(
                e.what == "wait" and e.phase == "backward" and e.grad_bytes < self.grad_bytes
                for e in self.events
            ),
            "launches_after_backward": len(after),
            "bytes_after_backward": sum(e.payload_bytes for e in after),
            "bytes_before_backward_end": sum(e.payload_bytes for e in colls)
            - sum(e.payload_bytes for e in after),
            "exposed_comm_pct_balanced": 100 * exposed_communication(self, None)["exposed_share"],
        }
        for name, link in LINKS.items():
            key = f"exposed_comm_us_{name.replace('-', '_')}"
            out[key] = 1e6 * exposed_communication(self, link)["exposed_s"]
        out["host_calls"] = self.host_calls
        out["world_calls"] = self.world_calls  # the harness's share: reported, not gated
        return out

    def to_dict(self) -> dict:
        return {
            "events": [e.to_dict() for e in self.events],
            "grad_bytes": self.grad_bytes,
            "grad_elems": self.grad_elems,
            "tokens": self.tokens,
            "host_calls": self.host_calls,
            "world_calls": self.world_calls,
        }

    @classmethod
    def from_dict(cls, d: dict) -> StepSchedule:
        return cls(
            tuple(ScheduleEvent(**e) for e in d["events"]),
            d["grad_bytes"],
            d["grad_elems"],
            d["tokens"],
            d.get("host_calls", 0),
            d.get("world_calls", 0),
        )

    def table(self) -> str:
        """A short markdown table: a repeated event (what, kind, phase, where), or a repeated
        pair (a synchronous collective: launch then wait), in one row."""
        lines = [
            "| events | phase | at gradient bytes | payload | where |",
            "| --- | --- | --- | ---: | --- |",
        ]
        keys = [(e.what, e.kind, e.phase, e.where) for e in self.events]
        i = 0
        while i < len(keys):
            best = (1, 1)  # (period, repetitions)
            for period in (1, 2):
                n = 1
                while keys[i + n * period : i + (n + 1) * period] == keys[i : i + period]:
                    n += 1
                if period * n > best[0] * best[1] and (period == 1 or n > 1):
                    best = (period, n)
            period, n = best
            run = self.events[i : i + period * n]
            i += period * n
            firsts = run[::period]
            lo, hi = self.share(firsts[0]), self.share(firsts[-1])
            at = f"{lo:.0%}" if lo == hi else f"{lo:.0%}..{hi:.0%}"
            colls = [e for e in run if e.what == "collective"]
            payload = ""
            if colls:
                e = colls[0]
                payload = f"{sum(x.payload_bytes for x in colls):,} B {e.dtype} W={e.group_size}"
            names = " + ".join(
                f"{e.what} {_label(e.kind) if e.what == 'collective' else e.kind}"
                for e in run[:period]
            )
            if period > 1:
                names = f"({names})"
            lines.append(f"| {n} x {names} | {run[0].phase} | {at} | {payload} | {run[0].where} |")
        return "\n".join(lines)


# -- the model of Note [Exposed communication model] --------------------------------------------
def exposed_communication(
    schedule: StepSchedule,
    link: Link | None,
    *,
    flops: float = COMPUTE_FLOPS,
    world_size: int | None = None,
) -> dict:
    """Compute, communication and exposed communication of ``schedule`` in seconds (and, for
    ``link=None``, the balanced link, shares of the backward's time); see Note [Exposed
    communication model]. ``world_size`` re-costs every collective for that many ranks."""
    if not flops > 0:
        raise ValueError(f"flops={flops!r} must be > 0")
    if world_size is not None and (not isinstance(world_size, int) or world_size < 1):
        raise ValueError(f"world_size={world_size!r} must be an int >= 1")
    per_elem = 2.0 * schedule.tokens / flops  # forward seconds per trainable element
    t_fwd = per_elem * schedule.grad_elems
    t_bwd = 2 * t_fwd
    colls = schedule.collectives
    sizes = [bus_bytes(e.kind, e.payload_bytes, world_size or e.group_size) for e in colls]
    if link is None:
        # Bandwidth such that every collective together takes exactly the backward's time.
        total = sum(sizes)
        t_bwd = t_fwd = 1.0 if not total or not schedule.grad_elems else t_bwd
        bandwidth, latency = (total / t_bwd if total else 1.0), 0.0
    else:
        bandwidth, latency = link.bandwidth, link.latency
    stall = 0.0  # compute delayed by waits in forward or backward
    channel = 0.0  # when the channel is free
    compute_end = t_fwd + t_bwd
    k = 0
    for e in schedule.events:
        if e.phase == "forward":
            now = stall
        elif e.phase == "backward":
            frac = e.grad_elems / schedule.grad_elems if schedule.grad_elems else 1.0
            now = t_fwd + frac * t_bwd + stall
        else:
            now = compute_end + stall
        if e.what == "collective":
            start = max(now, channel)
            channel = start + latency + sizes[k] / bandwidth
            k += 1
        elif e.what == "wait" and e.phase in ("forward", "backward"):
            stall += max(0.0, channel - now)
    compute = t_fwd + t_bwd
    end = max(compute + stall, channel)
    exposed = end - compute
    return {
        "compute_s": compute,
        "comm_s": sum(latency + s / bandwidth for s in sizes),
        "exposed_s": exposed,
        "exposed_share": exposed / t_bwd if t_bwd else 0.0,
    }


# -- explaining a change --------------------------------------------------------------------
def _label(kind: str) -> str:
    return kind.replace("_", "-")


def schedule_changes(variant: str, base: StepSchedule, head: StepSchedule) -> list[str]:
    """One line per way ``head`` communicates later or blocks more than ``base``: a collective
    that moved after backward or later in it, a wait or sync added, and where."""
    lines = []
    by_kind: dict[str, list[tuple[ScheduleEvent, ScheduleEvent | None]]] = {}
    bc: dict[str, list[ScheduleEvent]] = {}
    for e in base.collectives:
        bc.setdefault(e.kind, []).append(e)
    hc: dict[str, list[ScheduleEvent]] = {}
    for e in head.collectives:
        hc.setdefault(e.kind, []).append(e)
    for kind, events in hc.items():
        olds = bc.get(kind, [])
        for i, e in enumerate(events):
            old = olds[i] if i < len(olds) else None
            by_kind.setdefault(kind, []).append((e, old))

    def at(s: StepSchedule, e: ScheduleEvent) -> str:
        if e.phase in _AFTER:
            return f"in {e.phase.replace('_', ' ')}" if e.phase == "step" else "after backward"
        if e.phase == "forward":
            return "in forward"
        return f"at {s.share(e):.0%} of gradient bytes"

    for kind, pairs in by_kind.items():
        for i, (e, old) in enumerate(pairs):
            name = f"{_label(kind)} #{i + 1}"
            if old is None:
                lines.append(f"{variant}: {name} added, launched {at(head, e)} in {e.where}")
                continue
            moved_after = e.phase in _AFTER and old.phase not in _AFTER
            later_in_bwd = (
                e.phase == old.phase == "backward" and head.share(e) > base.share(old) + 1e-12
            )
            if moved_after or later_in_bwd:
                verb = "launched after backward" if moved_after else f"launched {at(head, e)}"
                lines.append(f"{variant}: {name} {verb} (was {at(base, old)})")
    for what in ("wait", "sync"):
        for phase in PHASES:
            # Only a phase that has more of them than before reports; a wait that moved from one
            # function to another is not one added.
            places: dict[str, int] = {}
            for e in head.events:
                if e.what == what and e.phase == phase:
                    places[e.where] = places.get(e.where, 0) + 1
            for e in base.events:
                if e.what == what and e.phase == phase:
                    places[e.where] = places.get(e.where, 0) - 1
            if sum(places.values()) <= 0:
                continue
            for where, n in places.items():
                if n > 0:
                    many = "a" if n == 1 else str(n)
                    s = "" if n == 1 else "s"
                    lines.append(
                        f"{variant}: {many} {what}{s} added in {where} ({phase.replace('_', ' ')})"
                    )
    if head.host_calls > base.host_calls:
        lines.append(
            f"{variant}: {head.host_calls - base.host_calls} host calls more per step "
            f"({base.host_calls} -> {head.host_calls})"
        )
    return lines
