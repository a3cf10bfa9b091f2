"""Correct sharding designs that round differently from the oracle (Note [Comparing an update]):
the wrapped optimizer's multi-tensor (``foreach``) and ``fused`` paths, and a ZeRO-1 whose
optimizer is AdamW / Adam / SGD written out by hand, in another order than torch's."""

import torch

from paracheck.zero import ShardedOptimizer, Zero1


def _with(**extra):
    class _Sharded(ShardedOptimizer):
        def __init__(self, params, optimizer_cls, **kwargs):
            super().__init__(params, optimizer_cls, **kwargs, **extra)

    return _Sharded


ForeachSharded = _with(foreach=True)
FusedSharded = _with(fused=True)


class ManualOptimizer(torch.optim.Optimizer):
    """SGD (momentum, L2 weight decay), Adam (L2) or AdamW (decoupled), elementwise, by hand."""

    def __init__(
        self, params, kind, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, momentum=0.0
    ):
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, momentum=momentum)
        self.kind = kind
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for g in self.param_groups:
            for p in g["params"]:
                if p.grad is not None:
                    self._update(g, p, self.state[p])
        return loss

    def _update(self, g, p, st):
        grad, wd = p.grad, g["weight_decay"]
        if self.kind == "sgd":
            d = grad + wd * p if wd else grad.clone()
            if g["momentum"]:
                buf = st.get("momentum_buffer")
                d = d.clone() if buf is None else g["momentum"] * buf + d
                st["momentum_buffer"] = d
            p.sub_(g["lr"] * d)
            return
        if not st:
            st["step"] = torch.tensor(0.0)
            st["exp_avg"] = torch.zeros_like(p)
            st["exp_avg_sq"] = torch.zeros_like(p)
        st["step"] += 1
        t = st["step"].item()
        b1, b2 = g["betas"]
        if self.kind == "adam" and wd:
            grad = grad + wd * p
        if self.kind == "adamw":
            p.mul_(1 - g["lr"] * wd)
        st["exp_avg"] = b1 * st["exp_avg"] + (1 - b1) * grad
        st["exp_avg_sq"] = b2 * st["exp_avg_sq"] + (1 - b2) * grad * grad
        m_hat = st["exp_avg"] / (1 - b1**t)
        v_hat = st["exp_avg_sq"] / (1 - b2**t)
        p.sub_(g["lr"] * m_hat / (v_hat.sqrt() + g["eps"]))


_KINDS = {torch.optim.SGD: "sgd", torch.optim.Adam: "adam", torch.optim.AdamW: "adamw"}


class ManualZero1(Zero1):
    """Zero1 stepping its pieces with ``ManualOptimizer`` of the kind ``optimizer_cls`` names."""

    def __init__(self, module, optimizer_cls, **kwargs):
        kind = _KINDS[optimizer_cls]

        class _Manual(ManualOptimizer):
            def __init__(self, params, **kw):
                super().__init__(params, kind, **kw)

        super().__init__(module, _Manual, **kwargs)
