"""A constructor with required arguments paracheck does not pass is refused when the target is
resolved, naming the constructor and the arguments; arguments it passes or that have defaults
are accepted. Reference: what each kind's rank program passes (paracheck.check.targets)."""

import textwrap

import pytest

from paracheck.check.adapters import discover_adapters
from paracheck.check.targets import TargetError, resolve_target
from paracheck.cli import main

SOURCE = """
import torch
import torch.nn as nn


class DDP(nn.Module):
    def __init__(self, module, a, b, c):
        super().__init__()
        self.module = module

    def forward(self, x):
        return self.module(x)

    def finish_gradient_synchronization(self):
        pass


class GoodDDP(DDP):
    def __init__(self, module, bucket_size_mb=25.0, *, rank, world_size, flag=True, **kwargs):
        nn.Module.__init__(self)
        self.module = module


def get_ddp(module, tokenizer):
    return module


class ShardedOptimizer(torch.optim.Optimizer):
    def __init__(self, params, optimizer_cls, lr_scale, *, owner, **kwargs):
        pass


class GoodSharded(torch.optim.Optimizer):
    def __init__(self, params, optimizer_cls, lr_scale=1.0, **kwargs):
        pass


class Zero:
    def __init__(self, module, optimizer_cls, *, params, bucket_size_mb, stage, **kwargs):
        pass


class GoodZero:
    def __init__(self, module, optimizer_cls, *, params, bucket_size_mb, **kwargs):
        pass
"""


@pytest.fixture(scope="module")
def impl(tmp_path_factory):
    path = tmp_path_factory.mktemp("unsupplied") / "mypkg.py"
    path.write_text(textwrap.dedent(SOURCE))
    return str(path)


def test_ddp_class_with_unsupplied_arguments_is_refused(impl):
    """DDP(module, a, b, c) names the constructor and its three arguments."""
    with pytest.raises(TargetError) as err:
        resolve_target(f"{impl}:DDP")
    assert str(err.value).startswith(
        f"{impl}:DDP.__init__ requires a, b, c, which paracheck does not supply; give them "
        f"defaults or wrap the class"
    )
    with pytest.raises(TargetError, match=r"DDP.__init__ requires a, b, c"):
        resolve_target(f"{impl}:DDP", "ddp")


def test_function_with_unsupplied_argument_is_refused(impl):
    """get_ddp(module, tokenizer) names the function, in the singular."""
    with pytest.raises(TargetError) as err:
        resolve_target(f"{impl}:get_ddp")
    assert str(err.value).startswith(
        f"{impl}:get_ddp requires tokenizer, which paracheck does not supply; give it a default "
        f"or wrap the function"
    )


@pytest.mark.parametrize(
    ("name", "kind", "missing"),
    [("ShardedOptimizer", "sharded", "lr_scale, owner"), ("Zero", "zero", "stage")],
)
def test_optimizer_with_unsupplied_arguments_is_refused(impl, name, kind, missing):
    """Sharded optimizers and ZeRO wrappers: arguments beyond what their rank program passes."""
    for given in (None, kind):
        with pytest.raises(TargetError, match=rf"{name}.__init__ requires {missing}, which"):
            resolve_target(f"{impl}:{name}", given)


@pytest.mark.parametrize(
    ("name", "kind"), [("GoodDDP", "ddp"), ("GoodSharded", "sharded"), ("GoodZero", "zero")]
)
def test_defaults_and_supplied_arguments_are_accepted(impl, name, kind):
    """Defaults, **kwargs and the arguments paracheck passes by name resolve."""
    assert resolve_target(f"{impl}:{name}").kind == kind


def test_adapter_with_unsupplied_argument_is_refused(tmp_path):
    """--adapters: get_sharded_optimizer(params, optimizer_cls, extra) is named with its argument."""
    path = tmp_path / "adapters.py"
    path.write_text(
        "def get_sharded_optimizer(params, optimizer_cls, extra, **kwargs):\n    return 1\n"
    )
    with pytest.raises(TargetError, match=r"get_sharded_optimizer requires extra, which"):
        discover_adapters(str(path))


def test_unsupplied_arguments_exit_2(impl, capsys):
    """From the command line: exit 2 before any rank starts, the message on stderr."""
    assert main(["check", f"{impl}:DDP", "--no-database"]) == 2
    assert (
        "DDP.__init__ requires a, b, c, which paracheck does not supply" in capsys.readouterr().err
    )
