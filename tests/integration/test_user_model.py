"""A check on the user's own model (``--model``, ``--batch``, ``--loss-fn``; Note [A user's
model] in ``paracheck.workloads.user``): a model that cannot be checked is a usage error naming
the option (exit 2, before any rank starts); the example models pass every kind's wrapper; the
mutants only a real model exposes are killed (reference: the single-process oracle)."""

from pathlib import Path

import pytest

import paracheck.world
from paracheck.cases import Case
from paracheck.check.user_model import fitted_case, user_model_of
from paracheck.cli import main
from paracheck.mutants import MODEL_MUTANTS
from paracheck.workloads.user import UserModel

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "models.py"
BAD = Path(__file__).with_name("_user_models.py")
M = f"{EXAMPLES}:"
B = f"{BAD}:"
MODELS = {
    "moe": (f"{M}moe", f"{M}moe_batch", None),
    "tied_lm": (f"{M}tied_lm", f"{M}lm_batch", f"{M}lm_loss"),
    "frozen_bn": (f"{M}frozen_bn", f"{M}bn_batch", None),
}


def _argv(model, batch, loss=None) -> list[str]:
    out = ["--model", model, "--batch", batch]
    return out + (["--loss-fn", loss] if loss else [])


@pytest.fixture
def no_world(monkeypatch):
    class Refused:
        def __init__(self, *a, **k):
            raise AssertionError("ranks were started for a usage error")

    monkeypatch.setattr(paracheck.world, "World", Refused)
    import paracheck.cli.check as cli_check

    monkeypatch.setattr(cli_check, "_make_world", Refused)


@pytest.mark.parametrize(
    "options, said",
    [
        (
            _argv(f"{B}raises", f"{B}batch"),
            "raises: build(seed=0, dtype=torch.float32) raised RuntimeError: no weights file",
        ),
        (_argv(f"{B}not_a_module", f"{B}batch"), "returned a dict, not a torch.nn.Module"),
        (_argv(f"{B}unseeded", f"{B}batch"), "two calls with seed=0 give different weights"),
        (_argv(f"{B}dropout", f"{B}batch"), "two forwards of the same batch differ: dropout"),
        (_argv(f"{B}frozen", f"{B}batch"), "has no parameter that requires a gradient"),
        (
            _argv(f"{B}linear", f"{B}wrong_rows"),
            "n=1, dtype=torch.float64)'s inputs have shape (2, 3): 1 rows wanted",
        ),
        (
            _argv(f"{B}linear", f"{B}wrong_dtype"),
            "inputs are torch.float16: floating tensors in torch.float64 wanted",
        ),
        (
            _argv(f"{B}linear", f"{B}batch", f"{B}per_row_loss"),
            f"--loss-fn={B}per_row_loss: the loss is (3,), not a scalar tensor",
        ),
        (_argv(f"{M}batchnorm", f"{M}bn_batch"), "module '1' (BatchNorm1d) is in training mode"),
        (_argv(f"{B}batch_mean_net", f"{B}batch"), "the forward couples the rows of a batch"),
        (_argv(f"{M}tied_lm", f"{M}lm_batch"), "needs them equal; name a loss with --loss-fn"),
        (
            _argv(f"{B}structured", f"{B}batch"),
            "the forward returned a Output, not a tensor: the default loss (mean squared error) "
            "needs a tensor; name a loss that reads the Output with --loss-fn",
        ),
        (
            _argv(f"{B}structured_coupled", f"{B}batch", f"{B}structured_loss"),
            "the forward couples the rows of a batch",
        ),
        (
            _argv(f"{B}no_tensor", f"{B}batch", f"{B}structured_loss"),
            "the forward returned a dict that holds no tensor",
        ),
        (_argv(f"{B}nosuch", f"{B}batch"), "has no attribute 'nosuch'"),
        (
            _argv("nosuch/models.py:build", f"{B}batch"),
            "--model=nosuch/models.py:build: module 'nosuch/models.py' does not import: "
            "FileNotFoundError: no such file:",
        ),
        (
            _argv("nosuch_pkg.models:build", f"{B}batch"),
            "--model=nosuch_pkg.models:build: module 'nosuch_pkg.models' does not import: "
            "ModuleNotFoundError",
        ),
        (
            _argv(str(EXAMPLES), f"{B}batch"),
            f"--model={EXAMPLES} must be 'package.module:name' or 'path/to/file.py:name'",
        ),
        (["--batch", f"{B}batch"], f"--batch={B}batch: needs --model"),
        (["--model", f"{B}linear"], "needs --batch pkg.mod:batch"),
    ],
    ids=[
        "raises",
        "not-a-module",
        "unseeded",
        "dropout",
        "nothing-trainable",
        "wrong-rows",
        "wrong-dtype",
        "loss-not-scalar",
        "batchnorm-training",
        "rows-coupled",
        "loss-shape",
        "structured-without-loss",
        "structured-rows-coupled",
        "structured-no-tensor",
        "missing-function",
        "missing-file",
        "missing-module",
        "no-function-named",
        "batch-alone",
        "model-alone",
    ],
)
def test_a_model_that_cannot_be_checked_is_a_usage_error(no_world, capsys, options, said):
    """Exit 2 before any rank starts, one line naming the option, its value and the rule."""
    assert main(["check", "naive", *options]) == 2
    err = capsys.readouterr().err
    assert said in err, err
    assert "Traceback" not in err


