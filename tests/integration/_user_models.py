"""Models a user might give ``--model``, ``--batch`` and ``--loss-fn`` that cannot be checked
(tests/integration/test_user_model.py): each breaks one rule of Note [A user's model]."""

import random

import torch
from torch import nn


def raises(seed, dtype):
    raise RuntimeError("no weights file")


def not_a_module(seed, dtype):
    return {"weight": torch.zeros(2)}


def unseeded(seed, dtype):
    model = nn.Linear(3, 2).to(dtype)
    with torch.no_grad():
        model.weight.add_(random.random())  # Python's generator, not the seed
    return model


def dropout(seed, dtype):
    return nn.Sequential(nn.Linear(3, 2), nn.Dropout(0.5)).to(dtype)


def frozen(seed, dtype):
    return nn.Linear(3, 2).to(dtype).requires_grad_(False)


def linear(seed, dtype):
    return nn.Linear(3, 2).to(dtype)


def batch(seed, n, dtype):
    return torch.randn(n, 3, dtype=dtype), torch.randn(n, 2, dtype=dtype)


def wrong_rows(seed, n, dtype):
    return torch.randn(n + 1, 3, dtype=dtype), torch.randn(n + 1, 2, dtype=dtype)


def wrong_dtype(seed, n, dtype):
    return torch.randn(n, 3, dtype=torch.float16), torch.randn(n, 2, dtype=dtype)


def per_row_loss(output, targets):
    return ((output - targets) ** 2).mean(dim=1)


def batch_mean_net(seed, dtype):
    """A forward that couples rows without BatchNorm: it subtracts the batch's mean."""

    class Centred(nn.Linear):
        def forward(self, x):
            return super().forward(x - x.mean(dim=0, keepdim=True))

    return Centred(3, 2).to(dtype)


def float32_only(seed, dtype):
    """A model with a dtype hard-coded in its forward: it runs in float32 only."""

    class Hard(nn.Linear):
        def forward(self, x):
            if x.dtype == torch.float64:
                raise TypeError("this kernel has no float64 version")
            return super().forward(x)

    return Hard(3, 2).to(dtype)


class Output(dict):
    """A forward's output as Hugging Face's ``ModelOutput`` is one: a mapping of tensors, beside
    an object that is no tensor (a cache)."""


class _Structured(nn.Linear):
    def __init__(self, centred: bool):
        super().__init__(3, 2)
        self.centred = centred

    def forward(self, x):
        y = super().forward(x - x.mean(dim=0, keepdim=True) if self.centred else x)
        return Output(logits=y, hidden=(x * 2.0,), cache=object())


def structured(seed, dtype):
    return _Structured(centred=False).to(dtype)


def structured_coupled(seed, dtype):
    """A structured output whose logits couple the rows (the batch's mean subtracted)."""
    return _Structured(centred=True).to(dtype)


def structured_loss(output, targets):
    return ((output["logits"] - targets) ** 2).mean()


def no_tensor(seed, dtype):
    class Nothing(nn.Linear):
        def forward(self, x):
            return {"cache": object()}

    return Nothing(3, 2).to(dtype)
