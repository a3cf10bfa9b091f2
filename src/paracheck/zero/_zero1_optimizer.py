"""The optimizer face of a ``Zero1`` (``paracheck.zero.zero1``): what a user and an LR scheduler
see, stepping this rank's pieces and consolidating their state into whole tensors."""

from __future__ import annotations

from typing import Any, Protocol

import torch

from paracheck.zero.sharded import add_local_group, check_optimizer_cls, sync_hyperparameters

__all__ = ["Zero1Optimizer"]


class _Owner(Protocol):
    """What the optimizer face reads and calls of its ``Zero1`` (``paracheck.zero.zero1``, which
    imports this module: naming the protocol, not the class, keeps the import one-way)."""

    pieces: list
    trainable: list[torch.Tensor]
    _stepped: list[torch.Tensor]

    def pieces_of(self, p: torch.Tensor) -> list[torch.Tensor]: ...

    def zero_grad(self, set_to_none: bool = True) -> None: ...

    def _all_gather_parameters(self) -> None: ...

    def _gather_object(self, obj: Any) -> list: ...


class Zero1Optimizer(torch.optim.Optimizer):
    """The optimizer face of a ``Zero1``: ``param_groups`` hold the real parameters (what a user and
    an LR scheduler see), ``local_optimizer`` steps this rank's pieces, one group per group.

    ``state_dict()`` (a collective) consolidates the pieces into whole tensors per parameter, in
    ``optimizer_cls``'s own format over ``param_groups`` (tensors on CPU): a state value shaped
    like its piece is per element and is concatenated; any other (Adam's ``step``) is per tensor
    and must agree across pieces. ``load_state_dict()`` slices such a dict (saved at any world
    size, or by plain ``optimizer_cls``) back into this rank's pieces.
    """

    def __init__(self, zero: _Owner, params, optimizer_cls, **kwargs):
        check_optimizer_cls(optimizer_cls)
        self._zero = zero
        self.optimizer_cls = optimizer_cls
        self._kwargs = dict(kwargs)
        self.local_optimizer: torch.optim.Optimizer | None = None
        super().__init__(params, kwargs)
        self.state = self.local_optimizer.state

    def add_param_group(self, param_group: dict) -> None:
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        add_local_group(
            self, group, [piece for p in group["params"] for piece in self._zero.pieces_of(p)]
        )

    def _sync_hyperparameters(self) -> None:
        sync_hyperparameters(self)

    def step(self, closure=None, **kwargs):
        """Step this rank's pieces, then all-gather every bucket. A collective."""
        self._sync_hyperparameters()
        if closure is None:
            loss = self.local_optimizer.step(**kwargs)
        else:
            loss = self.local_optimizer.step(closure, **kwargs)
        self._zero._all_gather_parameters()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._zero.zero_grad(set_to_none=set_to_none)

    def _params(self) -> list[torch.Tensor]:
        return [p for g in self.param_groups for p in g["params"]]

    def state_dict(self) -> dict:
        zero = self._zero
        index = {id(p): i for i, p in enumerate(self._params())}
        piece_of = {id(t): k for k, t in enumerate(zero._stepped)}
        local = {}
        for t, st in self.local_optimizer.state.items():
            pc = zero.pieces[piece_of[id(t)]]
            p = zero.trainable[pc.param]
            local[(index[id(p)], pc.start)] = (
                pc.length,
                {
                    k: (v.detach().to("cpu", copy=True) if torch.is_tensor(v) else v)
                    for k, v in st.items()
                },
            )
        parts = {}
        for chunk in zero._gather_object(local):
            parts.update(chunk)
        params = self._params()
        state = {}
        for i in sorted({i for i, _ in parts}):
            pieces = [parts[key] for key in sorted(key for key in parts if key[0] == i)]
            state[i] = _merge_pieces(i, params[i], pieces)
        groups = []
        for g in self.param_groups:
            packed = {k: v for k, v in g.items() if k != "params"}
            packed["params"] = [index[id(p)] for p in g["params"]]
            groups.append(packed)
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict) -> None:
        zero = self._zero
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.param_groups):
            raise ValueError(
                f"state_dict has {len(saved_groups)} parameter groups, this optimizer has "
                f"{len(self.param_groups)}: they must match"
            )
        by_saved_index = {}
        for k, (saved, group) in enumerate(zip(saved_groups, self.param_groups)):
            if len(saved["params"]) != len(group["params"]):
                raise ValueError(
                    f"state_dict group {k} has {len(saved['params'])} parameters, this optimizer's "
                    f"has {len(group['params'])}: they must match"
                )
            by_saved_index.update(zip(saved["params"], group["params"]))
            group.update({key: v for key, v in saved.items() if key != "params"})
        local_params = [t for g in self.local_optimizer.param_groups for t in g["params"]]
        local_index = {id(t): j for j, t in enumerate(local_params)}
        piece_of = {id(t): k for k, t in enumerate(zero._stepped)}
        local_state = {}
        for i, st in state_dict["state"].items():
            p = by_saved_index[i]
            for t in zero.pieces_of(p):
                pc = zero.pieces[piece_of[id(t)]]
                local_state[local_index[id(t)]] = {
                    key: (
                        v.reshape(-1)[pc.start : pc.start + pc.length].clone()
                        if torch.is_tensor(v) and v.shape == p.shape
                        else v
                    )
                    for key, v in st.items()
                }
        local_groups = []
        for group, lg in zip(self.param_groups, self.local_optimizer.param_groups):
            packed = {k: v for k, v in group.items() if k not in ("params", "param_names")}
            packed["params"] = [local_index[id(t)] for t in lg["params"]]
            local_groups.append(packed)
        self.local_optimizer.load_state_dict({"state": local_state, "param_groups": local_groups})
        self.state = self.local_optimizer.state


def _merge_pieces(i: int, p: torch.Tensor, pieces: list) -> dict:
    """One parameter's state from its pieces' states ``[(length, state), ...]`` in element order:
    a value shaped ``(length,)`` in every piece is per element (concatenated, reshaped like the
    parameter); anything else is per tensor and must be equal in every piece."""
    covered = sum(n for n, _ in pieces)
    if covered != p.numel():
        raise RuntimeError(
            f"the pieces of parameter #{i} with optimizer state cover {covered} of its {p.numel()} "
            f"elements: every rank owning a piece must contribute its state"
        )
    merged = {}
    for key in pieces[0][1]:
        values = [st[key] for _, st in pieces]
        per_element = all(
            torch.is_tensor(v) and v.shape == (n,) for (n, _), v in zip(pieces, values)
        )
        if per_element:
            merged[key] = torch.cat(values).view(p.shape)
            continue
        first = values[0]
        for v in values[1:]:
            if not (torch.equal(v, first) if torch.is_tensor(v) else v == first):
                raise RuntimeError(
                    f"the pieces of parameter #{i} disagree on per-tensor state {key!r}"
                )
        merged[key] = first
    return merged
