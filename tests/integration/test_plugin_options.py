"""The pytest plugin's choices: ``--paracheck-contract``, ``--paracheck-features``,
``--paracheck-properties`` and the same as ``paracheck_check`` keywords, Hypothesis's own
``--hypothesis-profile`` and ``--hypothesis-seed``, and clear usage errors."""

from pathlib import Path

import pytest
from hypothesis import settings

from paracheck.pytest_plugin import _search_settings

pytest_plugins = ("pytester",)

CS336_DDP = f"{Path(__file__).with_name('_cs336_ddp.py')}:GradNotNoneDDP"
ARGS = ("-p", "no:cacheprovider", "--paracheck-world-sizes", "1,2,3", "--paracheck-no-database")

# Ten examples at world sizes 1,2,3 break GradNotNoneDDP under the full contract
# (tests/integration/test_contracts.py): these passes are the options' doing.
OPTIONS_TEST = f"""
def test_cs336_ddp(paracheck_check):
    paracheck_check({CS336_DDP!r}, max_examples=10)


def test_properties_option_reaches_the_check(paracheck_check):
    report = paracheck_check("bucketed", world_sizes=(1, 2), max_examples=2)
    assert report.target.properties == frozenset({{"equivalence"}})
"""

KEYWORDS_TEST = f"""
def test_keywords(paracheck_check):
    paracheck_check({CS336_DDP!r}, max_examples=10, contract="cs336")
    paracheck_check({CS336_DDP!r}, max_examples=10, features="-unused-some-ranks")
    report = paracheck_check("bucketed", world_sizes=(1, 2), max_examples=2, properties="equivalence")
    assert report.target.properties == frozenset({{"equivalence"}})
"""


@pytest.mark.parametrize(
    "options",
    [("--paracheck-contract", "cs336"), ("--paracheck-features=-unused-some-ranks",)],
    ids=["contract", "features"],
)
def test_plugin_options_choose_features_and_properties(inner, options):
    inner.makepyfile(test_options=OPTIONS_TEST)
    result = inner.runpytest(*ARGS, "--paracheck-properties", "equivalence", *options)
    result.assert_outcomes(passed=2)


def test_paracheck_check_takes_contract_features_and_properties(inner):
    inner.makepyfile(test_keywords=KEYWORDS_TEST)
    inner.runpytest(*ARGS).assert_outcomes(passed=1)


@pytest.mark.parametrize(
    "option, words",
    [
        ("--paracheck-features=-nope", "--paracheck-features=-nope: 'nope' is not a feature"),
        ("--paracheck-features=-accumulation,+no-sync", "+no-sync needs accumulation"),
        ("--paracheck-properties=nope", "--paracheck-properties=nope: unknown ['nope']"),
    ],
)
def test_plugin_refuses_a_bad_choice_at_startup(pytester, option, words):
    pytester.makepyfile(test_nothing="def test_nothing():\n    pass\n")
    result = pytester.runpytest("-p", "no:cacheprovider", option)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert words in result.stderr.str()


@pytest.mark.skipif(
    __import__("torch").cuda.is_available(), reason="the refusal is for machines without CUDA"
)
def test_plugin_refuses_nccl_without_cuda(pytester):
    """--paracheck-backend nccl where no GPU is visible is a usage error, not a session of skips
    that a GPU job would read as passed."""
    pytester.makepyfile(test_nothing="def test_nothing():\n    pass\n")
    result = pytester.runpytest("-p", "no:cacheprovider", "--paracheck-backend", "nccl")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--paracheck-backend=nccl: no CUDA device is visible" in result.stderr.str()


def test_plugin_takes_max_examples_from_the_hypothesis_profile_given(inner):
    """--hypothesis-profile names a profile of 3 examples: the check runs no more."""
    inner.makeconftest(
        inner.path.joinpath("conftest.py").read_text()
        + "\nfrom hypothesis import settings\n"
        + "settings.register_profile('paracheck-tiny', max_examples=3)\n"
    )
    inner.makepyfile(
        test_tiny="def test_tiny(paracheck_check):\n"
        "    assert paracheck_check('naive', world_sizes=(1, 2)).examples <= 3\n"
    )
    before = settings.get_current_profile_name()
    try:
        inner.runpytest(*ARGS, "--hypothesis-profile", "paracheck-tiny").assert_outcomes(passed=1)
    finally:
        settings.load_profile(before)


class _Config:
    def __init__(self, **options):
        self.options = options

    def getoption(self, name, default=None):
        return self.options.get(name, default)


@pytest.mark.parametrize(
    "options, expected",
    [
        ({}, (40, 0)),
        ({"--paracheck-profile": "dev"}, (100, None)),
        ({"--hypothesis-seed": "7"}, (40, 7)),
        ({"--hypothesis-seed": "abc"}, (40, "abc")),
        ({"--hypothesis-profile": "ci"}, (settings.get_profile("ci").max_examples, 0)),
        ({"--hypothesis-profile": "ci", "--paracheck-profile": "nightly"}, (1000, None)),
        ({"--hypothesis-profile": "default", "--hypothesis-seed": "3"}, (100, 3)),
    ],
)
def test_search_settings_follow_paracheck_then_hypothesis_options(options, expected):
    """--paracheck-profile first, then --hypothesis-profile (its max_examples, derandomised or
    not), then ci; --hypothesis-seed fixes the sequence whatever the profile."""
    assert _search_settings(_Config(**options)) == expected


LOSS_TEST = """
import pytest


def test_loss_option_reaches_loop_targets(paracheck_check):
    report = paracheck_check("loop-batch-mean", world_sizes=(1, 2), max_examples=2)
    assert (report.target.loss, report.target.clip_norm) == ("batch-mean", None)
    # Other kinds are untouched by a loop option.
    assert paracheck_check("flat", world_sizes=(1,), max_examples=1).target.loss is None


def test_a_token_mean_loop_is_not_a_batch_mean_one(paracheck_check):
    with pytest.raises(pytest.fail.Exception, match="FAIL loop"):
        paracheck_check(
            "loop", world_sizes=(1, 2), max_examples=5, first_failure=True, labels=False
        )


def test_keyword_wins_over_the_option(paracheck_check):
    report = paracheck_check("loop", world_sizes=(1,), max_examples=1, loss="token-mean")
    assert report.target.loss == "token-mean"
"""


def test_loss_option_applies_to_loop_targets(inner):
    """``--paracheck-loss`` declares a loop target's loss semantics, as ``--loss`` does."""
    inner.makepyfile(test_loss=LOSS_TEST)
    inner.runpytest(*ARGS, "--paracheck-loss", "batch-mean").assert_outcomes(passed=3)


INCOMPLETE_TEST = """
def test_table_out_of_budget(paracheck_check):
    paracheck_check("naive", world_sizes=(1, 2), table=True, budget=1e-9)
"""


def test_a_table_with_rows_not_reached_fails_unless_the_option_accepts_it(inner):
    """A verdict table (table=True) whose budget reached no row is INCOMPLETE: the test fails,
    as paracheck check exits 3; --paracheck-incomplete pass lets the rows reached decide."""
    inner.makepyfile(test_incomplete=INCOMPLETE_TEST)
    result = inner.runpytest(*ARGS)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*INCOMPLETE naive: verdict table of*not reached*"])
    result.stdout.fnmatch_lines(["*--paracheck-incomplete pass accepts the rows reached*"])
    inner.runpytest(*ARGS, "--paracheck-incomplete", "pass").assert_outcomes(passed=1)
