"""What the driver gives a rank program: one ``RankJob`` per run, the same on every rank.

The driver builds it (``paracheck.check.targets.Target.job``; the properties that run a case
again, resume it at another world size or reload a state dict replace some of its fields), the
World pickles it to every rank, and the rank program (``paracheck.check.kinds``) reads the fields
its docstring names; what comes back is a ``RankRecord`` (``paracheck.check.ranks.record``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from paracheck.cases import Case

__all__ = ["RankJob"]


@dataclass(frozen=True)
class RankJob:
    """One run of one case on one target, the same on every rank of it (picklable: the World
    sends it to each). ``case``, ``path`` and ``kind`` have no default; of the rest, the steps and
    what is loaded are set only for the programs that resume or reload, and a program refuses a
    job that leaves a field it needs at None (``require``)."""

    # The run, read by every rank program: the case every rank trains (a ``TPCase`` for the
    # ``tp`` kind), the target's import path ("package.module:Class" or "/abs/file.py:function"),
    # its kind (``paracheck.check.kinds.KINDS``), and the device the ranks compute on (None: each
    # rank's GPU under nccl, else the CPU; ``paracheck.check.ranks._common.rank_device``).
    case: Case
    path: str
    kind: str
    device: str | None = None

    # How the target is read: ``Target``'s fields of the same names. ``takes_bucket``: pass
    # ``bucket_size_mb`` (read only where the constructor's signature cannot be); ``finish`` and
    # ``batch_start``: a DDP's hooks (``paracheck.check.ranks._drive``); ``scaler``: a loop's step
    # takes a ``GradScaler``; ``gather``: how an FSDP's parameters are read whole; ``stubbed``: the
    # rank program ``paracheck.check.ranks._cuda_stub.run_stubbed`` runs with CUDA timing calls
    # made no-ops (None: the job runs its kind's program directly).
    takes_bucket: bool = False
    finish: str | None = None
    batch_start: str | None = None
    scaler: bool = False
    gather: str | None = None
    stubbed: str | None = None

    # The steps a run trains, ``start..stop-1`` (a resumed run starts at the step it was saved
    # after; None: through the case's last step), and, for ``paracheck.check.ranks.reshard_dcp``,
    # whether it saves after them or loads before them ("save" or "load").
    start: int = 0
    stop: int | None = None
    phase: str | None = None

    # What a resumed or reloaded run loads: the checkpoint ``run_resumed`` loads
    # (``{"params": [...], "state_dict": {...}}``), the directory ``run_dcp_phase`` saves into and
    # loads from, and for ``run_reload`` the parameters, the consolidated state dict and the
    # gradient of its one step.
    checkpoint: dict | None = None
    checkpoint_dir: str | None = None
    params: list | None = None
    state_dict: dict | None = None
    grads: list | None = None

    def require(self, *names: str) -> None:
        """Refuse a job that leaves one of the fields ``names`` at None: the rank program
        reading them cannot run without them."""
        missing = [name for name in names if getattr(self, name) is None]
        if missing:
            raise ValueError(
                f"RankJob {missing[0]}=None: this rank program needs {', '.join(missing)}"
            )