def test_a_user_model_is_refused_for_a_training_loop(no_world, capsys):
    assert main(["check", "loop", *_argv(*MODELS["moe"])]) == 2
    assert "not supported for loop (kind loop)" in capsys.readouterr().err


def test_a_model_without_float64_is_checked_in_float32():
    """A model that cannot run in float64 is checked against a float32 oracle (Note [A float32
    oracle for a user's model]), not refused."""
    from paracheck.check.user_model import info

    user = user_model_of(f"{B}float32_only", f"{B}batch", None)
    assert not info(user).float64 and "no float64 version" in info(user).why_not


def test_a_case_without_a_user_model_keeps_its_json():
    """Derandomised cases and saved cases are unchanged: no key where the field is unset."""
    case = Case()
    assert "user_model" not in case.to_json()
    user = UserModel(*MODELS["moe"])
    fitted = fitted_case(case, user)
    assert Case.from_json(fitted.to_json()) == fitted
    assert "user_model" in fitted.to_json()


def test_groups_are_fitted_to_the_user_model():
    """Indices past the model are dropped; a group left empty goes; every parameter stays in a
    group; the constructor gets one."""
    from paracheck.cases import GroupSpec, OptimizerSpec

    user = UserModel(f"{B}linear", f"{B}batch")  # two parameters
    case = Case(
        optimizer=OptimizerSpec(
            groups=(GroupSpec(params=(1, 5)), GroupSpec(params=(7,)), GroupSpec(params=()))
        )
    )
    groups = fitted_case(case, user).optimizer.groups
    assert [g.params for g in groups] == [(1,), ()]
    only_late = Case(
        steps=3,
        optimizer=OptimizerSpec(
            groups=(GroupSpec(params=(4,)), GroupSpec(params=(), add_at_step=1))
        ),
    )
    groups = fitted_case(only_late, user).optimizer.groups
    assert [(g.params, g.add_at_step) for g in groups] == [((), None)]
    unnamed = Case(
        optimizer=OptimizerSpec(groups=(GroupSpec(params=(0, 9)), GroupSpec(params=(8,))))
    )
    groups = fitted_case(unnamed, user).optimizer.groups
    assert [(g.params, g.add_at_step) for g in groups] == [((0,), None), ((), None)]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_bucketed_ddp_matches_the_oracle_on_an_example_model(name, capsys):
    """The bucketed DDP on each example model, world sizes 1 and 2, the whole verdict table."""
    argv = ["check", "bucketed", *_argv(*MODELS[name]), "--world-sizes", "1,2"]
    assert main([*argv, "--max-examples", "3", "--no-database", "--budget", "0"]) == 0, (
        capsys.readouterr().out
    )


def test_a_forward_that_returns_a_structure_is_checked_through_its_loss(capsys):
    """A forward returning a mapping of tensors and a cache object (as Hugging Face's
    ``ModelOutput``), read by the user's loss: the core row passes on a correct DDP."""
    from paracheck.check.features import optional_features

    off = ",".join(f"-{f}" for f in optional_features())
    model = _argv(f"{B}structured", f"{B}batch", f"{B}structured_loss")
    argv = ["check", "flat", *model, "--world-sizes", "1,2", "--max-examples", "4"]
    assert main([*argv, f"--features={off}", "--no-database", "--budget", "0"]) == 0, (
        capsys.readouterr().out
    )


