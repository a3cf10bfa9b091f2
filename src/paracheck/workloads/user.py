"""A user's own model (``--model``, ``--batch``, ``--loss-fn``): named by import path, checked
once in the driver before any rank starts, then built in every rank and in the oracle alike.

Note [A user's model]
    Three functions, each named ``package.module:name`` or ``path/to/file.py:name`` (imported as
    a target is: ``paracheck.check.loading``):

    * ``build(seed, dtype) -> torch.nn.Module``: the same seed gives bitwise the same parameters
      and buffers; the parameters' names and shapes do not depend on the seed;
    * ``batch(seed, n, dtype) -> (inputs, targets)``: two tensors of ``n`` rows each, floating
      ones in ``dtype`` (integer ones, token ids, as they are); a case splits its global batch by
      rows over ranks and micro-batches;
    * ``loss(output, targets) -> scalar tensor`` (optional): default the mean squared error over
      the rows it is given. With a loss, the forward may return any structure of tensors (a
      tuple, a dict, Hugging Face's ``ModelOutput``), which only the loss reads; without one, a
      tensor. Every case's loss is a rank's mean over its own rows, averaged over
      ranks (Note [Loss semantics], rank-mean): with equal local batches, the mean over the global
      batch.

    Each call runs under a forked RNG seeded with its ``seed``: a builder that draws from torch's
    global generator (``nn.Linear``'s own initialisation) is deterministic, and the global RNG is
    left as it was (Note [Determinism]). The seed a rank's model is built from is the case's
    ``init_seed``, drawn with the case's seed: Hypothesis draws and shrinks the model's seed as
    any other field.

    What ``check_user_model`` refuses (a ``UsageError`` naming the option, its value and the rule,
    exit 2): a builder that raises, returns something that is not a module, has no trainable
    parameter, or gives different weights for the same seed; a model whose two forwards of one
    batch differ (dropout or another random op in training mode); a batch of the wrong row count,
    dtype or shape; a loss that is not a scalar; a forward that couples the rows of a batch
    (``BatchNorm`` in training mode, named with its module; or any other forward whose row i
    differs from the forward of row i alone). Such a model is not data-parallel-equivalent by
    construction: each rank normalises with its own rows, and no wrapper can equal one process
    on the global batch; a wrapper is never blamed for it. BatchNorm in eval mode (frozen
    statistics, as when fine-tuning a pretrained network) is row-independent and checked: its
    running statistics are buffers, which a wrapper must broadcast like the parameters.

Note [A float32 oracle for a user's model]
    The oracle trains the same model in the case's dtype, float64 by default. A model that cannot
    be built or run in float64 (an op without a float64 kernel, a dtype hard-coded in its
    forward) is checked in float32 instead (``UserModelInfo.float64`` False: the check's
    precision becomes fp32), where every tolerance is the one a float32 case derives today; the
    float64-bound property is not judged on a user's model (``paracheck.oracle.exact``: no bound
    is derived for it). Never a false failure: a tighter float64 comparison of a float32 model
    is never attempted.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn

from paracheck.check.loading import load_object
from paracheck.errors import ParacheckError, TargetError, UsageError

__all__ = [
    "MODEL_OPTIONS",
    "UserModel",
    "UserModelInfo",
    "build_user_model",
    "check_user_model",
    "invalid",
    "user_batch",
    "user_loss",
]

# The option that names each function: a field of ``CheckSettings`` (``--model`` on the command
# line, ``--paracheck-model`` in pytest, ``model=`` as a keyword).
MODEL_OPTIONS = {"build": "model", "batch": "batch", "loss": "loss_fn"}

# The row counts a batch is tried at: one (the smallest local batch a case draws) and several.
_ROWS = (1, 3)
# How far a row's output may move between the forward of the whole batch and its forward alone,
# in units of the dtype's epsilon times the output's magnitude: matrix products of another row
# count may sum in another order (a few epsilons); a coupled row moves by O(1).
_ROW_EPSILONS = 1e4


@dataclass(frozen=True)
class UserModel:
    """A user's model, by import path: ``build`` (``--model``), ``batch`` (``--batch``) and
    ``loss`` (``--loss-fn``, None: the mean squared error). Note [A user's model]."""

    build: str
    batch: str
    loss: str | None = None

    def to_dict(self) -> dict:
        return {"build": self.build, "batch": self.batch, "loss": self.loss}

    @classmethod
    def from_dict(cls, d: dict) -> UserModel:
        return cls(build=d["build"], batch=d["batch"], loss=d.get("loss"))

    def describe(self) -> str:
        loss = f", loss {self.loss}" if self.loss else ""
        return f"model {self.build}, batch {self.batch}{loss}"


@dataclass(frozen=True)
class UserModelInfo:
    """What ``check_user_model`` found: the number of parameters (``model.parameters()``), and
    whether the model runs in float64 (Note [A float32 oracle for a user's model]; ``why_not``
    says what failed in float64)."""

    parameters: int
    float64: bool = True
    why_not: str | None = None


def invalid(option: str, value, rule: str) -> ParacheckError:
    """The usage error of ``option=value`` breaking ``rule`` (``paracheck.errors``'
    ``InvalidArgument`` where it exists, else a ``UsageError`` in the command line's words).
    Another option named in ``rule`` is written ``{option:name}``."""
    import paracheck.errors as errors

    cls = getattr(errors, "InvalidArgument", None)
    if cls is not None:
        return cls(option, value, rule)
    rule = re.sub(r"\{option:(\w+)\}", lambda m: "--" + m[1].replace("_", "-"), rule)
    return UsageError(f"--{option.replace('_', '-')}={value!r}: {rule}")


_FUNCTIONS: dict[str, object] = {}


def _function(path: str, option: str):
    """The callable at ``path``, loaded once per process."""
    if path not in _FUNCTIONS:
        module, colon, name = path.rpartition(":")
        if not (colon and module and name):  # a function, never a built-in target's name
            raise invalid(option, path, "must be 'package.module:name' or 'path/to/file.py:name'")
        try:
            fn = load_object(path)
        except TargetError as exc:
            raise invalid(option, path, str(exc).replace(f"target={path!r}: ", "")) from None
        if not callable(fn):
            raise invalid(option, path, f"names a {type(fn).__name__}, not a function")
        _FUNCTIONS[path] = fn
    return _FUNCTIONS[path]


def build_user_model(user: UserModel, seed: int, dtype: torch.dtype, device="cpu") -> nn.Module:
    """``build(seed, dtype)`` on ``device``, under a forked RNG seeded with ``seed``."""
    build = _function(user.build, MODEL_OPTIONS["build"])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = build(seed, dtype)
    if not isinstance(model, nn.Module):
        raise invalid(
            MODEL_OPTIONS["build"],
            user.build,
            f"build(seed={seed}, dtype={dtype}) returned a {type(model).__name__}, not a "
            "torch.nn.Module",
        )
    return model.to(device)


def user_batch(user: UserModel, seed: int, n: int, dtype: torch.dtype, device="cpu"):
    """``batch(seed, n, dtype)`` on ``device``, under a forked RNG seeded with ``seed``."""
    x, y = _seeded_batch(user, seed, n, dtype)
    return x.to(device), y.to(device)


def _seeded_batch(user: UserModel, seed: int, n: int, dtype: torch.dtype):
    batch = _function(user.batch, MODEL_OPTIONS["batch"])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return batch(seed, n, dtype)


def user_loss(user: UserModel, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``loss(output, targets)``, or the mean squared error in the targets' dtype."""
    if user.loss is None:
        return torch.nn.functional.mse_loss(output.to(targets.dtype), targets)
    return _function(user.loss, MODEL_OPTIONS["loss"])(output, targets)


# -- checking a user's model once, in the driver -----------------------------------------------


class _Unrunnable(Exception):
    """The user's code raised (not a rule of Note [A user's model] broken): in float64, the
    check moves to float32 (Note [A float32 oracle for a user's model])."""

    def __init__(self, error: ParacheckError):
        super().__init__(str(error))
        self.error = error


def check_user_model(user: UserModel) -> UserModelInfo:
    """Check ``user`` against Note [A user's model], in float64, else in float32 (Note [A float32
    oracle for a user's model]); raise a ``UsageError`` naming the option, value and rule broken."""
    for key, option in MODEL_OPTIONS.items():
        path = getattr(user, key)
        if path is not None:
            _function(path, option)
    try:
        return UserModelInfo(_check_at(user, torch.float64))
    except _Unrunnable as exc:
        why = str(exc)
    try:
        return UserModelInfo(_check_at(user, torch.float32), float64=False, why_not=why)
    except _Unrunnable as exc:
        raise exc.error from None


def _call(option: str, value: str, what: str, fn):
    """``fn()``; what it raises becomes ``_Unrunnable`` naming ``option`` and the call."""
    try:
        return fn()
    except ParacheckError:
        raise
    except Exception as exc:  # noqa: BLE001 - the user's code: reported, never a traceback
        raise _Unrunnable(
            invalid(option, value, f"{what} raised {type(exc).__name__}: {exc}")
        ) from None


def _check_at(user: UserModel, dtype: torch.dtype) -> int:
    """Every rule of Note [A user's model] in ``dtype``; the number of parameters."""
    build_opt = MODEL_OPTIONS["build"]
    call = f"build(seed=0, dtype={dtype})"
    model = _call(build_opt, user.build, call, lambda: build_user_model(user, 0, dtype))
    _same_weights(user, model, dtype)
    params = list(model.parameters())
    if not any(p.requires_grad for p in params):
        raise invalid(build_opt, user.build, f"{call} has no parameter that requires a gradient")
    _no_batch_norm_training(user, model)
    x, y = None, None
    for n in _ROWS:
        x, y = _batch_checked(user, n, dtype)
    out = _forward(user, model, x, dtype)
    _loss_checked(user, model, x, y, out, dtype)
    _rows_independent(user, model, x, out, dtype)
    return len(params)


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {
        **{f"parameter {n}": p for n, p in model.named_parameters()},
        **{f"buffer {n}": b for n, b in model.named_buffers()},
    }


def _same_weights(user: UserModel, model: nn.Module, dtype: torch.dtype) -> None:
    """The same seed gives bitwise the same state; another seed the same names and shapes."""
    option = MODEL_OPTIONS["build"]
    again = _call(
        option, user.build, "build(seed=0) again", lambda: build_user_model(user, 0, dtype)
    )
    other = _call(option, user.build, "build(seed=1)", lambda: build_user_model(user, 1, dtype))
    first, second = _state(model), _state(again)
    if list(first) != list(second):
        raise invalid(option, user.build, "two calls with the same seed give different modules")
    for name, t in first.items():
        u = second[name]
        if t.shape != u.shape or t.dtype != u.dtype or not torch.equal(t, u):
            raise invalid(
                option,
                user.build,
                f"two calls with seed=0 give different weights ({name}): the same seed must "
                "give the same model (draw from the seed, or from torch's global generator, "
                "which paracheck seeds with it)",
            )
    shapes = [(n, t.shape) for n, t in first.items()]
    if shapes != [(n, t.shape) for n, t in _state(other).items()]:
        raise invalid(
            option, user.build, "seed=0 and seed=1 give parameters of other names or shapes"
        )


def _no_batch_norm_training(user: UserModel, model: nn.Module) -> None:
    """BatchNorm in training mode couples the rows of a batch (Note [A user's model])."""
    for name, module in model.named_modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm) and module.training:
            raise invalid(
                MODEL_OPTIONS["build"],
                user.build,
                f"module {name!r} ({type(module).__name__}) is in training mode: it normalises "
                "each batch by the statistics of its own rows, so each rank normalises with its "
                "own rows and no data-parallel wrapper can equal one process on the global batch "
                "(a property of the model, not of any wrapper); put it in eval mode (frozen "
                "statistics) or use a row-wise norm (LayerNorm, GroupNorm)",
            )


def _batch_checked(user: UserModel, n: int, dtype: torch.dtype):
    option, call = MODEL_OPTIONS["batch"], f"batch(seed=0, n={n}, dtype={dtype})"
    got = _call(option, user.batch, call, lambda: _seeded_batch(user, 0, n, dtype))
    if not (isinstance(got, (tuple, list)) and len(got) == 2):
        raise invalid(option, user.batch, f"{call} must return (inputs, targets)")
    for what, t in zip(("inputs", "targets"), got):
        if not isinstance(t, torch.Tensor):
            raise invalid(
                option, user.batch, f"{call}'s {what} is a {type(t).__name__}, not a tensor"
            )
        if t.dim() == 0 or t.shape[0] != n:
            raise invalid(
                option, user.batch, f"{call}'s {what} have shape {tuple(t.shape)}: {n} rows wanted"
            )
        if t.is_floating_point() and t.dtype != dtype:
            raise invalid(
                option,
                user.batch,
                f"{call}'s {what} are {t.dtype}: floating tensors in {dtype} wanted",
            )
    return got


def _tensors(output) -> list[torch.Tensor]:
    """The tensors of a forward's output, in order: the output itself, or those a tuple, list or
    mapping (Hugging Face's ``ModelOutput`` is one) holds, at any depth; anything else (a cache
    object) is left out."""
    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, Mapping):
        items = list(output.values())
    elif isinstance(output, (tuple, list)):
        items = list(output)
    else:
        return []
    return [t for item in items for t in _tensors(item)]


