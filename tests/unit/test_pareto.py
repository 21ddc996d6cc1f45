"""benchlab/search/pareto.py: the one front of speed against memory, with ties within the measured spread, and
its area."""

import pytest

from benchlab.search.pareto import area, beats, front


def pts(points: list[tuple[float, float]], floor: float = 0.0, tie: float = 0.0) -> list[tuple[float, float]]:
    return front(points, lambda p: p, floor, tie)


def test_the_front_keeps_the_unbeaten_at_or_above_the_floor_fastest_first() -> None:
    points = [(100.0, 50.0), (120.0, 80.0), (90.0, 40.0), (95.0, 60.0), (120.0, 81.0), (99.0, 50.0), (80.0, 1.0)]
    assert pts(points, 85.0) == [(120.0, 80.0), (100.0, 50.0), (90.0, 40.0)]
    assert pts(points) == [(120.0, 80.0), (100.0, 50.0), (90.0, 40.0), (80.0, 1.0)]
    assert pts(points, 90.0) == [(120.0, 80.0), (100.0, 50.0), (90.0, 40.0)]  # the floor itself is in


def test_of_equal_points_the_first_stays_and_an_unmeasured_one_is_no_point() -> None:
    a, b = ("a", (100.0, 50.0)), ("b", (100.0, 50.0))
    assert front([a, b], lambda x: x[1]) == [a] and front([b, a], lambda x: x[1]) == [b]
    assert front([("x", None), a, ("zero", (500.0, 0.0))], lambda x: x[1]) == [a]
    assert front([], lambda x: x) == []


def test_speeds_within_the_spread_are_ties_and_both_stay() -> None:
    fast, near, leaner_near = (100.0, 50.0), (99.5, 50.0), (99.5, 49.0)
    assert pts([fast, near]) == [fast]  # exact figures: the slower one at the same memory is beaten
    assert pts([fast, near], tie=0.01) == [fast, near]  # 0.5% apart with a 1% spread: a tie
    assert pts([fast, (98.0, 50.0)], tie=0.01) == [fast]  # 2% apart: beyond the spread, beaten
    assert pts([fast, leaner_near], tie=0.01) == [fast, leaner_near]
    # a tie on speed does not let the leaner point push the faster one off either
    assert not beats(leaner_near, fast, 0.01) and not beats(fast, leaner_near, 0.01)
    assert beats((101.01, 50.0), (100.0, 50.0), 0.01) and not beats((101.0, 50.0), (100.0, 50.0), 0.01)


def test_the_area_is_what_the_points_dominate_between_the_floor_and_the_top_memory() -> None:
    assert area([(110.0, 50.0), (100.0, 20.0)], 90.0, 100.0) == 20 * 50 + 10 * 30
    assert area([(110.0, 50.0), (100.0, 20.0), (105.0, 60.0)], 90.0, 100.0) == 20 * 50 + 10 * 30  # beaten: no area
    assert area([(80.0, 10.0)], 90.0, 100.0) == 0.0  # below the floor
    assert area([], 90.0, 100.0) == 0.0
    assert area([(110.0, 50.0)], 90.0, 40.0) == pytest.approx(0.0)  # above the top memory
