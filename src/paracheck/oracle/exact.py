"""The float64 oracle of a case that computes below float64, with a bound derived for it: the
exact gradient of a step at the parameters the target started it from, and how far any correct
computation in the case's precision can be from it (``exact_gradients``).

Note [A bound against the float64 gradient]
    The matched-precision oracle (``paracheck.oracle.train``) applies the case's casts where the
    ranks apply them and is compared tightly; it answers "does the target compute what this
    program computes". This module answers the other question, "how far from the exact gradient
    may a correct design in this precision be", without running the program in that precision:
    it runs the model's forward and backward once in float64 (the values ``v``) and, beside every
    value, a bound ``e`` on |computed - v| elementwise (a running error analysis in the manner of
    Higham, Accuracy and Stability of Numerical Algorithms, 2002, sections 3.1-3.5), from the
    case's parameters and data, the dtype each operation stores its result in, and how many terms
    each sum has. No measured constant enters. For each operation, with u_d the unit roundoff of
    dtype d, eta_d the largest error of a rounding below its smallest normal number (a flush to
    zero: the smallest normal; float16, whose conversions keep subnormals: half their spacing), gamma_k(u) = k u / (1 - k u), and a pre-rounding value within ``pre`` of
    v:

    * storing in dtype d (every operation's result, and a cast to a narrower dtype):
      e = pre + u_d (|v| + pre) + eta_d;
    * a linear layer z = x W^T + b in compute dtype c (operands rounded to c: the parameters'
      rounding is known exactly, ``|W_c - W|``), k = in_features products summed with the bias
      in any order at the accumulation unit roundoff u_a (float32's for bfloat16 and float16 on
      the CPU, whose products of two such values are exact in float32; on a GPU c's own, which
      may reduce in c (``allow_bf16_reduced_precision_reduction``), and TensorFloat-32's for
      float32, which may multiply in it (``allow_tf32``)):
      pre = (|x| + e_x) e_W^T + e_x |W|^T + e_b + gamma_{k+2}(u_a) ((|x| + e_x)(|W| + e_W)^T +
      |b| + e_b); its backward likewise: the input gradient sums out_features terms, the weight
      gradient and the bias gradient sum the batch;
    * an elementwise function of k arithmetic operations in dtype d: each may round to d (torch
      computes some in float32 and rounds once, some in d op by op; the bound holds for both), so
      its error is gamma_k(u_d) times the magnitude of its terms, not of its result: for tanh's
      backward g (1 - y^2), the terms are |g| and |g| y^2, and a saturated unit (y near 1)
      keeps an error of u_d |g| however small the result;
    * tanh itself: |tanh(z + d) - tanh(z)| <= |d| sech^2(max(|z| - |d|, 0)), then an error of at
      most 8 float32 units (4 ulps; C libraries, SLEEF and CUDA are within 2) before the store;
      relu is exact, but its mask is undecided where |z| <= e_z, where the gradient may be
      g or 0;
    * the MSE loss's gradient 2 (o - y) s / N (s the loss scale) in the target's dtype: 4
      operations;
    * the gradients of one parameter's uses summed (a tied weight) in the coarser of the compute
      and the parameter dtype, the micro-steps accumulated in ``.grad``, the ranks' sum divided
      by W (n = W * backwards terms, each path at most 2n + 2 roundings, any order: Note [Step 0:
      a derived bound] in ``paracheck.oracle.tolerance``), the scale divided out (a power of
      two), and a global clip (the norm within gamma_{N+4} of the computed gradients' and the
      difference of the gradients, the coefficient a decreasing function of it).

    Every bound also covers the float64 evaluation of ``v`` (u_64 at every operation), and the
    comparison allows the bound times 1 + 1e-9 (its own float64 evaluation). What it assumes of
    the target: the program is the case's (the harness's forward, loss and backward, the case's
    casts), every operation rounds each result at most once per arithmetic operation, and sums
    are accumulated at the accumulation unit roundoff above or finer. What it does not cover: the LM
    workload (attention, softmax, embeddings: not derived here; such cases are not judged),
    gradients held from an earlier step (a parameter outside the optimizer's groups; not judged
    at that step), and a training loop's own loss (the ``loop`` kind is not judged).

    Note [Overflow is not judged]
    An element whose magnitude, with its error, may pass the largest finite value of the dtype
    it is stored in (float16's 65504: a loss scale of 2**40) may be infinite, and everything
    computed from it infinite or nan: its bound, and the bound of every element computed from
    it, is infinite or nan, and such elements are not judged (a GradScaler skips the step where
    it sees one; a parameter outside the optimizer's groups keeps its overflowed gradient).

    The bound is far looser than the matched oracle's comparison (measured: a correct target's
    gradients reach a few percent of it); it is the referee of the matched oracle, not a
    substitute: a matched oracle that cast in the wrong place would put the targets' gradients
    outside it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from paracheck.cases import (
    AUTOCAST_DTYPES,
    BACKOFF,
    Case,
    batch_for,
    build_case_model,
    micro_batches,
    params_in_groups,
)
from paracheck.oracle.tolerance import UNIT_ROUNDOFF, gamma
from paracheck.workloads.mlp import MLP, _Float32Linear

__all__ = ["ExactStep", "exact_gradients", "judged_here"]

_F64 = torch.float64
_U = {getattr(torch, name): u for name, u in UNIT_ROUNDOFF.items()}
_ETA = {  # the largest error of a rounding below the smallest normal number
    torch.float64: 2.0**-1022,  # a flush to zero
    torch.float32: 2.0**-126,
    torch.bfloat16: 2.0**-126,
    # Half the subnormal spacing: conversions to float16 (from float32, on the CPU and on GPUs)
    # keep subnormals; the smallest normal, 2**-14, would swamp unscaled float16 gradients.
    torch.float16: 2.0**-25,
}
_MAX = {d: torch.finfo(d).max for d in _U}
_HALF = (torch.bfloat16, torch.float16)
_U64 = _U[torch.float64]
TANH_UNITS = 8  # float32 units of roundoff a tanh implementation may be off by


@dataclass(eq=False)
class _B:
    """A bounded tensor: the float64 value ``v``, a bound ``e`` on |computed - v| elementwise, the
    dtype the computed tensor has, and whether a gradient flows to it."""

    v: torch.Tensor
    e: torch.Tensor
    dtype: torch.dtype
    requires: bool = False


def _store(v: torch.Tensor, pre: torch.Tensor, dtype: torch.dtype) -> _B:
    """A result within ``pre`` of ``v`` before it is stored in ``dtype``; an element that may
    overflow (|v| + pre above the dtype's largest finite value) is unbounded from here on
    (Note [Overflow is not judged])."""
    e = pre + _U[dtype] * (v.abs() + pre) + _ETA[dtype] + 2 * _U64 * v.abs()
    e = torch.where(v.abs() + pre > _MAX[dtype], torch.full_like(e, float("inf")), e)
    return _B(v, e, dtype)


def _holds(wide: torch.dtype, narrow: torch.dtype) -> bool:
    """Whether every value of ``narrow`` is a value of ``wide`` (float16 and bfloat16 hold each
    other's neither)."""
    return wide == narrow or wide in (torch.float32, torch.float64) and _U[wide] <= _U[narrow]


def _cast(x: _B, dtype: torch.dtype) -> _B:
    """``x.to(dtype)``: exact where ``dtype`` holds every value of ``x.dtype``."""
    if _holds(dtype, x.dtype):
        return _B(x.v, x.e, dtype, x.requires)
    out = _store(x.v, x.e, dtype)
    out.requires = x.requires
    return out


def _exact(t: torch.Tensor) -> _B:
    return _B(t.detach().to(_F64), torch.zeros(t.shape, dtype=_F64), t.dtype)


class _Program:
    """The forward of one micro-batch, bounded, with a tape for its backward."""

    def __init__(self, params: list[torch.Tensor], dtypes: list[torch.dtype], acc_of):
        self.params = params  # exact values (float64), by parameter index
        self.dtypes = dtypes
        self.acc_of = acc_of  # compute dtype -> the unit roundoff its sums accumulate at
        self.params_require = [False] * len(params)  # set by the model's frozen parameters
        self.tape: list = []  # (output, inputs, backward: output gradient -> input gradients)
        self.uses: dict[int, list[_B]] = {}  # parameter index -> gradient contributions

    def _record(self, out: _B, inputs: list[_B], backward) -> _B:
        out.requires = any(x.requires for x in inputs)
        if out.requires:
            self.tape.append((out, inputs, backward))
        return out

    def _operand(self, i: int, compute: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Parameter ``i`` as a linear's operand in ``compute``: its value and the exact
        |rounded - value|."""
        v = self.params[i]
        if _holds(compute, self.dtypes[i]):
            return v, torch.zeros_like(v)
        return v, (v.to(compute).to(_F64) - v).abs()

    # -- forward ops -----------------------------------------------------------------------
    def cast(self, x: _B, dtype: torch.dtype) -> _B:
        out = _cast(x, dtype)
        return self._record(out, [x], lambda g: [_cast(g, x.dtype)])

    def linear(self, x: _B, w: int, b: int | None, compute: torch.dtype) -> _B:
        xin = _cast(x, compute)
        W, eW = self._operand(w, compute)
        acc = self.acc_of(compute)
        k = W.shape[1]
        xa = xin.v.abs() + xin.e
        Wa = W.abs() + eW
        v = xin.v @ W.T
        err = xa @ eW.T + xin.e @ W.abs().T
        mag = xa @ Wa.T
        if b is not None:
            B, eB = self._operand(b, compute)
            v = v + B
            err = err + eB
            mag = mag + B.abs() + eB
        u = gamma(k + 2, acc) + gamma(k + 2, _U64)
        out = _store(v, err + u * mag, compute)

        def backward(g: _B):
            g = _cast(g, compute)
            ga = g.v.abs() + g.e
            n_out, batch = W.shape[0], g.v.shape[0]
            if b is not None and self.params_require[b]:
                ub = gamma(batch + 1, acc) + gamma(batch + 1, _U64)
                self._use(b, _store(g.v.sum(0), g.e.sum(0) + ub * ga.sum(0), compute))
            if self.params_require[w]:
                uw = gamma(batch + 2, acc) + gamma(batch + 2, _U64)
                gw_err = g.e.T @ xa + g.v.abs().T @ xin.e
                self._use(w, _store(g.v.T @ xin.v, gw_err + uw * (ga.T @ xa), compute))
            if not x.requires:
                return [None]
            ux = gamma(n_out + 2, acc) + gamma(n_out + 2, _U64)
            gx_err = g.e @ Wa + g.v.abs() @ eW
            gx = _store(g.v @ W, gx_err + ux * (ga @ Wa), compute)
            return [_cast(gx, x.dtype)]

        out.requires = (
            x.requires or self.params_require[w] or (b is not None and self.params_require[b])
        )
        if out.requires:
            self.tape.append((out, [x], backward))
        return out

    def tanh(self, x: _B) -> _B:
        d = x.dtype
        v = torch.tanh(x.v)
        near = (x.v.abs() - x.e).clamp_min(0.0)
        moved = x.e * (1.0 / torch.cosh(near)) ** 2
        top = (v.abs() + moved).clamp_max(1.0)
        out = _store(v, moved + (TANH_UNITS * _U[torch.float32] + _U[d]) * top, d)
        out.e = out.e + TANH_UNITS * _U64 * v.abs()  # the float64 tanh's own error

        def backward(g: _B):
            g = _cast(g, d)
            a, ea = out.v.abs(), out.e
            ya = (a + ea).clamp_max(1.0)
            sq = ea * (2 * a + ea)  # >= |y_computed^2 - y^2|
            deriv = 1 - out.v**2
            ga = g.v.abs() + g.e
            pre = g.e * (deriv + sq).clamp_max(1.0) + g.v.abs() * sq
            pre = pre + (gamma(3, _U[d]) + gamma(3, _U64)) * ga * (1 + ya**2)
            return [_store(g.v * deriv, pre, d)]

        return self._record(out, [x], backward)

    def relu(self, x: _B) -> _B:
        out = _B(torch.relu(x.v), x.e.clone(), x.dtype)
        undecided = x.v.abs() <= x.e

        def backward(g: _B):
            g = _cast(g, x.dtype)
            on = (x.v > 0).to(_F64)
            e = torch.where(undecided, g.v.abs() + g.e, g.e * on)
            return [_B(g.v * on, e, x.dtype)]

        return self._record(out, [x], backward)

    def add(self, a: _B, b: _B) -> _B:
        d = torch.promote_types(a.dtype, b.dtype)
        v = a.v + b.v
        u = _U[torch.float32 if d in _HALF else d] + _U64
        out = _store(v, a.e + b.e + u * (a.v.abs() + b.v.abs() + a.e + b.e), d)
        return self._record(out, [a, b], lambda g: [_cast(g, a.dtype), _cast(g, b.dtype)])

    def scale_by(self, x: _B, c: torch.Tensor) -> _B:
        """``x * c`` for a buffer ``c`` (exact, no gradient), in the promoted dtype."""
        d = torch.promote_types(x.dtype, c.dtype)
        cv = c.detach().to(_F64)
        v = x.v * cv
        out = _store(v, x.e * cv.abs() + _U64 * v.abs(), d)

        def backward(g: _B):
            g = _cast(g, d)
            gv = g.v * cv
            pre = g.e * cv.abs() + (_U[d] + _U64) * (g.v.abs() + g.e) * cv.abs()
            return [_cast(_store(gv, pre, d), x.dtype)]

        return self._record(out, [x], backward)

    def _use(self, i: int, g: _B) -> None:
        self.uses.setdefault(i, []).append(g)

    # -- backward --------------------------------------------------------------------------
    def backward(self, out: _B, grad: _B) -> dict[int, _B]:
        """Run the tape backward from ``out``'s gradient ``grad``; the bounded gradient of every
        parameter it reaches, in the parameter's dtype (its uses summed)."""
        pending: dict[int, list[_B]] = {id(out): [grad]}
        for node, inputs, fn in reversed(self.tape):
            parts = pending.pop(id(node), None)
            if not parts:
                continue
            g = parts[0] if len(parts) == 1 else _sum_uses(parts, node.dtype)
            for x, gx in zip(inputs, fn(g)):
                if gx is not None and x.requires:
                    pending.setdefault(id(x), []).append(gx)
        return {i: _sum_uses(parts, self.dtypes[i]) for i, parts in self.uses.items()}


def _sum_uses(parts: list[_B], dtype: torch.dtype) -> _B:
    """A parameter's gradient: its uses' contributions summed (in the coarser of their dtype and
    the parameter's: autocast's cached cast sums them before the cast back) and stored in the
    parameter's dtype."""
    if len(parts) == 1:
        return _cast(parts[0], dtype)
    d = max([dtype, *(p.dtype for p in parts)], key=lambda t: _U[t])
    v = torch.stack([p.v for p in parts]).sum(0)
    e = torch.stack([p.e for p in parts]).sum(0)
    mag = torch.stack([p.v.abs() + p.e for p in parts]).sum(0)
    n = len(parts)
    out = _store(v, e + (gamma(n, _U[d]) + gamma(n, _U64)) * mag, d)
    return _cast(out, dtype)


# -- the models' programs ---------------------------------------------------------------------


def judged_here(case: Case) -> str | None:
    """Why ``case`` is not judged against the float64 gradient (Note [A bound against the float64
    gradient]), or None where it is; a target whose kind derives no bound (``Kind.derived_bound``)
    is not judged either (``paracheck.check.properties.float64_bound``)."""
    if case.autocast is None and case.dtype == "float64":
        return "the case computes in float64: the oracle is the float64 oracle"
    if case.user_model is not None:  # its forward is the user's: no program of it is known here
        return "no bound is derived for a user's model"
    workload = getattr(case.model, "kind", None)
    if workload not in ("mlp", "toy"):
        return f"no bound is derived for the {workload} workload"
    if case.loss != "rank-mean":
        return f"no bound is derived for the {case.loss} loss"
    return None


def _compute_dtype(case: Case, weight: torch.dtype) -> torch.dtype:
    """The dtype a linear with weights of ``weight`` computes in: autocast's where it casts them
    (it leaves float64 alone), else the weights' own."""
    if case.autocast is not None and weight != torch.float64:
        return AUTOCAST_DTYPES[case.autocast]
    return weight


def _forward(prog: _Program, model, index: dict[int, int], case: Case, x: torch.Tensor) -> _B:
    """The bounded forward of ``model`` (an MLP or a CS336 toy model) on the inputs ``x``, the
    operations of its ``forward`` one by one."""

    def linear(layer, h: _B) -> _B:
        w = index[id(layer.weight)]
        b = index[id(layer.bias)] if layer.bias is not None else None
        own = layer.weight.dtype
        if isinstance(layer, _Float32Linear):
            out = prog.linear(prog.cast(h, own), w, b, _compute_dtype(case, own))
            return prog.cast(out, h.dtype)
        return prog.linear(h, w, b, _compute_dtype(case, own))

    h = _exact(x)
    if isinstance(model, MLP):
        spec = model.spec
        real = x
        if spec.buffer:
            h = prog.scale_by(h, model.scale)
            real = x * model.scale
        inp = h
        last = len(model.layers) - 1
        for i, layer in enumerate(model.layers):
            h = linear(layer, h)
            if i == 0 and spec.tied:
                h = prog.tanh(h)
                h = linear(model.tied_again, prog.tanh(linear(model.tied, h)))
            if i < last:
                h = prog.tanh(h)
        if spec.unused == "data" and bool(real[0, 0] > 0):
            h = prog.add(h, linear(model.branch, inp))
        return h
    h = prog.relu(linear(model.fc1, h))
    h = prog.relu(linear(model.fc2.fc, h))
    if hasattr(model, "fc5"):
        h = prog.relu(linear(model.fc3, h))
        h = prog.relu(linear(model.fc4, h))
        return linear(model.fc5, h)
    return linear(model.fc3, h)


def _mse_gradient(out: _B, y: torch.Tensor, scale: float) -> _B:
    """The gradient of ``scale * mse_loss(out, y)`` with respect to ``out`` (already in ``y``'s
    dtype): 2 (o - y) scale / N in that dtype, four operations."""
    d = y.dtype
    yv = y.to(_F64)
    alpha = 2.0 * scale / out.v.numel()
    v = alpha * (out.v - yv)
    u = gamma(4, _U[d]) + gamma(4, _U64)
    pre = alpha * out.e + u * alpha * ((out.v - yv).abs() + out.e) + 4 * _ETA[d]
    return _store(v, pre, d)


@dataclass
class ExactStep:
    """Per parameter, the float64 synchronised gradient of a step (``grads``) and the bound on any
    correct computation of it in the case's precision (``bounds``); None where the parameter is
    not judged at that step (no rank used it, it is frozen, or it holds an earlier step's
    gradient)."""

    grads: list[torch.Tensor | None]
    bounds: list[torch.Tensor | None]


TF32_UNIT_ROUNDOFF = 2.0**-11  # TensorFloat-32 keeps 10 bits of a float32's 23


def _accumulation(device_type: str):
    """The unit roundoff each compute dtype's sums (and products) round at (Note [A bound against
    the float64 gradient]): float32 for bfloat16 and float16 on the CPU; off it the compute dtype's
    own (a GPU may reduce in it), and TensorFloat-32's for float32 (a GPU may multiply float32
    matrices in it where the program allows: ``torch.backends.cuda.matmul.allow_tf32``)."""

    def acc(compute: torch.dtype) -> float:
        if device_type == "cpu":
            return _U[torch.float32] if compute in _HALF else _U[compute]
        if compute == torch.float32:
            return TF32_UNIT_ROUNDOFF
        return _U[compute]

    return acc


def exact_gradients(
    case: Case,
    starts: list[list[torch.Tensor]],
    skipped: list[bool],
    device_type: str = "cpu",
) -> list[ExactStep]:
    """Per step k of ``case``, the float64 gradient at the parameters ``starts[k]`` (the target's
    after step k-1, the initial ones for k = 0) and its bound (Note [A bound against the float64
    gradient]). ``skipped``: the steps a GradScaler skipped (the scale halves after each, by
    ``BACKOFF``; a skipped step itself is returned empty). ``device_type``: where the ranks
    computed."""
    model = build_case_model(case, rank=0)
    params = list(model.parameters())
    index = {id(p): i for i, p in enumerate(params)}
    dtypes = [p.dtype for p in params]
    W = case.world_size
    backwards = 2 if case.double_backward else 1
    acc = _accumulation(device_type)
    out: list[ExactStep] = []
    scale = float(case.loss_scale) if case.loss_scale is not None else 1.0
    for k, start in enumerate(starts):
        if k < len(skipped) and skipped[k]:
            out.append(ExactStep([None] * len(params), [None] * len(params)))
            scale *= BACKOFF
            continue
        values = [s.detach().to(_F64) for s in start]
        terms: list[list[_B]] = [[] for _ in params]
        for rank in range(W):
            for micro in range(micro_batches(case, k)):
                x, y = batch_for(case, k, micro, rank)
                prog = _Program(values, dtypes, acc)
                prog.params_require = [p.requires_grad for p in params]
                h = _forward(prog, model, index, case, x)
                o = prog.cast(h, y.dtype)
                for i, g in prog.backward(o, _mse_gradient(o, y, scale)).items():
                    terms[i].extend([g] * backwards)
        inside = {index[id(p)] for p in params_in_groups(case, params, k)}
        grads: list[torch.Tensor | None] = []
        bounds: list[torch.Tensor | None] = []
        for i, ts in enumerate(terms):
            held = k > 0 and i not in inside and not case.zero_grad_module
            if not ts or held:
                grads.append(None)
                bounds.append(None)
                continue
            n = W * backwards * micro_batches(case, k)
            v = torch.stack([t.v for t in ts]).sum(0) / W
            mag = torch.stack([t.v.abs() + t.e for t in ts]).sum(0) / W
            u = gamma(2 * n + 2, _U[dtypes[i]]) + gamma(2 * n + 2, _U64)
            e = torch.stack([t.e for t in ts]).sum(0) / W + u * mag + _ETA[dtypes[i]]
            if case.loss_scale is not None and i in inside:
                v, e = v / scale, e / scale
            grads.append(v)
            bounds.append(e)
        if case.clip_norm is not None:
            _clip(grads, bounds, [i in inside for i in range(len(params))], dtypes, case.clip_norm)
        out.append(ExactStep(grads, bounds))
    return out


def _clip(grads, bounds, inside, dtypes, max_norm: float) -> None:
    """Apply ``clip_grad_norm_(max_norm)`` to the judged gradients inside the optimizer's groups,
    in place, and widen their bounds by what the coefficient's error adds (Note [A bound against
    the float64 gradient])."""
    held = [i for i, g in enumerate(grads) if g is not None and inside[i]]
    if not held:
        return
    n_elements = sum(grads[i].numel() for i in held)
    u = max(_U[dtypes[i]] for i in held)
    norm = torch.linalg.vector_norm(torch.cat([grads[i].flatten() for i in held])).item()
    enorm = torch.linalg.vector_norm(torch.cat([bounds[i].flatten() for i in held])).item()
    g = gamma(n_elements + 4, u) + gamma(n_elements + 4, _U64)
    dn = enorm + g * (norm + enorm)

    def f(x: float) -> float:
        return min(1.0, max_norm / (x + 1e-6))

    c = f(norm)
    low = f(max(norm - dn, 0.0))
    dc = max(low - c, c - f(norm + dn)) + (gamma(3, u) + gamma(3, _U64)) * low
    for i in held:
        a = grads[i].abs() + bounds[i]
        bounds[i] = dc * a + c * bounds[i] + (_U[dtypes[i]] + _U64) * (c + dc) * a + _ETA[dtypes[i]]
        grads[i] = grads[i] * c
