"""Rank jobs for tests/integration/test_zero1_pipelined_step.py."""

import torch
import torch.distributed as dist

from paracheck.zero import Zero1, Zero2

OPTIMIZERS = {
    "sgd-momentum": (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.01}),
    "adam": (torch.optim.Adam, {"lr": 0.01, "foreach": False}),
    "adam-foreach": (torch.optim.Adam, {"lr": 0.01, "foreach": True, "amsgrad": True}),
    "adamw": (torch.optim.AdamW, {"lr": 0.01, "weight_decay": 0.1}),
}


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8), torch.nn.Linear(8, 3)
    )


def _train(kind: str, optimizer: str, pipelined: bool, plant: str | None = None) -> dict:
    """Three steps of ``kind`` with ``optimizer`` over two parameter groups, small buckets (so
    several runs), the last layer unused by rank 1 in step 1 (pieces without a gradient).
    ``pipelined``: the step forced to go run by run (as on NCCL). Returns the parameters, the
    optimizer's consolidated state and how many times the wrapped optimizer stepped."""
    cls, kwargs = OPTIMIZERS[optimizer]
    model = _model()
    rank = dist.get_rank()
    groups = [
        {"params": [model[0].weight, model[0].bias, model[2].weight]},
        {"params": [model[2].bias, model[3].weight, model[3].bias], "lr": kwargs["lr"] / 2},
    ]
    zero = (Zero1 if kind == "zero1" else Zero2)(
        model, cls, params=groups, bucket_size_mb=60 / 2**20, **kwargs
    )
    zero._pipeline_step = pipelined
    if plant == "overlapping-runs":  # a bucket in two runs: its pieces stepped twice
        whole = zero._step_runs

        def overlapping():
            runs = whole()
            return [range(max(r.start - 1, 0), r.stop) for r in runs]

        zero._step_runs = overlapping
    local = zero.optimizer.local_optimizer
    steps = [0]
    step = local.step

    def counted(*args, **kw):
        steps[0] += 1
        return step(*args, **kw)

    local.step = counted
    for k in range(3):
        torch.manual_seed(100 * k + rank)
        x = torch.randn(4, 6)
        h = zero.module[:3](x) if k == 1 and rank == 1 else zero(x)
        h.pow(2).sum().backward()
        zero.finish_gradient_synchronization()
        zero.step()
        zero.zero_grad(set_to_none=True)
    state = zero.state_dict()["state"]
    flat_state = [
        v for i in sorted(state) for key in sorted(state[i]) for v in [state[i][key]]
        if torch.is_tensor(v)
    ]  # fmt: skip
    return {
        "params": [p.detach().clone() for p in model.parameters()],
        "state": flat_state,
        "steps": steps[0],
        "runs": len(zero._step_runs()),
    }


def compare(spec: str) -> dict:
    """The pipelined step against the plain one (``spec``: ``kind:optimizer[:plant]``): equal bit
    for bit, and how often each stepped."""
    kind, optimizer, *rest = spec.split(":")
    plant = rest[0] if rest else None
    plain, pipelined = _train(kind, optimizer, False), _train(kind, optimizer, True, plant)
    same = all(
        a.shape == b.shape and torch.equal(a, b)
        for key in ("params", "state")
        for a, b in zip(plain[key], pipelined[key], strict=True)
    )
    return {
        "equal": same,
        "plain_steps": plain["steps"],
        "pipelined_steps": pipelined["steps"],
        "runs": pipelined["runs"],
    }