def _forward(user: UserModel, model: nn.Module, x, dtype):
    option = MODEL_OPTIONS["build"]
    first = _call(option, user.build, f"the forward in {dtype}", lambda: model(x))
    second = model(x)
    kind = type(first).__name__
    if not isinstance(first, torch.Tensor) and user.loss is None:
        raise invalid(
            option,
            user.build,
            f"the forward returned a {kind}, not a tensor: the default loss (mean squared error) "
            f"needs a tensor; name a loss that reads the {kind} with {{option:loss_fn}}",
        )
    got, again = _tensors(first), _tensors(second)
    if not got:
        raise invalid(option, user.build, f"the forward returned a {kind} that holds no tensor")
    if len(got) != len(again) or not all(
        a.shape == b.shape and torch.equal(a, b) for a, b in zip(got, again)
    ):
        raise invalid(
            option,
            user.build,
            "two forwards of the same batch differ: dropout or another random op is on in "
            "training mode (no two processes can agree on it); build the model without it",
        )
    return first


def _loss_checked(user, model, x, y, out, dtype) -> None:
    option = MODEL_OPTIONS["loss"] if user.loss else MODEL_OPTIONS["batch"]
    value = user.loss or user.batch
    if user.loss is None and isinstance(out, torch.Tensor) and out.shape != y.shape:
        raise invalid(
            option,
            value,
            f"the targets have shape {tuple(y.shape)}, the model's output {tuple(out.shape)}: the "
            "default loss (mean squared error) needs them equal; name a loss with {option:loss_fn}",
        )
    loss = _call(option, value, "the loss", lambda: user_loss(user, out, y))
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or loss.dim() != 0:
        shape = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise invalid(option, value, f"the loss is {shape}, not a scalar tensor (0-d)")
    _call(MODEL_OPTIONS["build"], user.build, f"the backward in {dtype}", loss.backward)
    if not any(p.grad is not None for p in model.parameters()):
        raise invalid(option, value, "the loss's backward gives no parameter a gradient")