BUILTINS = ("naive", "flat", "overlapped", "bucketed", "torch-ddp", "sharded", "zero1", "zero2")
# The second tier runs the CS336 sharded optimizer on every model (the DDPs' bucketed runs on
# every model above); the rest, 21 whole tables of 40-120 s each on the 2-core machine, run with
# -m slow.
IN_CI = ("sharded",)


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize(
    "builtin",
    [
        b
        if b in IN_CI
        else pytest.param(
            b, marks=pytest.mark.slow(reason="every built-in on every model: run with -m slow")
        )
        for b in BUILTINS
    ],
)
def test_every_builtin_matches_the_oracle_on_the_example_models(name, builtin, capsys):
    """Each built-in on each example model at world sizes 1-4 (the second tier: the sharding
    built-ins; -m slow: the others)."""
    argv = ["check", builtin, *_argv(*MODELS[name]), "--world-sizes", "1,2,3,4"]
    assert main([*argv, "--max-examples", "4", "--no-database", "--budget", "0"]) == 0, (
        capsys.readouterr().out
    )


STOCK = ROOT / "examples" / "stock_models.py"


@pytest.mark.parametrize("builtin", ["fsdp", "torch-fsdp"])
def test_fsdp_matches_the_oracle_on_stock_torch_layers(builtin, capsys):
    """paracheck's FSDP and torch's FSDP2 on a model of stock torch layers whose
    ``nn.MultiheadAttention`` reads ``out_proj.weight`` without calling ``out_proj`` (paracheck's
    raised, the shard reaching a matrix product; FSDP2's ``fully_shard`` raised on ``out_proj``),
    with a tied head and frozen BatchNorm: the core row at world sizes 1 and 2, where its cases
    at the kind's precisions (bfloat16 autocast, bfloat16 parameters with float32 masters) are
    drawn (Note [A module reads its children's parameters] in ``paracheck.fsdp``, Note [Wrapping
    with fully_shard] in ``paracheck.fsdp.torch_fsdp``, Note [A user's model torch cannot run in
    mixed precision] in ``paracheck.check.user_model``)."""
    from paracheck.check.features import optional_features

    off = ",".join(f"-{f}" for f in optional_features())
    model = _argv(f"{STOCK}:stock_lm", f"{STOCK}:stock_lm_batch", f"{STOCK}:stock_lm_loss")
    argv = ["check", builtin, *model, "--world-sizes", "1,2", "--max-examples", "8"]
    argv.append(f"--features={off}")
    assert main([*argv, "--no-database", "--budget", "0"]) == 0, capsys.readouterr().out


@pytest.mark.parametrize("name", sorted(MODEL_MUTANTS))
def test_model_mutant_is_killed(name, capsys):
    """Each mutant only a real model exposes FAILs the default verdict table on its model."""
    m = MODEL_MUTANTS[name]
    argv = _argv(f"{M}{m.model}", f"{M}{m.batch}", m.loss and f"{M}{m.loss}")
    assert main(["check", m.path, *argv, "--no-database", "--first-failure", "--budget", "0"]) == 1
    assert "FAIL" in capsys.readouterr().out


pytest_plugins = ("pytester",)

PLUGIN_TEST = f"""
def test_keywords(paracheck_check):
    paracheck_check(
        "naive", world_sizes=(1, 2), max_examples=3, model={MODELS["moe"][0]!r},
        batch={MODELS["moe"][1]!r},
    )


def test_options(paracheck_check):
    paracheck_check("naive", world_sizes=(1, 2), max_examples=3)
"""


def test_paracheck_check_takes_a_user_model(inner):
    """``paracheck_check(target, model=..., batch=...)`` and ``--paracheck-model`` /
    ``--paracheck-batch`` check the target on the user's model; a bad one is a usage error
    naming the plugin's option."""
    inner.makepyfile(test_user=PLUGIN_TEST)
    given = (
        "--paracheck-model",
        MODELS["frozen_bn"][0],
        "--paracheck-batch",
        MODELS["frozen_bn"][1],
    )
    result = inner.runpytest("-p", "no:cacheprovider", "--paracheck-no-database", *given)
    result.assert_outcomes(passed=2)
    bad = ("--paracheck-model", f"{M}batchnorm", "--paracheck-batch", f"{M}bn_batch")
    result = inner.runpytest(
        "-p", "no:cacheprovider", "--paracheck-no-database", *bad, "-k", "options"
    )
    assert "--paracheck-model=" in result.stdout.str() + result.stderr.str()


BAD_KEYWORDS_TEST = f"""
def test_raises(paracheck_check):
    paracheck_check("naive", model={B + "raises"!r}, batch={B + "batch"!r})


def test_float32_only_at_bf16(paracheck_check):
    paracheck_check("naive", model={B + "float32_only"!r}, batch={B + "batch"!r}, precision="bf16")
"""


