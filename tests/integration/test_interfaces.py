"""The interfaces people write: function-style adapters, non-Module wrappers, arguments by name,
renamed hooks, CUDA-only instrumentation; each accepted reading passes, each bad input is named."""

import textwrap
import traceback

import pytest
import torch

from paracheck.cases import Case
from paracheck.check.adapters import discover_adapters, not_implemented
from paracheck.check.diagnose import cuda_only_call
from paracheck.check.ranks._cuda_stub import STUBBED, stubbed_cuda_timing
from paracheck.check.targets import TargetError, ddp_construction, import_module, resolve_target

SIZES = (1, 2, 3)

# A correct DDP body shared by the variants below: broadcast at construction, one flat
# all-reduce with presence flags in the hook.
_BODY = """
import torch
import torch.distributed as dist


def _broadcast(module):
    with torch.no_grad():
        for t in [*module.parameters(), *module.buffers()]:
            dist.broadcast(t.data, src=0)


def _average(module):
    params = [p for p in module.parameters() if p.requires_grad]
    ws = dist.get_world_size()
    if ws == 1 or not params:
        return
    flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params]
                     + [torch.tensor([p.grad is not None for p in params], dtype=params[0].dtype)])
    dist.all_reduce(flat)
    offset = 0
    for p, present in zip(params, flat[-len(params):].tolist()):
        g = flat[offset:offset + p.numel()].view_as(p) / ws
        offset += p.numel()
        p.grad = g.to(p.dtype, copy=True) if present else None
"""

VARIANTS = (
    _BODY
    + '''
from paracheck.ddp import BucketedDDP

class PlainWrapper:
    """Not an nn.Module: holds the module, has forward and __call__."""

    def __init__(self, model):
        self.model = model
        _broadcast(model)

    def forward(self, x):
        return self.model(x)

    __call__ = forward

    def finish_gradient_synchronization(self):
        _average(self.model)


class ForwardOnly:
    """Not callable: only forward."""

    def __init__(self, net):
        self.net = net
        _broadcast(net)

    def forward(self, x):
        return self.net(x)

    def finish_gradient_synchronization(self):
        _average(self.net)


class AsyncFlag(torch.nn.Module):
    """A second argument with a default that is not a bucket size."""

    def __init__(self, module, use_async_comm=True):
        super().__init__()
        self.module = module
        _broadcast(module)

    def forward(self, x):
        return self.module(x)

    def finish_gradient_synchronization(self):
        _average(self.module)


class BucketCap(BucketedDDP):
    """The bucket size keyword-only, under torch's name."""

    def __init__(self, module, *, bucket_cap_mb, use_async_comm=False):
        super().__init__(module, bucket_cap_mb)


class SyncGradients(AsyncFlag):
    """The after-backward hook under another name, taking the optimizer."""

    def finish_gradient_synchronization(self):
        raise AssertionError("not the hook in use")

    def sync_gradients(self, optimizer):
        assert isinstance(optimizer, torch.optim.Optimizer)
        _average(self.module)


class OnlySyncGradients(torch.nn.Module):
    def __init__(self, module):
        super().__init__()
        self.module = module
        _broadcast(module)

    def forward(self, x):
        return self.module(x)

    def sync_gradients(self):
        _average(self.module)


class Synchronizes(AsyncFlag):
    """CUDA timing in the hook."""

    def finish_gradient_synchronization(self):
        torch.cuda.synchronize()
        with torch.cuda.nvtx.range("all-reduce"):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            _average(self.module)
            end.record()
        torch.cuda.current_stream().synchronize()
        assert start.elapsed_time(end) >= 0.0


def get_ddp(module):
    return AsyncFlag(module)


def make_only_sync(module):
    return OnlySyncGradients(module)


def ddp_on_after_backward(ddp_model, optimizer):
    _average(ddp_model.module)
'''
)


@pytest.fixture(scope="module")
def variants(tmp_path_factory):
    path = tmp_path_factory.mktemp("user") / "user_variants.py"
    path.write_text(VARIANTS)
    return str(path)


@pytest.mark.parametrize("cls", ["PlainWrapper", "ForwardOnly", "AsyncFlag", "BucketCap"])
def test_wrapper_readings_match_oracle(paracheck_check, variants, cls):
    """Non-Module wrappers and constructors read by argument name equal the single-process oracle."""
    paracheck_check(f"{variants}:{cls}", world_sizes=SIZES, max_examples=6)


def test_renamed_hook_taking_optimizer_matches_oracle(paracheck_check, variants):
    """A hook named with finish=, taking the optimizer, equals the single-process oracle."""
    paracheck_check(
        f"{variants}:SyncGradients", finish="sync_gradients", world_sizes=SIZES, max_examples=6
    )


