"""What the ``memory``, ``balance`` and ``traffic`` properties share: the facts about a case's
parameters they compare with (``CaseFacts``), and the check that every rank declares the same
partition."""

from __future__ import annotations

from dataclasses import dataclass

from paracheck.accounting.memory import state_model
from paracheck.cases import Case
from paracheck.check.properties._case import case_params, group_of
from paracheck.check.properties._divergence import Divergence, diverge
from paracheck.check.ranks.record import RankRecord

__all__ = ["CaseFacts", "declares_partition", "owners_disagree"]


@dataclass(frozen=True)
class CaseFacts:
    """The case's parameters as the oracle builds them, with per parameter index its element
    size, the element size of its optimizer state (its master's, float32, with
    ``Case.master_weights``: Note [Master weights]), its bytes, the step its group is added at
    (None: constructor; absent: in no group), its optimizer's state model, and the trainable
    indices."""

    params: list
    esize: list[int]
    state_esize: list[int]
    nbytes: list[int]
    added: dict[int, int | None]
    models: list
    trainable: list[int]

    @classmethod
    def of(cls, case: Case) -> CaseFacts:
        params = case_params(case)
        options, added = group_of(case, params)
        return cls(
            params,
            [p.element_size() for p in params],
            [max(p.element_size(), 4) if case.master_weights else p.element_size() for p in params],
            [p.numel() * p.element_size() for p in params],
            added,
            [
                state_model(case.optimizer.name, options[i]) if i in options else None
                for i in range(len(params))
            ],
            [i for i, p in enumerate(params) if p.requires_grad],
        )

    def in_optimizer(self, k: int) -> list[int]:
        """The parameters in the optimizer's groups at step ``k``."""
        return [
            i
            for i in range(len(self.params))
            if i in self.added and (self.added[i] is None or self.added[i] <= k)
        ]


def declares_partition(ranks: list[RankRecord]) -> bool:
    """Whether the target declared its partition: ``pieces`` (``zero``) or, at some step,
    ``owners`` (``sharded``). Exact traffic, balance and memory judge only a declared design
    (Note [Traffic judges a declared design] in ``paracheck.check.properties.traffic``)."""
    return bool(ranks) and (
        ranks[0].pieces is not None or any(st.owners is not None for st in ranks[0].steps)
    )


def owners_disagree(k: int, ranks: list[RankRecord]) -> Divergence | None:
    """A ``balance`` divergence where a rank declares other owners than rank 0 at step ``k``."""
    owners = ranks[0].steps[k].owners
    for r, rec in enumerate(ranks):
        other = rec.steps[k].owners
        if other != owners:
            return diverge(
                k,
                "balance",
                r,
                f"rank {r} declares owners {other}, rank 0 {owners}: "
                f"every rank must compute the same partition",
            )
    return None