def _rows_independent(user: UserModel, model: nn.Module, x, out, dtype) -> None:
    """Every floating tensor of the output with a row per input row (``_tensors``) equals, row
    by row, the forward of that row alone."""
    n = x.shape[0]
    with torch.no_grad():
        if isinstance(out, torch.Tensor):
            _row_equal(user, x, out.detach(), torch.cat([model(x[i : i + 1]) for i in range(n)]))
            return
        rows = [_tensors(model(x[i : i + 1])) for i in range(n)]
    for j, whole in enumerate(_tensors(out)):
        if not whole.is_floating_point() or whole.dim() == 0 or whole.shape[0] != n:
            continue
        if any(j >= len(r) or r[j].shape[1:] != whole.shape[1:] for r in rows):
            continue
        _row_equal(user, x, whole.detach(), torch.cat([r[j] for r in rows]))


def _row_equal(user: UserModel, x, out: torch.Tensor, alone: torch.Tensor) -> None:
    scale = float(out.abs().max()) if out.numel() else 0.0
    bound = _ROW_EPSILONS * torch.finfo(out.dtype).eps * max(scale, 1.0)
    same = alone.shape == out.shape
    moved = float((alone.to(out.dtype) - out).abs().max()) if same and out.numel() else 0.0
    if not same or moved > bound:
        raise invalid(
            MODEL_OPTIONS["build"],
            user.build,
            f"the forward couples the rows of a batch (row i of a {x.shape[0]}-row batch differs "
            f"from the forward of row i alone by {moved:.3g}): each rank computes with its own "
            "rows, so no data-parallel wrapper can equal one process on the global batch",
        )