def test_function_style_get_ddp_matches_oracle(paracheck_check, variants):
    """get_ddp named by path brings ddp_on_after_backward from its module and equals the oracle."""
    t = resolve_target(f"{variants}:get_ddp")
    assert t.kind == "ddp" and t.finish.endswith(":ddp_on_after_backward")
    paracheck_check(t, world_sizes=SIZES, max_examples=6)


def test_cuda_timing_in_hook_matches_oracle_with_stub(paracheck_check, variants):
    """CUDA timing calls in the hook, made no-ops by stub_cuda_timing, leave the oracle's result."""
    paracheck_check(
        f"{variants}:Synchronizes", stub_cuda_timing=True, world_sizes=SIZES, max_examples=4
    )


_TIMED = """
import torch

from paracheck.fsdp import FSDP
from paracheck.loop import train_step


class TimedFSDP(FSDP):
    def gather_full_params(self):
        torch.cuda.synchronize()  # raises on a build without CUDA unless stubbed
        return super().gather_full_params()


def timed_step(model, optimizer, micro_batches):
    torch.cuda.synchronize()
    train_step(model, optimizer, micro_batches)
"""


@pytest.mark.parametrize("name,kind", [("TimedFSDP", "fsdp"), ("timed_step", "loop")])
def test_cuda_timing_stubbed_for_every_kind(paracheck_check, tmp_path, name, kind):
    """The stub applies to an FSDP and a training loop too (one entry runs every kind's rank
    program): with CUDA timing calls made no-ops, each equals the single-process oracle."""
    path = tmp_path / "timed.py"
    path.write_text(_TIMED)
    target = resolve_target(f"{path}:{name}", stub_cuda_timing=True)
    assert target.kind == kind and target.stub_cuda_timing
    assert target.job(Case()).stubbed.endswith(f":run_{kind}")
    paracheck_check(target, world_sizes=(1, 2), max_examples=3)


def test_constructor_read_by_argument_name(variants):
    """The bucket size goes to the argument named for it, by keyword; other defaults are kept."""
    async_flag = resolve_target(f"{variants}:AsyncFlag")
    assert async_flag.kind == "ddp" and not async_flag.takes_bucket
    bucket = resolve_target(f"{variants}:BucketCap")
    assert bucket.takes_bucket

    def by_mb(model, size_mb): ...
    def by_bytes(module, bucket_bytes=1 << 20, *, process_group=None): ...
    def needs(module, tokenizer): ...

    assert ddp_construction(by_mb).keywords == (("size_mb", "bucket_mb"),)
    assert ddp_construction(by_bytes).keywords == (("bucket_bytes", "bucket_bytes"),)
    with pytest.raises(TargetError, match="requires tokenizer, which paracheck does not supply"):
        ddp_construction(needs)


def test_missing_hook_names_the_option(variants):
    """A class without finish_gradient_synchronization() but with sync_gradients() is told which option to pass."""
    with pytest.raises(
        TargetError, match="it has sync_gradients\\(\\): pass --finish sync_gradients"
    ):
        resolve_target(f"{variants}:OnlySyncGradients")
    assert (
        resolve_target(f"{variants}:OnlySyncGradients", finish="sync_gradients").finish
        == "sync_gradients"
    )
    # A function of the target's module, called as f(ddp_model, optimizer).
    assert (
        resolve_target(f"{variants}:OnlySyncGradients", finish="ddp_on_after_backward").finish
        == f"{variants}:ddp_on_after_backward"
    )
    with pytest.raises(TargetError, match="--finish='no_such_hook'"):
        resolve_target(f"{variants}:OnlySyncGradients", finish="no_such_hook")


CASE = (
    '{"model": {"kind": "mlp", "in_features": 1, "widths": [1], "bias": false, "frozen": [], "tied": false, '
    '"unused": "none", "buffer": false}, "world_size": 1, "batch_sizes": [1], "steps": 1, "accumulation": 1, '
    '"no_sync": false, "optimizer": {"name": "sgd", "groups": [{"params": [0], "lr": 0.1, "weight_decay": 0.0, '
    '"momentum": 0.0, "betas": [0.9, 0.999], "add_at_step": null}], "lr_decay": 1.0, "as_generator": false}, '
    '"bucket_size_mb": 1.0, "seed": 0, "rank_dependent_init": false, "set_to_none": false}'
)


def test_function_built_wrapper_without_hook_names_the_option(paracheck_world, variants):
    """A wrapper built by a function and lacking finish_gradient_synchronization() fails naming --finish and the method."""
    from paracheck.cases import Case
    from paracheck.check.run import run_case

    result = run_case(
        paracheck_world, resolve_target(f"{variants}:make_only_sync"), Case.from_json(CASE)
    )
    assert result.error is not None
    assert (
        "has no finish_gradient_synchronization(); it has sync_gradients(): pass --finish sync_gradients"
        in result.error.report()
    )


