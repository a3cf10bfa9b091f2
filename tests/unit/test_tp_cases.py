"""The tensor-parallel cases (paracheck.strategies._tp, paracheck.tp.TPCase): every mesh shape of
the world sizes drawn, shapes torch's DTensor can run (Note [Widths a column-wise layer is drawn
at]), refusals naming the argument, and the case's JSON."""

import pytest
from hypothesis import HealthCheck, Phase, given, settings

from paracheck.errors import InvalidArgument
from paracheck.strategies._tp import mesh_shapes, tp_cases
from paracheck.tp import TPCase
from paracheck.workloads import MLPSpec

N = 200


def _draw(n: int = N, **kw) -> list[TPCase]:
    out: list[TPCase] = []

    @settings(
        max_examples=n,
        database=None,
        derandomize=True,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(tp_cases(**kw))
    def draw(case):
        out.append(case)

    draw()
    return out


def test_mesh_shapes_put_the_smallest_tensor_dimension_above_one_first():
    """(dp, tp) pairs of the world size, tp = 2 first and tp = 1 last."""
    assert mesh_shapes(4) == [(2, 2), (1, 4), (4, 1)]
    assert mesh_shapes(2) == [(1, 2), (2, 1)]
    assert mesh_shapes(1) == [(1, 1)]


def test_every_mesh_sequence_parallelism_and_clip_are_drawn():
    """1x2, 2x1, 2x2, 1x4 and 4x1 at world sizes 2 and 4; sequence parallelism and clipping on
    and off; odd and even chains."""
    cases = _draw(world_sizes=(2, 4))
    assert {c.mesh_shape for c in cases} == {(1, 2), (2, 1), (2, 2), (1, 4), (4, 1)}
    assert {c.sequence_parallel for c in cases} == {True, False}
    assert {c.clip_norm is None for c in cases} == {True, False}
    assert {len(c.model.widths) % 2 for c in cases} == {0, 1}


def test_column_wise_widths_are_multiples_of_the_tensor_dimension():
    """Every column-wise layer (even index of a pair) is a multiple of tp and at least 2."""
    for c in _draw(world_sizes=(2, 3, 4)):
        n = len(c.model.widths)
        for i in range(0, n - n % 2, 2):
            w = c.model.widths[i]
            assert w % c.tensor_parallel == 0 and w >= 2, (c.model.widths, c.tensor_parallel)


def test_a_precision_other_than_fp64_names_the_option():
    """--precision bf16 for a tp target is an InvalidArgument naming precision."""
    with pytest.raises(InvalidArgument, match="precision='bf16'"):
        _draw(1, world_sizes=(2,), precision="bf16")


def test_a_tensor_dimension_that_does_not_divide_the_world_is_refused():
    """TPCase(world_size=3, tensor_parallel=2) names both."""
    with pytest.raises(ValueError, match="tensor_parallel=2 must be >= 1 and divide world_size=3"):
        TPCase(world_size=3, batch_sizes=(1, 1, 1), tensor_parallel=2)


def test_a_case_keeps_its_mesh_through_json_and_a_new_world_size():
    """to_dict/from_dict keep tensor_parallel and sequence_parallel; with_world_size keeps the
    tensor dimension where it divides the new world, else 1."""
    case = TPCase(
        model=MLPSpec(in_features=2, widths=(4, 3)),
        world_size=4,
        batch_sizes=(1, 2, 1, 1),
        tensor_parallel=2,
        sequence_parallel=True,
    )
    assert TPCase.from_dict(case.to_dict()) == case
    assert case.with_world_size(2).tensor_parallel == 2
    assert case.with_world_size(3).tensor_parallel == 1


def test_a_plan_requiring_another_argument_is_refused_naming_it(tmp_path, capsys):
    """plan(model, mesh, width) is exit 2 naming width and what paracheck passes."""
    from paracheck.cli import main

    path = tmp_path / "plans.py"
    path.write_text("def plan(model, mesh, width):\n    return model\n")
    assert main(["check", f"{path}:plan", "--kind", "tp", "--no-database"]) == 2
    err = capsys.readouterr().err
    assert "requires width" in err and "the model and the 2-D mesh first" in err


def test_a_saved_tp_case_reads_back_as_one():
    """Case.from_json (the database's and --case's reader) of a TPCase's JSON is the TPCase; a
    plain case stays a Case."""
    from paracheck.cases import Case

    case = TPCase(world_size=2, batch_sizes=(1, 2), tensor_parallel=2, sequence_parallel=True)
    assert Case.from_json(case.to_json()) == case
    assert type(Case.from_json(Case().to_json())) is Case