def test_paracheck_check_refuses_a_bad_model_keyword_without_a_traceback(inner):
    """A ``model=`` that cannot be checked fails its test naming the keyword, its value and the
    rule; a model that runs in float32 only fails at another precision than fp32. No rank runs a
    case and no traceback is printed."""
    inner.makepyfile(test_bad=BAD_KEYWORDS_TEST)
    result = inner.runpytest("-p", "no:cacheprovider", "--paracheck-no-database")
    result.assert_outcomes(failed=2)
    out = result.stdout.str()
    assert f"paracheck: model='{B}raises': build(seed=0, dtype=torch.float32) raised" in out, out
    assert f"paracheck: model='{B}float32_only': does not run in float64" in out, out
    assert "check it at precision fp32, not bf16" in out, out
    assert "Traceback" not in out and "pytest_plugin.py" not in out, out


# A user's project: a model and a wrapper of its own, named by dotted path from its root, beside a
# test file checking built-ins and the wrapper on it through the plugin.
XDIST_MODELS = """
import torch
from torch import nn


def build(seed, dtype):
    return nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).to(dtype)


def batch(seed, n, dtype):
    return torch.randn(n, 3, dtype=dtype), torch.randn(n, 2, dtype=dtype)


def raises(seed, dtype):
    raise RuntimeError("no weights file")
"""

XDIST_WRAPPERS = """
from paracheck.ddp import FlatDDP


class ForgetsToDivide(FlatDDP):
    def _average(self, summed):
        return summed
"""

XDIST_TEST = f"""
KEYWORDS = dict(model="usermodels:build", batch="usermodels:batch")


def test_bucketed_on_keywords(paracheck_check):
    report = paracheck_check("bucketed", **KEYWORDS)
    assert report.target.user_model.build == "usermodels:build" and report.examples == 3


def test_sharded_on_the_options(paracheck_check):
    report = paracheck_check("sharded")
    assert report.target.user_model.build == {MODELS["moe"][0]!r} and report.examples == 3


def test_broken_wrapper(paracheck_check):
    paracheck_check("userwrappers:ForgetsToDivide", **KEYWORDS)
"""

CAUSE = "gradients: gradients not averaged over ranks"


def test_plugin_checks_a_user_model_under_xdist(pytester, monkeypatch):
    """Under ``-n 2`` each worker imports the user's model (by dotted path and by file) in itself
    and in its ranks: the built-ins pass on it, a wrapper that never divides fails once with its
    cause, and a model whose build raises ends the session at once (pytest's usage error, exit 4)
    naming the option, with no traceback."""
    for name in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID"):
        monkeypatch.delenv(name, raising=False)  # this test's own worker's, not the inner run's
    monkeypatch.setenv("CI", "true")  # pytest's summary then repeats a failure's whole message
    pytester.makepyfile(
        usermodels=XDIST_MODELS, userwrappers=XDIST_WRAPPERS, test_user_xdist=XDIST_TEST
    )
    common = ("-p", "no:cacheprovider", "-n", "2", "--paracheck-world-sizes", "1,2")
    options = ("--paracheck-model", MODELS["moe"][0], "--paracheck-batch", MODELS["moe"][1])
    result = pytester.runpytest_subprocess(*common, "--paracheck-max-examples", "3", *options)
    out = result.stdout.str()
    result.assert_outcomes(passed=2, failed=1)
    assert "FAILED test_user_xdist.py::test_broken_wrapper" in out, out
    assert out.count(CAUSE) == 1, out  # also in the short summary that CI does not trim
    assert "--model usermodels:build --batch usermodels:batch --case" in out, out
    assert "Traceback" not in out + result.stderr.str(), out

    raising = ("--paracheck-model", "usermodels:raises", "--paracheck-batch", "usermodels:batch")
    result = pytester.runpytest_subprocess(*common, *raising)
    said = "--paracheck-model=usermodels:raises: build(seed=0, dtype=torch.float32) raised"
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert said in result.stderr.str() and "Traceback" not in result.stderr.str()
    missing = ("--paracheck-model", "nosuch.py:build", "--paracheck-batch", "usermodels:batch")
    result = pytester.runpytest_subprocess(*common, *missing)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    said = "--paracheck-model=nosuch.py:build: module 'nosuch.py' does not import"
    assert said in result.stderr.str() and "Traceback" not in result.stderr.str()
