"""Note [A user's model torch cannot compile]: a compiled case on a user's model whose ranks raised
is skipped where the model alone, compiled in one process, raises too; not where it runs."""

from dataclasses import replace
from pathlib import Path

from paracheck.cases import Case
from paracheck.check.properties.compiled import model_cannot_compile
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
