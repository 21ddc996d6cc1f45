"""stats: interval separation at its boundary, describe(), the t table's last row, halves_gap and stalls."""

import math

import pytest

from benchlab.core import stats


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


def test_a_step_over_ten_times_the_median_is_a_stall_by_its_excess() -> None:
    steady = [10.0, 11.0, 9.0, 10.0, 12.0, 10.0]
    assert stats.stalls(steady, window_wall_ms=70.0) == stats.Stalls(steps=0, longest_ms=0.0, outside_ms=0.0)
    assert stats.stalls(steady + [100.0], None).steps == 0  # exactly 10x the median: the spread of a busy machine
    stopped = [10.0] * 20 + [20_010.0] + [10.0] * 10  # kill -STOP for 20 s inside one step
    assert stats.stalls(stopped, None) == stats.Stalls(steps=1, longest_ms=20_000.0, outside_ms=0.0)
    two = [10.0] * 10 + [150.0, 510.0]
    assert stats.stalls(two, None) == stats.Stalls(steps=2, longest_ms=500.0, outside_ms=0.0)


def test_wall_time_outside_the_steps_is_a_stall_when_it_outweighs_them() -> None:
    """A stop between two steps leaves every step's time as it was (CUDA events time the device); the window's
    wall clock holds it. Host work between steps is a fraction of the steps' own time, so only a gap longer than
    all the steps together (and than ten median steps) counts."""
    steps = [10.0] * 30  # 300 ms of steps
    assert stats.stalls(steps, window_wall_ms=590.0).outside_ms == 0.0  # 290 ms of host work: no stall
    assert stats.stalls(steps, window_wall_ms=20_300.0) == stats.Stalls(steps=0, longest_ms=0.0, outside_ms=20_000.0)
    short = [10.0] * 3  # three steps and a 60 ms gap: more than the steps, fewer than ten medians
    assert stats.stalls(short, window_wall_ms=90.0).outside_ms == 0.0
    assert stats.stalls(short, window_wall_ms=130.0).outside_ms == 0.0  # exactly ten medians outside: not yet
    assert stats.stalls([0.01, 0.01], None).outside_ms == 0.0  # no wall clock: nothing outside, however short the steps
    assert stats.stalls(short, window_wall_ms=131.0).outside_ms == pytest.approx(101.0)
    assert stats.stalls([], None) == stats.Stalls(0, 0.0, 0.0)


def test_a_gap_between_two_steps_over_ten_median_steps_is_a_stall_by_its_excess() -> None:
    """With the gaps kept, a stop between steps is found in its gap however long the window: here 1,000 steps of
    100 ms, where a 5 s stop is far less than the steps' own time and the wall clock alone could not tell it."""
    steps, gaps = [100.0] * 1000, [2.0] * 999
    long_window = sum(steps) + sum(gaps) + 5_000.0
    assert stats.stalls(steps, long_window).outside_ms == 0.0  # the window's wall clock alone: missed
    stopped = [*gaps[:500], 5_002.0, *gaps[501:]]
    assert stats.stalls(steps, long_window, gap_ms=stopped) == stats.Stalls(0, 0.0, 5_000.0)
    at_ten = [*gaps[:500], 1_000.0, *gaps[501:]]  # exactly ten median steps: not a stall
    assert stats.stalls(steps, None, gap_ms=at_ten).outside_ms == 0.0
    assert stats.stalls(steps, None, gap_ms=[*gaps[:500], 1_002.5, *gaps[501:]]).outside_ms == pytest.approx(1_000.5)
    # a stop that straddles a step's end: the step and the gap after it each hold a part, and both are counted
    split = [100.0] * 10 + [998.0 + 100.0] + [100.0] * 10
    assert stats.stalls(split, None, gap_ms=[2.0] * 10 + [1_102.0] + [2.0] * 9) == stats.Stalls(1, 998.0, 1_100.0)
    assert stats.stalls(steps, None, gap_ms=gaps) == stats.Stalls(0, 0.0, 0.0)
    assert isinstance(stats.stalls(steps, None, gap_ms=gaps).outside_ms, float)  # a record's JSON says 0.0, as for a stall
