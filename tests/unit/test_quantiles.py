import pytest

from gate.core.quantiles import order_statistic


def test_order_statistic_is_an_observed_value_rounding_up() -> None:
    xs = [5.0, 1.0, 4.0, 2.0, 3.0, 6.0]
    assert order_statistic(xs, 0.5) == 4.0  # the upper of the two middle values
    assert order_statistic(xs, 0.99) == 6.0
    assert order_statistic(xs, 0.0) == 1.0
    assert order_statistic(xs, 1.0) == 6.0
    assert order_statistic(range(1, 201), 0.99) == 199  # index floor(0.99 * 200) = 198


def test_order_statistic_of_nothing_is_none_and_a_bad_q_is_refused() -> None:
    assert order_statistic([], 0.5) is None
    with pytest.raises(ValueError, match="outside"):
        order_statistic([1.0], 1.5)
