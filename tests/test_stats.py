"""stats: interval separation at its boundary, describe(), the t table's last row and halves_gap."""

import math

import pytest

from benchlab import stats


def test_touching_intervals_are_not_separated_in_either_order() -> None:
    assert stats.separated((0.0, 1.0), (1.0, 2.0)) is False
    assert stats.separated((1.0, 2.0), (0.0, 1.0)) is False
    assert stats.separated((1.0, 2.0), (0.0, 0.5)) is True
    assert stats.separated(None, (0.0, 1.0)) is None and stats.separated((0.0, 1.0), None) is None


def test_describe_of_one_two_and_zero_mean_samples() -> None:
    one = stats.describe([5.0])
    assert one["std"] == 0.0 and one["cv_pct"] == 0.0 and one["median"] == 5.0
    assert stats.describe([1.0, 3.0])["std"] == pytest.approx(math.sqrt(2))
    assert stats.describe([-1.0, 1.0])["cv_pct"] == 0.0  # no CV around a zero mean, rather than a division by it
    with pytest.raises(ValueError, match=r"^describe\(\) needs at least one value$"):
        stats.describe([])


@pytest.mark.parametrize("interval, widen", [(stats.t_interval, lambda n: 1 / math.sqrt(n)),
                                             (stats.prediction_interval, lambda n: math.sqrt(1 + 1 / n))])
def test_the_t_table_s_last_row_and_the_normal_quantile_past_it(interval, widen) -> None:
    for n, t in [(30, 2.045), (31, 2.042), (32, 1.96)]:  # 29 and 30 degrees of freedom from the table, then 1.96
        values = [10.0, 12.0] * (n // 2) + [11.0] * (n % 2)
        low, high = interval(values)
        s = stats.describe(values)["std"]
        assert (high - low) / 2 == pytest.approx(t * s * widen(n)), n


def test_halves_gap_splits_at_the_middle() -> None:
    assert stats.halves_gap([10.0, 20.0, 30.0, 40.0]) == pytest.approx(20.0 / 15.0)
    assert stats.halves_gap([10.0, 20.0]) == pytest.approx(1.0)
    assert stats.halves_gap([5.0]) == 0.0
    assert stats.halves_gap([0.0, 0.0, 1.0, 1.0]) == 0.0  # a zero first half: no ratio, rather than a division by 0
