"""Note [A scaled value]: a tensor at a whole factor of the oracle's (or its inverse) diverged
"scaled", apart from another wrong value; the factor is not part of the cause."""

from paracheck.check.verdict import _how


def _detail(got: float, expected: float) -> str:
    return f"worst element #3 (of the finite ones): got {got:.6e}, expected {expected:.6e}"


def test_a_sum_where_a_mean_is_due_is_scaled_whatever_the_world_size():
    assert _how(_detail(0.2468, 0.1234)) == "scaled"  # a sum of two ranks' gradients
    assert _how(_detail(-0.3702, -0.1234)) == "scaled"  # of three
    assert _how(_detail(0.0617, 0.1234)) == "scaled"  # a mean divided once more


def test_a_local_gradient_or_a_wrong_weighting_is_a_value():
    assert _how(_detail(0.1700, 0.1234)) == "value"
    assert _how(_detail(-0.1234, 0.1234)) == "value"  # a sign, not a factor
    assert _how(_detail(1.2340, 0.1234)) == "value"  # 10 x: beyond the factors drawn
    assert _how(_detail(0.0, 0.1234)) == "value"


def test_a_rounding_stays_a_rounding():
    assert _how(_detail(0.12340001, 0.1234)) == "rounding"
