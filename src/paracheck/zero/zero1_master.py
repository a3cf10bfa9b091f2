"""ZeRO-1 with float32 masters of each rank's chunk of bfloat16 / float16 parameters: ``Zero1``
(``paracheck.zero.zero1``) minus nothing, plus the masters."""

from __future__ import annotations

import torch

from paracheck.zero.sharded import clip_by_global_norm
from paracheck.zero.zero1 import Zero1

__all__ = ["MasterWeightsZero1"]


# Note [Zero1 master weights]
#   ``MasterWeightsZero1`` keeps float32 masters of bfloat16 / float16 parameters, as mixed-
#   precision ZeRO does: rank r holds the masters of its own chunk of every bucket only (a float32
#   copy of the chunk, padding included), so masters cost 4 / W bytes per parameter. The wrapped
#   optimizer steps 1-D views of that copy, one per piece, and its state is float32. After the
#   synchronisation each master view's ``.grad`` is its piece's reduced gradient cast to float32
#   (exact: every bfloat16 / float16 value is a float32 value); after the local step each rank
#   rounds its masters into its chunk of the parameter buckets, then the chunks are all-gathered
#   as in ``Zero1``, so every rank ends with the masters' rounding, bit for bit. The gradients are
#   reduced in the parameters' dtype, as ``Zero1`` reduces them. ``master_params()`` gathers the
#   masters whole (a collective), and ``state_dict()`` carries them as a top-level ``"masters"``
#   entry (index -> tensor, as ``MasterWeightsShardedOptimizer`` does), so a reload resumes from
#   them; a dict without one starts them from the parameters. Parameters of float32 or float64
#   are stepped as ``Zero1`` steps them, with no masters.
_LOW = (torch.bfloat16, torch.float16)


class MasterWeightsZero1(Zero1):
    """``Zero1`` whose ranks keep float32 masters of their chunk of bfloat16 / float16
    parameters (Note [Zero1 master weights]). ``master_params()``: one float32 tensor or None per
    parameter of ``param_groups`` (a collective)."""

    master_dtype = torch.float32

    def _build_buffers(self) -> None:
        super()._build_buffers()
        self._master_shard: list[torch.Tensor] | None = None
        if self.trainable[0].dtype not in _LOW:
            return
        shards = []
        for b, flat in enumerate(self._param_flat):
            s = self.layout.shard_numel(b)
            shards.append(flat.narrow(0, self.rank * s, s).to(self.master_dtype, copy=True))
        self._master_shard = shards
        self._stepped = [
            shards[pc.bucket].narrow(
                0, pc.offset - self.rank * self.layout.shard_numel(pc.bucket), pc.length
            )
            for pc in self.pieces
        ]

    def _attach_piece_grads(self) -> None:
        if self._master_shard is None:
            return super()._attach_piece_grads()
        for k, pc in enumerate(self.pieces):
            has = self._has_grad[pc.param]
            self._stepped[k].grad = self._piece_grads[k].to(self.master_dtype) if has else None

    def _all_gather_parameters(self) -> None:
        self._round_masters()
        super()._all_gather_parameters()

    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """``Zero1.clip_grad_norm_`` on the reduced chunks themselves (in the parameters' dtype,
        where single-process training clips), then the masters' gradients cast from them again:
        the masters step on the clipped gradients, and ``full_gradients()`` reports them."""
        if self._master_shard is None:
            return super().clip_grad_norm_(max_norm)
        grads = [
            self._piece_grads[k]
            for g in self.param_groups
            for p in g["params"]
            if id(p) in self._index and self._has_grad[self._index[id(p)]]
            for k in self._pieces_of[self._index[id(p)]]
        ]
        norm = clip_by_global_norm(grads, grads, max_norm, self._param_flat[0], self.process_group)
        self._attach_piece_grads()
        return norm

    def _round_masters(self) -> None:
        """Each bucket's chunk of this rank becomes its masters, rounded."""
        if self._master_shard is None:
            return
        with torch.no_grad():
            for b, shard in enumerate(self._master_shard):
                s = self.layout.shard_numel(b)
                self._param_flat[b].narrow(0, self.rank * s, s).copy_(shard)

    def master_params(self) -> list[torch.Tensor | None]:
        """The float32 master of every parameter of ``param_groups`` (flattened, in order), None
        for a frozen one or where the parameters are float32 or wider: gathered from every rank's
        chunk, so a collective."""
        order = [p for g in self.param_groups for p in g["params"]]
        if self._master_shard is None:
            return [None] * len(order)
        fulls = self._gather_buckets(self._master_shard)
        out = []
        for p in order:
            i = self._index.get(id(p))
            if i is None:
                out.append(None)
                continue
            b, off = self._where[i]
            out.append(fulls[b][off : off + p.numel()].view_as(p).clone())
        return out

    def state_dict(self) -> dict:
        """The optimizer's consolidated dict, and the masters whole under ``"masters"`` (index in
        ``param_groups`` -> float32 tensor on the CPU). A collective."""
        sd = self.optimizer.state_dict()
        masters = self.master_params()
        if self._master_shard is not None:
            sd["masters"] = {
                i: m.detach().to("cpu", copy=True) for i, m in enumerate(masters) if m is not None
            }
        return sd

    def load_state_dict(self, state_dict: dict) -> None:
        """The optimizer's state, then each master from ``"masters"``, or from its parameter
        where the dict has none (a plain optimizer's dict)."""
        state_dict = dict(state_dict)
        masters = state_dict.pop("masters", None) or {}
        self.optimizer.load_state_dict(state_dict)
        if self._master_shard is None:
            return
        order = [p for g in self.param_groups for p in g["params"]]
        with torch.no_grad():
            for j, p in enumerate(order):
                i = self._index.get(id(p))
                if i is None:
                    continue
                whole = masters.get(j)
                source = p.detach() if whole is None else whole.to(p.device)
                flat_source = source.reshape(-1).to(self.master_dtype)
                for k in self._pieces_of[i]:
                    pc = self.pieces[k]
                    self._stepped[k].copy_(flat_source[pc.start : pc.start + pc.length])
