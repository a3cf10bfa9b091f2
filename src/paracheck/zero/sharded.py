"""ShardedOptimizer: optimizer-state sharding by whole parameters, then a broadcast from each owner.

The CS336 design. Every rank holds every parameter and (from a DDP wrapper) every averaged
gradient; each parameter is *owned* by one rank (``partition_by_size``), which alone keeps its
optimizer state and updates it, then broadcasts the new value. Saves optimizer-state memory, not
gradient memory, and communicates more than ZeRO-1: (3W-2)/(2W-2) times its bus bytes (2x at
W = 2), 1.5x the bytes each rank receives (Note [Owner broadcast versus ZeRO-1] in
``paracheck.accounting.traffic``); ``Zero1`` is the real thing.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from paracheck.zero.partition import ParamPartition, partition_by_size

__all__ = ["MasterWeightsShardedOptimizer", "ShardedOptimizer"]


def check_optimizer_cls(optimizer_cls) -> type[torch.optim.Optimizer]:
    if isinstance(optimizer_cls, type) and issubclass(optimizer_cls, torch.optim.Optimizer):
        return optimizer_cls
    what = (
        f"an {type(optimizer_cls).__name__} instance"
        if isinstance(optimizer_cls, torch.optim.Optimizer)
        else repr(optimizer_cls)
    )
    raise TypeError(
        f"optimizer_cls={what} must be a torch.optim.Optimizer subclass (the class, not an instance)"
    )


def _param_weight(p: torch.Tensor) -> int:
    # Only a trainable parameter ever gets optimizer state; a frozen one costs its owner nothing.
    return p.numel() * p.element_size() if p.requires_grad else 0


class ShardedOptimizer(torch.optim.Optimizer):
    """``optimizer_cls`` over ``params``, with its state sharded across the ranks of ``process_group``.

    Contract: when every rank calls ``step()`` with the same parameters and the same (already
    averaged) gradients, every rank ends with bitwise identical parameters, each equal bit for bit
    to what ``optimizer_cls`` over the same param groups computes in one process: the owner runs
    exactly that update and broadcasts it. Precondition: ``optimizer_cls`` updates each parameter
    from its own gradient and state only (SGD, Adam, AdamW and any elementwise or per-tensor rule;
    not one that couples parameters inside ``step``), and every rank gives the same parameters in
    the same order and groups.

    * Partition (Note [Balance bound] in ``paracheck.zero.partition``): a parameter's weight is its
      bytes if it requires grad, else 0; the largest parameter goes first, to the least loaded rank;
      ``max load <= total / W + (W - 1) / W * largest``. ``add_param_group`` (in the constructor and
      during training) extends the partition without moving earlier parameters.
    * The wrapped optimizer (``local_optimizer``) is built over this rank's parameters with one
      group per group of ``self.param_groups`` (possibly empty) carrying every hyper-parameter of
      that group; ``self.state`` is its state (this rank's shard only). Hyper-parameters changed
      in ``self.param_groups`` (an LR scheduler) are copied to the wrapped groups at every step.
    * ``state_dict()`` returns the *consolidated* state of every parameter in the format
      ``optimizer_cls`` itself would produce (tensors on CPU); ``load_state_dict()`` accepts it,
      or a plain ``optimizer_cls`` state dict, at any world size: each rank keeps what it owns.

    Collectives every rank must call: ``step()`` (one broadcast per trainable parameter, from its
    owner) and ``state_dict()`` (an all-gather of the shards). ``add_param_group``,
    ``load_state_dict`` and ``zero_grad`` are local: the partition is a pure function of sizes.
    """

    def __init__(
        self, params, optimizer_cls: type[torch.optim.Optimizer], *, process_group=None, **kwargs
    ):
        check_optimizer_cls(optimizer_cls)
        self.process_group = process_group
        self.world_size = dist.get_world_size(process_group) if dist.is_initialized() else 1
        self.rank = dist.get_rank(process_group) if dist.is_initialized() else 0
        self.optimizer_cls = optimizer_cls
        self._kwargs = dict(kwargs)
        self._partition = ParamPartition(self.world_size, (), ())
        self._params: list[torch.Tensor] = []  # every parameter, in the order of self.param_groups
        self.local_optimizer: torch.optim.Optimizer | None = None
        # torch's constructor calls self.add_param_group once per group (the CS336 protocol).
        super().__init__(params, kwargs)
        self.state = self.local_optimizer.state

    # -- partition -----------------------------------------------------------------------------
    @property
    def partition(self) -> ParamPartition:
        """Owner of every parameter, in the order of ``self.param_groups`` (flattened)."""
        return self._partition

    def _source(self, owner: int) -> int:
        """Global rank of group rank ``owner`` (collectives name global ranks)."""
        if self.process_group is None:
            return owner
        return dist.get_global_rank(self.process_group, owner)

    def _extend_partition(self, params: list[torch.Tensor]) -> ParamPartition:
        """The partition with ``params`` appended (the policy: Note [Balance bound])."""
        return partition_by_size(
            [_param_weight(p) for p in params], self.world_size, previous=self._partition
        )

    def add_param_group(self, param_group: dict) -> None:
        """Add a group: partition its parameters (extending the current partition) and give this
        rank's share, with every hyper-parameter of the group, to the wrapped optimizer."""
        super().add_param_group(param_group)  # validates, fills our defaults, appends
        group = self.param_groups[-1]
        params = group["params"]
        self._partition = self._extend_partition(params)
        self._params.extend(params)
        owners = self._partition.owners[len(self._partition.owners) - len(params) :]
        names = group.get("param_names")
        self._add_local_group(
            group,
            [p for p, o in zip(params, owners) if o == self.rank],
            None if names is None else [n for n, o in zip(names, owners) if o == self.rank],
        )

    def _add_local_group(self, group: dict, mine: list, names: list | None) -> None:
        """Give the wrapped optimizer this rank's parameters of ``group``, with its options."""
        add_local_group(self, group, [self._local_tensor(p) for p in mine], names)

    def _local_tensor(self, p: torch.Tensor) -> torch.Tensor:
        """The tensor the wrapped optimizer steps for owned parameter ``p``: ``p`` itself."""
        return p

    def _param_of(self, t: torch.Tensor) -> torch.Tensor:
        """The parameter whose local tensor ``t`` is (the inverse of ``_local_tensor``)."""
        return t

    def _sync_hyperparameters(self) -> None:
        sync_hyperparameters(self)

    # -- step ----------------------------------------------------------------------------------
    def step(self, closure=None, **kwargs):
        """Step this rank's shard with the wrapped optimizer, then broadcast every trainable
        parameter from its owner. A collective: every rank must call it."""
        self._sync_hyperparameters()
        if closure is None:
            loss = self.local_optimizer.step(**kwargs)
        else:
            loss = self.local_optimizer.step(closure, **kwargs)
        self._broadcast_parameters()
        return loss

    def _broadcast_parameters(self) -> None:
        if self.world_size == 1:
            return
        # Asynchronous, one per parameter: no flat staging copy (so no extra memory), and the
        # backend pipelines them; all are waited for before step() returns.
        handles = [
            dist.broadcast(p.detach(), src=src, group=self.process_group, async_op=True)
            for p, src in self._broadcast_sources()
        ]
        for h in handles:
            h.wait()

    def _broadcast_sources(self) -> list[tuple[torch.Tensor, int]]:
        """Every trainable parameter with the global rank of its owner, which holds its new value
        (a frozen parameter is never changed by the optimizer)."""
        return [
            (p, self._source(owner))
            for p, owner in zip(self._params, self._partition.owners)
            if p.requires_grad
        ]

    # -- clipping ------------------------------------------------------------------------------
    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """Clip the gradients of every parameter of ``self.param_groups`` to the global 2-norm
        ``max_norm``, as ``torch.nn.utils.clip_grad_norm_`` over all of them in one process does
        (coefficient ``max_norm / (norm + 1e-6)``, at most 1). Each rank sums the squares of the
        gradients it owns; one all-reduce adds the ranks' sums. Returns the norm. A collective."""
        return clip_by_global_norm(
            [p.grad for p in self._params if p.grad is not None],
            [
                p.grad
                for p, owner in zip(self._params, self._partition.owners)
                if owner == self.rank and p.grad is not None
            ],
            max_norm,
            self._params[0] if self._params else None,
            self.process_group,
        )

    # -- state ---------------------------------------------------------------------------------
    def _gather(self, obj) -> list:
        if self.world_size == 1:
            return [obj]
        out = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.process_group)
        return out

    def state_dict(self) -> dict:
        """The consolidated state of every parameter (a collective), in ``optimizer_cls``'s format
        over ``self.param_groups``: ``{"state": {index: {...}}, "param_groups": [...]}``. It changes
        nothing (hyper-parameters are read from ``self.param_groups``, synced only by ``step()``)."""
        index = {id(p): i for i, p in enumerate(self._params)}
        local = {
            index[id(self._param_of(t))]: {
                k: (v.detach().to("cpu", copy=True) if torch.is_tensor(v) else v)
                for k, v in st.items()
            }
            for t, st in self.local_optimizer.state.items()
        }
        state = {}
        for part in self._gather(local):
            state.update(part)
        groups = []
        for g in self.param_groups:
            packed = {k: v for k, v in g.items() if k != "params"}
            packed["params"] = [index[id(p)] for p in g["params"]]
            groups.append(packed)
        return {"state": dict(sorted(state.items())), "param_groups": groups}

    def load_state_dict(self, state_dict: dict) -> None:
        """Load a consolidated (or plain ``optimizer_cls``) state dict saved at any world size;
        this rank keeps the state of the parameters it owns now."""
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.param_groups):
            raise ValueError(
                f"state_dict has {len(saved_groups)} parameter groups, this optimizer has "
                f"{len(self.param_groups)}: they must match"
            )
        for k, (saved, group) in enumerate(zip(saved_groups, self.param_groups)):
            if len(saved["params"]) != len(group["params"]):
                raise ValueError(
                    f"state_dict group {k} has {len(saved['params'])} parameters, this optimizer's "
                    f"has {len(group['params'])}: they must match"
                )
        by_saved_index = {}
        for saved, group in zip(saved_groups, self.param_groups):
            by_saved_index.update(zip(saved["params"], group["params"]))
            group.update({k: v for k, v in saved.items() if k != "params"})
        local_index = {
            id(p): i
            for i, p in enumerate(p for g in self.local_optimizer.param_groups for p in g["params"])
        }
        local_groups = []
        for group, lg in zip(self.param_groups, self.local_optimizer.param_groups):
            packed = {k: v for k, v in group.items() if k not in ("params", "param_names")}
            packed["params"] = [local_index[id(p)] for p in lg["params"]]
            if "param_names" in lg:
                packed["param_names"] = list(lg["param_names"])
            local_groups.append(packed)
        local_state = {
            local_index[id(t)]: st
            for i, st in state_dict["state"].items()
            if id(t := self._local_tensor(by_saved_index[i])) in local_index
        }
        self.local_optimizer.load_state_dict({"state": local_state, "param_groups": local_groups})
        # torch's load_state_dict replaces the state mapping: keep self.state pointing at it.
        self.state = self.local_optimizer.state


