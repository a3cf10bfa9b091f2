"""Copy this file into your project's tests/ and change the import paths.

Runs with plain `pytest` once paracheck is installed (its pytest plugin provides the fixtures).
"""

from hypothesis import given, settings

from paracheck import strategies as pst


def test_my_ddp_matches_single_process(paracheck_check):
    """My DDP equals single-process training on generated models, groups and world sizes."""
    paracheck_check("my_package.ddp:DDP")  # Class(module) or Class(module, bucket_size_mb)


def test_my_adapters_bucketed_ddp_matches_single_process(paracheck_check):
    """The handout's function-style design: get_ddp_bucketed brings its on_after_backward and
    on_train_batch_start from the same file (`paracheck check --adapters tests/adapters.py` checks
    every design the file implements)."""
    paracheck_check("tests/adapters.py:get_ddp_bucketed")


def test_my_ddp_with_its_own_hook_name_matches_single_process(paracheck_check):
    """A DDP whose after-backward method has another name (called with the optimizer if it takes one)."""
    paracheck_check("my_package.ddp:DDP", finish="sync_gradients")


def test_my_sharded_optimizer_matches_single_process(paracheck_check):
    """My sharded optimizer (Class(params, optimizer_cls, **kwargs)) equals unsharded training."""
    paracheck_check("my_package.optim:ShardedOptimizer", kind="sharded")


# Composing your own property from the public strategies:
@settings(max_examples=20, deadline=None)
@given(pst.cases(min_world_size=2, max_world_size=4, optimizers=("adamw",)))
def test_my_ddp_with_adamw_only(paracheck_world, case):
    from paracheck.check.run import run_case
    from paracheck.check.targets import resolve_target

    result = run_case(paracheck_world, resolve_target("my_package.ddp:DDP"), case)
    assert result.ok, result.describe()
