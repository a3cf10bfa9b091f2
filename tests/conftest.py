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


# The two tiers of tests.
#   The README's test command is a newcomer's first answer: it must end within minutes on the
#   2-core machine, so the longest suites run in the second tier, which `.ci/run` runs right
#   after it (`-m ci`): nothing is left out of CI, and the first tier still covers every area
#   (each kind's built-ins against the oracle, the selftest's mutants, the CLI, the gate, the
#   runner's failures). Each entry is a test file or a test (parametrised ones whole), with why
#   it waits for the second tier; a test marked ``slow`` runs in neither (``-m slow``).
SECOND_TIER = {
    "tests/property/test_compiled.py::test_builtin_ddps_compiled_match_the_oracle_and_their_eager_ledger": "every built-in DDP compiled in three settings",
    "tests/property/test_compiled.py::test_torch_ddp_compiled_with_the_graph_break_optimiser_above_its_first_bucket": "a compiled case and its eager twin",
    "tests/property/test_compiled.py::test_builtin_ddps_lowered_by_the_inductor_match_the_oracle": "gcc compiling the inductor's kernels",
    "tests/property/test_compiled.py::test_builtin_ddps_pass_drawn_compiled_cases": "drawn compiled cases",
    "tests/property/test_compiled.py::test_loops_compiled_match_the_oracle": "loops compiled in the aot_eager settings",
    "tests/property/test_compiled.py::test_the_loop_compile_row_passes": "a loop's compile row, drawn compiled cases",
    "tests/unit/test_kind_draws.py::test_a_kind_declares_exactly_the_features_it_never_draws": "each kind's cases drawn at two precisions",
    "tests/property/test_sharding_mutants.py::test_sharding_mutant_is_killed": "every sharding mutant",
    "tests/property/test_sharding_mutants.py::test_protocol_mutant_survives_without_its_protocol": "every sharding mutant",
    "tests/property/test_fsdp.py::test_fsdp_mutant_is_killed": "every FSDP mutant",
    "tests/property/test_ddp_mutants.py::test_ddp_mutant_is_killed": "every DDP mutant",
    "tests/property/test_loop.py::test_loop_mutant_is_killed": "every loop mutant",
    "tests/property/test_tp.py": "tensor-parallel meshes and every tp mutant",
    "tests/property/test_two_world_sizes.py": "mutants at world sizes 1 and 2",
    "tests/property/test_sharding.py::test_designs_that_round_otherwise_pass_the_derived_update_bound": "a search per design",
    "tests/property/test_float64_bound.py::test_the_matched_oracle_lies_inside_the_bound": "a search per precision",
    "tests/integration/test_history_page.py": "a headless browser",
    "tests/integration/test_attached.py": "torchrun agents",
    "tests/integration/test_interrupts.py": "signals sent to whole checks",
    "tests/integration/test_gate_workflow.py": "a fresh environment and a gate",
    "tests/integration/test_contracts.py": "whole contracts' tables",
    "tests/integration/test_external_target.py::test_broken_external_ddp_fails_with_report": "a whole table of a broken design",
    "tests/integration/test_rank_hygiene.py::test_cli_prints_only_its_own_lines_and_leaves_no_directory": "two checks from the command line",
    "tests/integration/test_gate.py::test_gate_catches_extra_gradient_buffer": "two worker trees measured",
    "tests/property/test_sharding.py::test_master_weight_designs_match_oracle_in_bf16": "a search per design",
    "tests/property/test_rmsnorm.py::test_rms_norm_matches_oracle": "the Triton interpreter over many shapes",
    "tests/integration/test_user_model.py::test_bucketed_ddp_matches_the_oracle_on_an_example_model": "a verdict table per example model",
    "tests/integration/test_user_model.py::test_every_builtin_matches_the_oracle_on_the_example_models": "every built-in on every example model",
    "tests/integration/test_user_model.py::test_model_mutant_is_killed": "a verdict table per model mutant",
    "tests/integration/test_user_model.py::test_paracheck_check_takes_a_user_model": "two checks in pytest",
    "tests/integration/test_user_model.py::test_plugin_checks_a_user_model_under_xdist": "three pytest runs under -n 2, a World per worker",
    "tests/integration/test_user_model.py::test_fsdp_matches_the_oracle_on_stock_torch_layers": "a verdict table on a transformer",
    "tests/property/test_reshard.py::test_every_builtin_resumes_at_every_other_world_size": "seven built-ins at twelve (W, W') pairs",
    "tests/property/test_reshard.py::test_correct_designs_resume_on_drawn_cases": "drawn resumed cases",
    "tests/property/test_reshard.py::test_resharding_mutant_is_killed_by_the_reshard_row": "every resharding mutant",
    "tests/property/test_reshard.py::test_a_latent_resharding_mutant_shows_only_at_another_world_size": "three resharding mutants at two pairs",
    "tests/property/test_repeatability.py::test_repeatability_kills_arrival_order": "a search of repeated runs",
    "tests/property/test_property_selection.py::test_relations_pass_correct_targets": "every relation on two designs",
    "tests/integration/test_report.py::test_two_independent_bugs_are_both_reported_shrunk_and_labelled": "two failures shrunk and labelled",
    "tests/integration/test_external_target.py::test_cuda_synchronize_in_hook_is_diagnosed_then_stubbed": "a whole table diagnosed then stubbed",
    "tests/integration/test_external_target.py::test_adapters_example_design_of_its_own_passes_the_full_contract": "a whole contract's table from adapters",
    "tests/integration/test_saved_cases.py::test_cli_saves_a_failing_case_replays_it_first_and_drops_it_once_fixed": "three checks from the command line",
    "tests/property/test_reduce_dtype.py::test_float32_reduction_passes": "a search per precision",
    "tests/property/test_ddp_basic.py::test_no_divide_mutant_is_killed": "a mutant the first tier's selftest slice kills too",
    "tests/property/test_ddp.py::test_overlapped_matches_oracle": "the overlapped built-in's whole search, 50 s; the first tier searches naive, flat and bucketed whole",
    "tests/integration/test_external_target.py::test_correct_external_ddp_passes": "a whole table of a correct outside design from the command line",
    "tests/property/test_repeatability.py::test_correct_designs_repeat": "a repeated search per design",
    "tests/integration/test_report.py::test_pytest_fixture_fails_with_the_report_text": "a nested pytest run of a failing check",
    "tests/regression/test_bench_exact.py::test_host_cost_is_reproducible_and_nonzero": "a step's host cost accounted twice",
    "tests/property/test_fsdp.py::test_torch_fully_shard_matches_oracle": "torch's FSDP2 (the built-in fsdp's search stays in the first tier)",
    "tests/property/test_fsdp_perturbation.py::test_reference_fsdp_passes_with_a_rank_held_back": "a search per point a rank is held back",
    "tests/integration/test_interfaces.py::test_renamed_hook_taking_optimizer_matches_oracle": "a search per variant of a renamed hook",
    "tests/integration/test_verdict_table.py::test_bug_behind_an_unpromised_feature_is_reported_in_its_own_row": "a table of two rows searched (test_causes keeps the first tier's)",
}
_TIERS = {"slow": "slow: run with -m slow", "ci": "second tier: runs in .ci/run (-m ci)"}


def _second_tier(nodeid: str) -> str | None:
    path, _, rest = nodeid.partition("::")
    name = rest.split("[", 1)[0]
    return SECOND_TIER.get(f"{path}::{name}") or SECOND_TIER.get(path)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """A test of the second tier (the comment above SECOND_TIER) is marked ``ci``. A test marked
    ``slow`` or ``ci`` is skipped, and counted as skipped with its mark's reason, unless ``-m``
    selects that mark (``-m slow``, ``-m ci``; ``-m "not slow"`` does not)."""
    for item in items:
        why = _second_tier(item.nodeid)
        if why is not None and item.get_closest_marker("ci") is None:
            item.add_marker(pytest.mark.ci(reason=f"second tier ({why}): runs in .ci/run, -m ci"))
    expr = config.getoption("markexpr") or ""
    for name, default in _TIERS.items():
        if name in expr.replace(f"not {name}", ""):
            continue
        for item in items:
            mark = item.get_closest_marker(name)
            if mark is not None:
                item.add_marker(pytest.mark.skip(reason=mark.kwargs.get("reason", default)))