class MasterWeightsShardedOptimizer(ShardedOptimizer):
    """``ShardedOptimizer`` with float32 master weights (Note [Master weights] in
    ``paracheck.cases``): the owner of every trainable parameter narrower than float32 (bfloat16,
    float16) keeps a float32 copy of it, its *master*, and the wrapped optimizer steps the masters
    (so its state is float32 too). ``step()`` sets each owned master's gradient to its
    parameter's (already averaged) gradient in float32, steps, copies every owned master into its
    parameter (rounding it) and broadcasts the parameters as ``ShardedOptimizer`` does: a
    bfloat16 model whose updates are smaller than half a bfloat16 ulp still learns. A parameter
    of float32 or wider is its own master.

    Memory: 4 bytes per owned element of a narrower parameter beside the optimizer state (a
    master is not optimizer state: it replaces the parameter as what the optimizer steps).
    ``state_dict()`` carries the masters beside ``state`` and ``param_groups``, as ``"masters"``
    (parameter index -> float32 tensor), so that a reload resumes from the masters, not from the
    rounded parameters; ``load_state_dict()`` of a dict without it (a plain optimizer's) starts the
    masters from the parameters. ``master_params()`` (a collective, for
    checks) returns every master, one per parameter of ``param_groups``.
    """

    _NARROW = (torch.bfloat16, torch.float16)

    def __init__(self, params, optimizer_cls, *, process_group=None, **kwargs):
        self._masters: dict[int, torch.Tensor] = {}  # id(parameter) -> its master
        self._owner_of_master: dict[int, torch.Tensor] = {}  # id(master) -> its parameter
        super().__init__(params, optimizer_cls, process_group=process_group, **kwargs)

    def _new_master(self, p: torch.Tensor) -> torch.Tensor:
        return p.detach().to(torch.float32).requires_grad_(True)

    def _add_local_group(self, group: dict, mine: list, names: list | None) -> None:
        for p in mine:
            if p.requires_grad and p.dtype in self._NARROW:
                m = self._new_master(p)
                self._masters[id(p)] = m
                self._owner_of_master[id(m)] = p
        super()._add_local_group(group, mine, names)

    def _local_tensor(self, p: torch.Tensor) -> torch.Tensor:
        return self._masters.get(id(p), p)

    def _param_of(self, t: torch.Tensor) -> torch.Tensor:
        return self._owner_of_master.get(id(t), t)

    def step(self, closure=None, **kwargs):
        """Step this rank's masters on their parameters' gradients, copy them into the parameters,
        then broadcast every trainable parameter from its owner. A collective."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for p in self._params:
            m = self._masters.get(id(p))
            if m is not None:
                m.grad = None if p.grad is None else p.grad.detach().to(m.dtype)
        self._sync_hyperparameters()
        self.local_optimizer.step(**kwargs)
        with torch.no_grad():
            for p in self._params:
                m = self._masters.get(id(p))
                if m is not None:
                    p.copy_(m)
                    m.grad = None
        self._broadcast_parameters()
        return loss

    def state_dict(self) -> dict:
        sd = super().state_dict()
        index = {id(p): i for i, p in enumerate(self._params)}
        local = {
            index[pid]: m.detach().to("cpu", copy=True)
            for pid, m in self._masters.items()
            if pid in index
        }
        sd["masters"] = {}
        for part in self._gather(local):
            sd["masters"].update(part)
        return sd

    def load_state_dict(self, state_dict: dict) -> None:
        masters = state_dict.get("masters", {})
        super().load_state_dict(state_dict)
        saved_index = [i for g in state_dict["param_groups"] for i in g["params"]]
        with torch.no_grad():
            for i, p in zip(saved_index, self._params):
                m = self._masters.get(id(p))
                if m is not None:
                    m.copy_(masters[i] if i in masters else p)

    def master_params(self) -> list[torch.Tensor | None]:
        """The master of every parameter of ``param_groups`` (flattened, in order), gathered from
        its owner: float32 for a narrower trainable parameter, the parameter itself for a wider
        one, None for a frozen one. A collective; for checks (it copies every master to every
        rank)."""
        index = {id(p): i for i, p in enumerate(self._params)}
        owned = {index[pid]: m.detach().to("cpu", copy=True) for pid, m in self._masters.items()}
        gathered: dict[int, torch.Tensor] = {}
        for part in self._gather(owned):
            gathered.update(part)
        return [
            None
            if not p.requires_grad
            else gathered[i].to(p.device)
            if i in gathered
            else p.detach()
            for i, p in enumerate(self._params)
        ]


_NOT_HYPER = ("params", "param_names")


def clip_by_global_norm(
    grads: list, owned: list, max_norm: float, like: torch.Tensor | None, group=None
) -> torch.Tensor:
    """Scale ``grads`` in place by ``clamp(max_norm / (norm + 1e-6), max=1)``, ``norm`` the 2-norm
    of the tensors that every rank of ``group`` passes as ``owned`` together (each element owned
    by exactly one rank). A collective where the group has several ranks. The sum of squares is
    float64 on ``like``'s device on every rank: a rank that owns no gradient must still send what
    the others send (its dtype taken from its own gradients, gloo aborted the job). Returns
    ``norm``."""
    device = like.device if like is not None else torch.device("cpu")
    square = torch.zeros((), dtype=torch.float64, device=device)
    for g in owned:
        square += torch.linalg.vector_norm(g).to(torch.float64) ** 2
    if dist.is_initialized() and dist.get_world_size(group) > 1:
        dist.all_reduce(square, group=group)
    norm = square.sqrt()
    coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    for g in grads:
        g.mul_(coef.to(g.dtype))
    return norm


def add_local_group(
    wrapper, group: dict, local_params: list, local_names: list | None = None
) -> None:
    """Give ``wrapper.local_optimizer`` this rank's share of ``group`` (a group of the wrapper's
    ``param_groups``) with every hyper-parameter of the group, creating the local optimizer on the
    first call. The wrapped class's own defaults fill what neither the group nor the wrapper's
    kwargs gave (betas, eps, ...), and are copied back so ``wrapper.param_groups`` reads like
    ``optimizer_cls``'s own. Shared by ShardedOptimizer and Zero1Optimizer."""
    local = {k: v for k, v in group.items() if k not in _NOT_HYPER}
    local["params"] = local_params
    if local_names is not None:
        local["param_names"] = local_names
    if wrapper.local_optimizer is None:
        wrapper.local_optimizer = wrapper.optimizer_cls([local], **wrapper._kwargs)
    else:
        wrapper.local_optimizer.add_param_group(local)
    for k, v in wrapper.local_optimizer.param_groups[-1].items():
        if k not in _NOT_HYPER:
            group.setdefault(k, v)


def sync_hyperparameters(wrapper) -> None:
    """Copy every group's hyper-parameters (changed by an LR scheduler, say) into the local
    optimizer's matching group before it steps."""
    for group, local in zip(wrapper.param_groups, wrapper.local_optimizer.param_groups):
        for k, v in group.items():
            if k not in _NOT_HYPER:
                local[k] = v
