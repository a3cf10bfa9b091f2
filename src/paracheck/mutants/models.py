"""Broken DDP variants that only a real model's structure exposes: each is correct on every model
paracheck generates (whose data-dependent branch is one block of parameters, whose tied weights
are used by layers of one kind, and whose one buffer is the model's own) and wrong on a model
with routed experts, an embedding tied to its output head, or a normalisation layer's running
statistics. They are checked through ``--model`` on ``examples/models.py`` (``MODEL_MUTANTS``:
the model each is killed on), not by the selftest, whose cases are generated models.

Each is production code minus one thing, as the module ``paracheck.mutants.ddp``: a subclass
overriding one step, the bug marked ``BUG``."""

from __future__ import annotations

import functools
import weakref
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from paracheck.ddp.flat import FlatDDP
from paracheck.ddp.naive import NaiveDDP

__all__ = [
    "MODEL_MUTANTS",
    "ModelMutant",
    "SameCountSkipsNoneDDP",
    "EmbeddingRowsOnlyDDP",
    "SubmoduleBuffersNotBroadcastDDP",
]


class SameCountSkipsNoneDDP(NaiveDDP):
    """NaiveDDP that, to save the all-reduces of parameters without a gradient, reduces only the
    parameters with a local gradient whenever every rank has as many of them (a guard that keeps
    the job from hanging where one rank has more): where a router leaves a different expert idle
    on each of two ranks, the ranks reduce different experts' gradients into each other (of one
    shape, so nothing complains), and the idle experts keep no gradient."""

    def _params_to_reduce(self) -> list:
        present = [p for p in self.trainable if p.grad is not None]
        device = self.trainable[0].device if self.trainable else torch.device("cpu")
        counts = torch.tensor([len(present), -len(present)], dtype=torch.int64, device=device)
        dist.all_reduce(counts, op=dist.ReduceOp.MAX, group=self.process_group)
        if int(counts[0]) == -int(counts[1]):
            return present  # BUG: as many gradients on every rank, not the same parameters'
        return super()._params_to_reduce()


def _record_rows(ref: weakref.ref, module: nn.Module, args) -> None:
    ddp = ref()
    if ddp is not None:
        ddp._rows.setdefault(id(module), set()).update(args[0].unique().tolist())


class EmbeddingRowsOnlyDDP(FlatDDP):
    """FlatDDP that keeps of an embedding's gradient only the rows its local tokens looked up
    before reducing it (exact for an embedding alone, whose other rows are zero): an output head
    tied to the embedding contributes to every row, and its contribution to the rows no local
    token used is dropped."""

    def __init__(self, module: nn.Module, *, process_group=None):
        super().__init__(module, process_group=process_group)
        self._rows: dict[int, set[int]] = {}
        self._embeddings = [m for m in module.modules() if isinstance(m, nn.Embedding)]
        ref = weakref.ref(self)
        for m in self._embeddings:
            m.register_forward_pre_hook(functools.partial(_record_rows, ref))

    def _flatten(self, params) -> torch.Tensor:
        for m in self._embeddings:
            grad = m.weight.grad
            if grad is not None:
                keep = torch.zeros(grad.shape[0], dtype=torch.bool, device=grad.device)
                keep[list(self._rows.get(id(m), ()))] = True
                grad[~keep] = 0  # BUG: the rows of the embedding's own use only
        self._rows.clear()
        return super()._flatten(params)


class SubmoduleBuffersNotBroadcastDDP(FlatDDP):
    """FlatDDP that broadcasts every parameter but only the buffers the wrapped module registers
    itself: a submodule's buffers (a BatchNorm's running statistics) keep each rank's own."""

    def _state_tensors(self) -> list[torch.Tensor]:
        # BUG: recurse=False: the module's own buffers, not its submodules'
        return [*self.module.parameters(), *self.module.buffers(recurse=False)]


@dataclass(frozen=True)
class ModelMutant:
    """A mutant of this module and the example model it is checked on (``--model``, ``--batch``,
    ``--loss-fn`` as functions of ``examples/models.py``)."""

    name: str
    path: str
    bug: str
    model: str
    batch: str
    loss: str | None = None


MODEL_MUTANTS: dict[str, ModelMutant] = {
    m.name: m
    for m in (
        ModelMutant(
            "ddp-same-count-skips-none",
            "paracheck.mutants.models:SameCountSkipsNoneDDP",
            "parameters without a local gradient are skipped where every rank has as many: "
            "different idle experts on two ranks are reduced into each other",
            "moe",
            "moe_batch",
        ),
        ModelMutant(
            "ddp-embedding-rows-only",
            "paracheck.mutants.models:EmbeddingRowsOnlyDDP",
            "an embedding's gradient is reduced on the rows its tokens looked up only: the tied "
            "output head's gradient on every other row is dropped",
            "tied_lm",
            "lm_batch",
            "lm_loss",
        ),
        ModelMutant(
            "ddp-submodule-buffers-not-broadcast",
            "paracheck.mutants.models:SubmoduleBuffersNotBroadcastDDP",
            "only the wrapped module's own buffers are broadcast: a BatchNorm's running "
            "statistics stay each rank's",
            "frozen_bn",
            "bn_batch",
        ),
    )
}
