"""What a rank program returns to the driver: one ``RankRecord`` per rank (picklable, on the CPU).

The rank programs (``paracheck.check.ranks.ddp``, ``sharded``, ``zero``) fill what their kind
can observe and leave the rest at its default; the properties (``paracheck.check.properties``)
read only the fields their docstrings name.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RankRecord", "RankStep", "ReloadRecord", "Window"]


@dataclass(frozen=True)
class Window:
    """One synchronisation window of a DDP step, from its first forward to its ``finish``: the
    collectives issued in it as (name, payload bytes), the synchronised backward passes it
    covers, and whether every trainable parameter had a gradient after the finish
    (Note [Bucket-structure rules])."""

    calls: tuple[tuple[str, int], ...]
    backwards: int
    all_present: bool
    # The same calls with each payload's element type: (name, dtype, payload bytes).
    typed: tuple[tuple[str, str, int], ...] = ()
    # Of ``calls``, those issued inside ``no_sync()`` micro-steps, in order.
    in_no_sync: tuple[tuple[str, int], ...] = ()
    # Of ``calls``, those issued in the synchronised micro-steps' forward and backward passes,
    # before ``finish`` (Note [A sync compiled away]).
    in_passes: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class RankStep:
    """One optimizer step as one rank saw it."""

    params: list  # every parameter after the step (None for none)
    # The synchronised gradients the step used; None where the target does not expose them (a
    # ZeRO wrapper without full_gradients()).
    grads: list | None = None
    windows: tuple[Window, ...] = ()  # ddp: the step's synchronisation windows
    # Sharding kinds: the optimizer state this rank's state_dict() returned, by parameter index
    # (None: unreadable, ``state_read`` says why; Note [State dict conventions]).
    state: dict | None = None
    state_read: str = ""
    state_bytes: int | None = None  # bytes of optimizer state this rank holds (None: no state)
    traffic: tuple = ()  # the step's collectives, ``StepTraffic.entries``
    owners: tuple | None = None  # sharded: the declared owner of each parameter
    # sharded: the parameters whose state (keyed by the parameter, of its shape) this rank held
    # before the step and changed in it (Note [State stepped on two ranks]).
    state_stepped: tuple[int, ...] = ()
    # Sharding kinds with master weights (Note [Master weights]): each parameter's float32 master
    # after the step, from the target's master_params() (None for one it keeps none of).
    masters: list | None = None
    # fsdp: the storages of the step's all-gathers still holding bytes after its last
    # synchronisation, as (count, bytes) (Note [Gathered parameters die with the step]).
    gathered: tuple[int, int] | None = None
    # fsdp: the most all-gather storages alive at once during the step's passes (Note [Gathered
    # layers and the prefetch depth]).
    peak_gathered: int | None = None
    # zero2: the storages of the step's reduce-scatters still holding bytes once its gradients
    # are synchronised, as (count, bytes), and the elements of gradient storage reachable from
    # the parameters' and the optimizer's ``.grad`` then (Note [Gradients kept as shards]).
    scattered: tuple[int, int] | None = None
    held_grad_elements: int | None = None
    # fsdp: the elements of parameter storage reachable from the wrapper's and the module's
    # parameters after the step (Note [Parameters kept as shards]).
    held_param_elements: int | None = None


@dataclass(frozen=True)
class RankRecord:
    """A rank's whole run of one case, or ``skipped`` (why the case is outside the target's
    interface; every rank alike)."""

    initial_params: list = ()
    initial_buffers: list = ()
    steps: tuple[RankStep, ...] = ()
    skipped: str | None = None
    # zero: the rank's pieces as (parameter index, start, length), and the layout's bucket sizes.
    pieces: tuple | None = None
    bucket_numels: tuple | None = None
    final_state_dict: dict | None = None  # sharding kinds: state_dict() after the last step
    prefetch: int | None = None  # fsdp: the prefetch depth the wrapper was built with, if any
    # fsdp: per module parameter, whether the wrapper provably held it whole after the last step
    # (None: unknown), ``paracheck.check.ranks.fsdp.kept_whole``.
    kept_whole: tuple | None = None
    # A compiled case (Note [Compiled cases]): its setting, the graphs compiled, the seconds spent
    # compiling and training (``paracheck.check.ranks._compiled.CompiledRun.record``).
    compiled: dict | None = None

    @classmethod
    def skip(cls, why: str) -> RankRecord:
        return cls(skipped=why)

    def notes(self) -> dict:
        """What a ``CaseResult`` keeps of the record beside the trajectory (``CaseResult.extra``)."""
        return {
            name: value
            for name, value in (
                ("skipped", self.skipped),
                ("pieces", self.pieces),
                ("bucket_numels", self.bucket_numels),
                ("final_state_dict", self.final_state_dict),
                ("compiled", self.compiled),
            )
            if value is not None
        }


@dataclass(frozen=True)
class ReloadRecord:
    """``paracheck.check.ranks.reload.run_reload``: the state right after ``load_state_dict()``,
    and the parameters and state after one more step (state by parameter index, or None)."""

    loaded: dict | None
    params: list
    state: dict | None
