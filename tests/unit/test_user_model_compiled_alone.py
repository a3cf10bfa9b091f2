"""Note [A user's model torch cannot compile]: a compiled case on a user's model whose ranks raised
is skipped where the model alone, compiled in one process, raises too; not where it runs. Note [A
user's model torch cannot run in mixed precision]: the same for a case whose float32 model a
wrapper computes in bfloat16 (``masters_from_float32``)."""

from dataclasses import replace
from pathlib import Path

from paracheck.cases import Case
from paracheck.check.properties.compiled import model_cannot_compile
from paracheck.check.user_model import model_cannot_run_mixed
from paracheck.workloads.user import UserModel

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
STOCK = f"{EXAMPLES / 'stock_models.py'}:"
MODELS = f"{EXAMPLES / 'models.py'}:"


class _Raised:
    kind = "raised"


class _Hung:
    kind = "hung"


def _case(user: UserModel) -> Case:
    return replace(Case(), batch_sizes=(1, 2), user_model=user, compiled="aot_eager")


def test_a_model_torch_cannot_compile_alone_skips_the_case():
    """torch 2.13's aot_eager raises on the stock LM alone at two rows (a BatchNorm output
    transposed into a Linear): the case is skipped with torch's words."""
    stock = UserModel(f"{STOCK}stock_lm", f"{STOCK}stock_lm_batch", f"{STOCK}stock_lm_loss")
    why = model_cannot_compile(_case(stock), _Raised())
    assert why is not None and why.startswith(
        "torch.compile (aot_eager) cannot run the model alone:"
    )
    assert "no wrapper, 2 rows" in why, why
    assert model_cannot_compile(_case(stock), _Hung()) is None  # a hang is judged as ever
    assert model_cannot_compile(replace(_case(stock), compiled=None), _Raised()) is None


def test_a_model_that_compiles_alone_leaves_the_failure_to_the_wrapper():
    tied = UserModel(f"{MODELS}tied_lm", f"{MODELS}lm_batch", f"{MODELS}lm_loss")
    assert model_cannot_compile(_case(tied), _Raised()) is None


def _mixed(user: UserModel) -> Case:
    return replace(
        Case(),
        batch_sizes=(1, 1),
        dtype="bfloat16",
        master_weights=True,
        masters_from_float32=True,
        user_model=user,
    )


def test_a_model_torch_cannot_run_with_bfloat16_weights_and_float32_buffers_skips_the_case():
    """torch 2.13's CPU BatchNorm1d in eval mode asserts on bfloat16 weights beside float32
    running statistics (the stock LM's frozen norm): the case is skipped with torch's words."""
    stock = UserModel(f"{STOCK}stock_lm", f"{STOCK}stock_lm_batch", f"{STOCK}stock_lm_loss")
    why = model_cannot_run_mixed(_mixed(stock), _Raised())
    assert why is not None and why.startswith(
        "the model cannot run with its parameters in bfloat16 and its buffers in float32"
    ), why
    assert "no wrapper, 1 row)" in why, why
    assert model_cannot_run_mixed(_mixed(stock), _Hung()) is None  # a hang is judged as ever
    plain = replace(_mixed(stock), master_weights=False, masters_from_float32=False)
    assert model_cannot_run_mixed(plain, _Raised()) is None


def test_a_model_that_runs_so_alone_leaves_the_failure_to_the_wrapper():
    tied = UserModel(f"{MODELS}tied_lm", f"{MODELS}lm_batch", f"{MODELS}lm_loss")
    assert model_cannot_run_mixed(_mixed(tied), _Raised()) is None
