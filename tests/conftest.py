"""Shared fixtures: one persistent gloo World for the whole session (ranks are expensive)."""

import os

import pytest
import torch

# Triton's kernels read TRITON_INTERPRET when they are first compiled, in whichever test first
# imports them: a check run by a pytester session imported them before the kernel tests set it,
# and every kernel test of the run then failed ("Cannot call @triton.jit'd outside of the scope
# of a kernel"). Without CUDA they can only be interpreted: say so before any test runs.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session")
def world(paracheck_world):
    """The plugin's session World (6 ranks by default here: the DDP properties cover world sizes 1..6)."""
    return paracheck_world


def pytest_collection_modifyitems(config, items):
    """A test marked ``slow`` is skipped, and counted as skipped with its mark's reason, unless
    ``-m`` selects slow tests (``-m slow``; ``-m "not slow"`` does not)."""
    selected = (config.getoption("markexpr") or "").replace("not slow", "")
    if "slow" in selected:
        return
    for item in items:
        mark = item.get_closest_marker("slow")
        if mark is not None:
            reason = mark.kwargs.get("reason", "slow: run with -m slow")
            item.add_marker(pytest.mark.skip(reason=reason))
