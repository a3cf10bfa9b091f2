"""Note [A scaled value]: a tensor whose every element is a whole factor of the oracle's (or its
inverse) diverged "scaled", apart from another wrong value; the factor is not part of the cause,
and the worst element alone does not make a tensor scaled."""

import torch

from paracheck.check.properties._divergence import how_diverged
from paracheck.check.properties.closeness import whole_factor, wrong_how


def _detail(got: float, expected: float, factor: str | None = None) -> str:
    text = f"worst element #3 (of the finite ones): got {got:.6e}, expected {expected:.6e}"
    return text if factor is None else f"{text}; every element is {factor} times its expected value"


def test_a_sum_where_a_mean_is_due_is_scaled_whatever_the_world_size():
    ref = torch.tensor([0.1234, -0.5, 2.0, 1e-9], dtype=torch.float64)
    assert whole_factor(2 * ref, ref) == "2"  # a sum of two ranks' gradients
    assert whole_factor(3 * ref, ref) == "3"  # of three
    assert whole_factor(ref / 2, ref) == "1/2"  # a mean divided once more
    assert how_diverged(_detail(0.2468, 0.1234, "2")) == "scaled"
    assert how_diverged(_detail(0.0617, 0.1234, "1/2")) == "scaled"


def test_a_sum_rounded_to_bfloat16_is_still_scaled():
    ref = torch.randn(64, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    assert whole_factor((3 * ref).to(torch.bfloat16), ref) == "3"


def test_a_local_gradient_twice_the_average_at_its_worst_element_is_a_value():
    """Two ranks: where the other rank's gradient is near zero, a gradient left local is twice
    the average; elsewhere it is not. The worst element says 2, the tensor does not."""
    mine = torch.tensor([-3.304362, 0.5, 1.0], dtype=torch.float64)
    other = torch.tensor([1.659e-3, 0.7, -0.2], dtype=torch.float64)
    assert whole_factor(mine, (mine + other) / 2) is None
    assert how_diverged(_detail(-3.304362, -1.651351)) == "value"


def test_a_local_gradient_or_a_wrong_weighting_is_a_value():
    ref = torch.tensor([0.1234, 0.2, -0.3], dtype=torch.float64)
    assert whole_factor(ref * torch.tensor([1.4, 1.1, 0.9]), ref) is None
    assert whole_factor(-ref, ref) is None  # a sign, not a factor
    assert whole_factor(10 * ref, ref) is None  # 10 x: beyond the factors drawn
    assert whole_factor(torch.zeros(3, dtype=torch.float64), ref) is None
    assert how_diverged(_detail(0.1700, 0.1234)) == "value"
    assert how_diverged(_detail(0.0, 0.1234)) == "value"


def test_a_rounding_stays_a_rounding():
    assert how_diverged(_detail(0.12340001, 0.1234)) == "rounding"


def test_a_parameter_is_judged_by_its_update():
    """A parameter after a step: left unchanged where the oracle's changed (a shard never
    stepped or never broadcast), its update a whole factor of the oracle's (an SGD step on a
    summed gradient), or another wrong value (a weight decay applied twice)."""
    before = torch.tensor([0.5, -0.25, 1.0], dtype=torch.float64)
    grad = torch.tensor([0.1, 0.3, -0.2], dtype=torch.float64)
    ref = before - 0.01 * grad
    assert how_diverged(_detail(0.5, 0.499) + wrong_how(before.clone(), ref, before)) == "unchanged"
    summed = before - 0.01 * 2 * grad
    assert how_diverged(_detail(0.498, 0.499) + wrong_how(summed, ref, before)) == "scaled"
    decayed = ref * (1 - 0.01 * 0.1)
    assert how_diverged(_detail(0.4985, 0.499) + wrong_how(decayed, ref, before)) == "value"
    # Without the parameter before the step, the values themselves are compared.
    assert wrong_how(summed, ref) == ""


def test_a_parameter_s_rounding_is_of_its_update_not_its_value():
    """Note [A parameter's update]: a weight decay applied twice moves a parameter by lr * wd of
    itself: below 1e-3 of its value at lr * wd = 1e-4, yet a wrong update; a gradient rounded to
    float32 leaves the update within 1e-3 of the oracle's."""
    before = torch.tensor([0.5, -0.25, 1.0], dtype=torch.float64)
    grad = torch.tensor([0.1, 0.3, -0.2], dtype=torch.float64)
    lr, wd = 1e-3, 0.1
    ref = before * (1 - lr * wd) - lr * grad
    twice = ref * (1 - lr * wd)
    detail = _detail(twice[0].item(), ref[0].item())
    assert how_diverged(detail) == "rounding"  # by the value alone
    assert how_diverged(detail + wrong_how(twice, ref, before)) == "value"
    rounded = before * (1 - lr * wd) - lr * grad.float().double() * (1 + 1e-7)
    assert how_diverged(_detail(0.5, 0.5) + wrong_how(rounded, ref, before)) == "rounding"
