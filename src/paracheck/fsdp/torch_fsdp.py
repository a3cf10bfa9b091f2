"""TorchFSDP: PyTorch's FSDP2 (``torch.distributed.fsdp.fully_shard``) behind the CS336 FSDP
interface, so paracheck checks PyTorch's fully sharded training with the properties its own
``paracheck.fsdp.FSDP`` meets (target ``torch-fsdp``).

Note [Wrapping with fully_shard]
    * Groups: ``fully_shard`` is applied to every submodule that owns parameters directly, then
      to the root (the usual per-layer wrapping: one all-gather per layer). A parameter reached
      from two modules (a tied weight) must belong to one group, so a module owning one is left
      to the root's group, as torch's documentation asks for shared parameters. A module whose
      parent owns parameters of its own is left to the parent's group: the parent's forward may
      read the child's parameters without calling it (``nn.MultiheadAttention`` reads
      ``out_proj.weight``), and a group is gathered only when its module is called (the rule of
      paracheck's own FSDP, Note [A module reads its children's parameters]). Nor is
      ``nn.MultiheadAttention`` a group of its own: FSDP2 passes a group's inputs through an
      autograd function, so a self-attention's query, key and value (one tensor, ``x, x, x``)
      arrive as three tensors, and MHA, which tells self-attention by ``query is key``, projects
      them with three matrix products instead of one packed product: under bfloat16 autocast the
      input's gradient is then rounded three times, not once (5e-4 apart on a tied embedding of
      ``examples/stock_models.py``; ``docs/findings-torch-fsdp.md``).
    * Initial state: ``fully_shard`` shards each rank's own tensors and assumes they are equal;
      the constructor broadcasts parameters and buffers from rank 0 first (as torch DDP does).
    * Accumulation: ``no_sync()`` is ``set_requires_gradient_sync(False)`` on the root (which
      sets every group below it) for the block (FSDP2 then keeps the unsharded gradients and reduces their sum at the next
      synchronised backward); ``finish_gradient_synchronization()`` has nothing to do: FSDP2
      waits for its reduce-scatters at the end of backward.
    * Reading: ``gather_full_params()`` and ``full_gradients()`` are each DTensor's
      ``full_tensor()`` (collectives), in ``module.parameters()`` order.
    * ``compute_dtype``: ``MixedPrecisionPolicy(param_dtype=compute_dtype)`` on every group:
      FSDP2 casts each shard before its all-gather and the floating inputs on the way in, and
      reduces the gradients in ``compute_dtype`` (its default), into float32 shards; it declares
      so (``paracheck_reduce_dtype``). The reference reduces in float32 instead: between them
      both readings are checked. ``reduce_dtype=torch.float32`` is not used because FSDP2 then
      raises in the backward inside ``no_sync()`` when a group has not run its forward
      (``docs/findings-torch-fsdp.md``).
    * The parameters are DTensors sharded on dim 0 (``torch.chunk``: uneven, the last ranks'
      shards may be smaller or empty); the optimizer is built over them as over any parameters.
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["TorchFSDP"]


def _shared(module: nn.Module) -> set[int]:
    """The ids of the parameters owned by more than one module (tied weights)."""
    owners: dict[int, int] = {}
    for m in module.modules():
        for p in m._parameters.values():
            if p is not None:
                owners[id(p)] = owners.get(id(p), 0) + 1
    return {i for i, n in owners.items() if n > 1}


def _read_by_parent(module: nn.Module) -> set[int]:
    """The ids of the modules whose parent owns parameters of its own: such a parent may read its
    children's parameters in its forward without calling them (``nn.MultiheadAttention`` reads
    ``out_proj.weight``), so a child is grouped with its parent, never gathered on its own call."""
    out: set[int] = set()
    for parent in module.modules():
        if any(p is not None for p in parent._parameters.values()):
            out.update(id(child) for child in parent.children())
    return out


class TorchFSDP(nn.Module):
    """``fully_shard`` per parameter-owning submodule and on the root, with the CS336 interface;
    see Note [Wrapping with fully_shard]. The constructor and every forward and backward are
    collectives."""

    # The dtype the gradients are reduced in where a compute dtype is given (the policy's).
    paracheck_reduce_dtype = "bfloat16"
    # Its shards are DTensors: checkpointed through DCP, resharded on load (Note [Resuming at
    # another world size] in paracheck.check.properties.reshard).
    paracheck_checkpoint = "torch.distributed.checkpoint"

    def __init__(self, module: nn.Module, compute_dtype: torch.dtype | None = None):
        super().__init__()
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        policy = MixedPrecisionPolicy()
        if compute_dtype is not None:
            policy = MixedPrecisionPolicy(param_dtype=compute_dtype)

        with torch.no_grad():
            for t in [*module.parameters(), *module.buffers()]:
                dist.broadcast(t, src=0)
        device = next(iter(module.parameters()), torch.empty(0)).device
        mesh = init_device_mesh(device.type, (dist.get_world_size(),))
        shared = _shared(module)
        read_by_parent = _read_by_parent(module)
        for m in list(module.modules())[1:]:
            own = [p for p in m._parameters.values() if p is not None]
            if isinstance(m, nn.MultiheadAttention) or id(m) in read_by_parent:
                continue  # its parameters go to an enclosing group (Note [Wrapping with fully_shard])
            if own and not any(id(p) in shared for p in own):
                fully_shard(m, mesh=mesh, mp_policy=policy)
        self.module = fully_shard(module, mesh=mesh, mp_policy=policy)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        self.module.set_requires_gradient_sync(False)  # recurse=True: every group below too
        try:
            yield
        finally:
            self.module.set_requires_gradient_sync(True)

    def finish_gradient_synchronization(self) -> None:
        """Nothing to do: FSDP2 has reduced every gradient when backward returns."""

    def gather_full_params(self) -> list[torch.Tensor]:
        return [_full(p) for p in self.module.parameters()]

    def full_gradients(self) -> list[torch.Tensor | None]:
        return [None if p.grad is None else _full(p.grad) for p in self.module.parameters()]


def _full(t: torch.Tensor) -> torch.Tensor:
    full = getattr(t, "full_tensor", None)
    return (full() if full is not None else t).detach().clone()