def test_not_implemented_read_from_source(tmp_path):
    """Only a body that is just `raise NotImplementedError` (docstring aside) counts as not implemented."""
    source = textwrap.dedent('''
        def stub(module):
            """Doc."""
            # For example: return DDP(module)
            raise NotImplementedError
        def stub_call(module):
            raise NotImplementedError("todo")
        def empty(ddp_model, optimizer):
            pass
        def partial(x):
            if x:
                raise NotImplementedError
            return x
    ''')
    (tmp_path / "stubs_mod.py").write_text(source)
    mod = import_module(str(tmp_path / "stubs_mod.py"))
    assert not_implemented(mod.stub) and not_implemented(mod.stub_call)
    assert not not_implemented(mod.empty) and not not_implemented(mod.partial)
    ns = {}
    exec(source, ns)  # no source to read: counts as implemented
    assert not not_implemented(ns["stub"])


def test_adapters_lists_not_implemented(tmp_path):
    """Handout stubs are listed as not implemented and their designs are not checked."""
    (tmp_path / "adapters_partial.py").write_text(
        textwrap.dedent('''
        from paracheck.ddp import FlatDDP
        def get_ddp(module):
            return FlatDDP(module)
        def ddp_on_after_backward(ddp_model, optimizer):
            ddp_model.finish_gradient_synchronization()
        def get_ddp_bucketed(module, bucket_size_mb):
            """Doc."""
            raise NotImplementedError
        def ddp_bucketed_on_after_backward(ddp_model, optimizer):
            raise NotImplementedError()
        def get_ddp_individual_parameters(module):
            return FlatDDP(module)
        def ddp_individual_parameters_on_after_backward(ddp_model, optimizer):
            raise NotImplementedError
    ''')
    )
    found = discover_adapters(str(tmp_path / "adapters_partial.py"))
    status = dict(found.functions)
    assert (
        status["get_ddp_bucketed"] == status["ddp_bucketed_on_after_backward"] == "not implemented"
    )
    assert status["get_ddp"] == "implemented"
    assert [t.path.rpartition(":")[2] for t in found.targets] == ["get_ddp"]
    assert any(
        "individual-parameters DDP: ddp_individual_parameters_on_after_backward is not implemented"
        in s
        for s in found.skipped
    )
    (tmp_path / "nothing.py").write_text("def unrelated():\n    pass\n")
    with pytest.raises(TargetError, match="--adapters=.*defines none"):
        discover_adapters(str(tmp_path / "nothing.py"))
    with pytest.raises(TargetError, match="--adapters='no_such_adapters_module' does not import"):
        discover_adapters("no_such_adapters_module")


def _traceback_of(source: str, filename: str) -> str:
    with open(filename, "w") as f:
        f.write(source)  # so that the traceback shows the line
    try:
        exec(compile(source, filename, "exec"), {"torch": torch})
    except BaseException:  # noqa: BLE001
        return traceback.format_exc()
    raise AssertionError("did not raise")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_only_call_names_the_call_and_the_fix(tmp_path):
    """A CUDA-only call in the target's code is diagnosed with its location and the two ways out."""
    f = str(tmp_path / "my_ddp.py")
    text = _traceback_of("x = 1\ntorch.cuda.synchronize()\n", f)
    assert cuda_only_call(text) == (
        "your code calls a CUDA-only API (torch.cuda.synchronize at my_ddp.py:2); on "
        "CPU pass --stub-cuda-timing or run with --backend nccl"
    )
    text = _traceback_of("with torch.cuda.nvtx.range('x'):\n    pass\n", f)
    assert "torch.cuda.nvtx.range at my_ddp.py:1" in cuda_only_call(text)
    assert "--stub-cuda-timing" in cuda_only_call(
        _traceback_of("torch.cuda.Event(enable_timing=True)\n", f)
    )
    assert "--stub-cuda-timing" not in cuda_only_call(_traceback_of("torch.zeros(1).cuda()\n", f))
    assert cuda_only_call(_traceback_of("raise RuntimeError('unrelated')\n", f)) is None
    # Called through an alias, the call is named from torch's frames.
    text = _traceback_of("sync = torch.cuda.synchronize\nsync()\n", f)
    assert "(torch.cuda.synchronize at my_ddp.py:2)" in cuda_only_call(text)


def test_stubbed_cuda_timing_restores_torch():
    """The stub is in place only within its block."""
    before = [getattr(__import__(m, fromlist=["x"]), a) for m, a, _ in STUBBED]
    with stubbed_cuda_timing():
        torch.cuda.synchronize()
        assert torch.cuda.Event(enable_timing=True).elapsed_time(None) == 0.0
    assert [getattr(__import__(m, fromlist=["x"]), a) for m, a, _ in STUBBED] == before
