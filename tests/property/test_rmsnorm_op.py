"""The Triton RMSNorm as ``torch.library`` custom ops (Note [compiled callers]): registered, with
fake implementations and autograd that ``torch.library.opcheck`` accepts, and taken by
``torch.compile`` as one op per norm, with no graph break, giving the eager values and gradients.

On a machine without CUDA the kernels run in the Triton interpreter (``TRITON_INTERPRET`` set
before any kernel is decorated, as in ``test_rmsnorm.py``) and compile with ``aot_eager``; on a
GPU Inductor compiles them too.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

pytest.importorskip("triton", reason="the RMSNorm kernels need triton (pip install triton)")

from paracheck.kernels import rmsnorm as K  # noqa: E402
from paracheck.oracle.rmsnorm import rms_norm_reference  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BACKENDS = ["aot_eager"] + (["inductor"] if DEVICE == "cuda" else [])
HAS_TRITON_OP = hasattr(torch.library, "triton_op") and hasattr(torch.library, "wrap_triton")
OPS = ("rms_norm_forward", "rms_norm_backward", "rms_norm_forward_opaque",
       "rms_norm_backward_opaque")  # fmt: skip


def test_ops_are_registered_and_compiled_callers_use_the_triton_op():
    for name in OPS:
        assert hasattr(torch.ops.paracheck, name), name
    want = "rms_norm_forward" if HAS_TRITON_OP else "rms_norm_forward_opaque"
    assert K._FORWARD_OP is getattr(torch.ops.paracheck, want)


def _inputs(shape=(3, 5, 48), dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g).to(DEVICE, dtype).requires_grad_()
    w = (1 + 0.1 * torch.randn(shape[-1], generator=g)).to(DEVICE, dtype).requires_grad_()
    dy = torch.randn(shape, generator=g).to(DEVICE, dtype)
    return x, w, dy


@pytest.mark.parametrize("name", ["rms_norm_forward", "rms_norm_forward_opaque"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_opcheck_passes_on_the_forward_ops(name, dtype):
    """Schema, autograd registration, fake implementation against the real one, and AOT
    dispatch with static and dynamic shapes."""
    x, w, _ = _inputs(dtype=dtype)
    torch.library.opcheck(getattr(torch.ops.paracheck, name).default, (x, w, 1e-5))
    # A transposed (non-contiguous) x: the outputs are contiguous whatever x's strides.
    xt = x.detach().transpose(0, 1).requires_grad_()
    torch.library.opcheck(getattr(torch.ops.paracheck, name).default, (xt, w, 1e-5))


@pytest.mark.parametrize("name", ["rms_norm_backward", "rms_norm_backward_opaque"])
def test_opcheck_passes_on_the_backward_ops(name):
    x, w, dy = _inputs()
    _, rstd = torch.ops.paracheck.rms_norm_forward_opaque(x.detach(), w.detach(), 1e-5)
    torch.library.opcheck(
        getattr(torch.ops.paracheck, name).default, (dy, x.detach(), w.detach(), rstd)
    )


@pytest.mark.parametrize("name", ["rms_norm_forward", "rms_norm_forward_opaque"])
def test_ops_equal_the_eager_function_bitwise(name):
    """Same kernels, same plan: the ops' outputs and gradients are the eager path's bits."""
    x, w, dy = _inputs()
    y = getattr(torch.ops.paracheck, name)(x, w, 1e-5)[0]
    y.backward(dy)
    got = (y.detach(), x.grad, w.grad)
    x.grad = w.grad = None
    y = K.RMSNormFunction.apply(x, w, 1e-5)
    y.backward(dy)
    for a, b in zip(got, (y.detach(), x.grad, w.grad)):
        assert torch.equal(a, b)


def _block(dtype):
    from paracheck.workloads.lm import Block, LMSpec

    spec = LMSpec(vocab_size=64, context_length=16, d_model=64, d_ff=128, num_layers=1,
                  num_heads=4, norm="triton")  # fmt: skip
    torch.manual_seed(0)
    return Block(spec).to(DEVICE, dtype)


class _Recorder:
    """A backend that records each Dynamo graph, then compiles it with ``backend``."""

    def __init__(self, backend):
        self.backend = backend
        self.graphs = []

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        return torch._dynamo.lookup_backend(self.backend)(gm, example_inputs)

    def norm_calls(self) -> list[str]:
        return [
            str(n.target)
            for gm in self.graphs
            for n in gm.graph.nodes
            if n.op == "call_function" and "paracheck" in str(n.target)
        ]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_block_has_one_graph_with_the_op_and_equals_eager(backend, dtype):
    """``fullgraph=True`` raises at a graph break; the one graph calls the forward op once per
    norm (two), and the compiled block's output and gradients equal the eager block's (the
    same kernels for the norm; for the rest, aot_eager runs the same aten ops, Inductor its own
    kernels: within the dtype's rounding of the block)."""
    block = _block(dtype)
    x, _, _ = _inputs((2, 16, 64), dtype=dtype, seed=1)
    dy = torch.randn(x.shape, generator=torch.Generator().manual_seed(2)).to(DEVICE, dtype)
    torch._dynamo.reset()
    recorder = _Recorder(backend)
    compiled = torch.compile(block, backend=recorder, fullgraph=True)

    def run(f):
        x.grad = None
        block.zero_grad(set_to_none=True)
        f(x).backward(dy)
        return [x.grad] + [p.grad for p in block.parameters()]

    want = run(block)
    y_want = block(x).detach()
    got = run(compiled)
    y_got = compiled(x).detach()
    assert len(recorder.graphs) == 1
    assert recorder.norm_calls() == [str(K._FORWARD_OP)] * 2
    exact = backend == "aot_eager" and dtype == torch.float32
    tol = 0.0 if exact else (1e-4 if dtype == torch.float32 else 3e-2)
    for a, b in zip([y_want] + want, [y_got] + got):
        err = ((a.double() - b.double()).norm() / a.double().norm().clamp_min(1e-30)).item()
        assert err <= tol


def test_compiled_norm_equals_the_oracle():
    """The compiled module alone, against the float64 oracle within float32 rounding."""
    norm = K.TritonRMSNorm(48).to(DEVICE)
    x, _, _ = _inputs()
    torch._dynamo.reset()
    y = torch.compile(norm, backend="aot_eager", fullgraph=True)(x)
    want = rms_norm_reference(x.detach().double(), norm.weight.detach().double(), norm.eps)
    torch.testing.assert_close(y.detach().double(), want, rtol=1e-5, atol=1e-5)


def test_compiled_caller_is_refused_what_eager_refuses():
    """An unsupported dtype is refused while Dynamo traces, with the eager message."""
    x = torch.randn(4, 8, dtype=torch.float64, device=DEVICE)
    w = torch.ones(8, dtype=torch.float64, device=DEVICE)
    with pytest.raises(ValueError, match=r"x\.dtype=torch\.float64 is not supported"):
        K.rms_norm(x, w)
    torch._dynamo.reset()
    with pytest.raises(Exception, match=r"x\.dtype=torch\.float64 is not supported"):
        torch.compile(K.rms_norm, backend="aot_eager", fullgraph=True)(x, w)
