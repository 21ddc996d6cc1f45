"""The front of speed against memory, and its area: one definition for the search, its exploration, its report
and the comparison with Optuna.

A point is (tokens/s, peak MiB): more tokens/s and less memory are better. A point is **beaten** by another that
is at least as good on both figures and better on one. Speeds are measured with noise, so a point leaves the front
only where another is surely as fast: faster by the measured spread or more (`tie`, a share of the speed), with
no more memory. Points whose speeds are closer than the spread are ties, and both stay. With `tie` at 0 this is
the usual Pareto front, and of points with equal figures the first one stays.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import takewhile
from typing import TypeVar

T = TypeVar("T")
Point = tuple[float, float]  # (tokens/s, peak MiB)


def beats(a: Point, b: Point, tie: float = 0.0) -> bool:
    """`a` beats `b`: as fast beyond the spread, no more memory, and better on one of the two."""
    (a_tps, a_mem), (b_tps, b_mem) = a, b
    surely_as_fast = a_tps >= b_tps * (1 + tie)
    return surely_as_fast and a_mem <= b_mem and (a_mem < b_mem or a_tps > b_tps * (1 + tie))


def front(items: Sequence[T], point: Callable[[T], Point | None], floor_tps: float = 0.0,
          tie: float = 0.0) -> list[T]:
    """The items at floor_tps or more that no other beats (see the module's docstring), fastest first; an item
    whose point is None (not measured on both figures) is no point. Of items with equal points, the first."""
    pts = [(i, item, p) for i, item in enumerate(items)
           if (p := point(item)) is not None and p[0] > 0 and p[1] > 0 and p[0] >= floor_tps]
    pts.sort(key=lambda ip: (-ip[2][0], ip[2][1], ip[0]))
    kept = []
    for n, (_, item, p) in enumerate(pts):
        rivals = takewhile(lambda q: q[0] >= p[0] * (1 + tie), (q for _, _, q in pts))  # surely as fast: a prefix
        equal_before = n > 0 and pts[n - 1][2] == p  # equal points sort next to each other, the first first
        if not equal_before and not any(beats(q, p, tie) for q in rivals):
            kept.append(item)
    return kept


def area(points: Sequence[Point], floor_tps: float, top_mem: float) -> float:
    """The hypervolume of the points: the area (tokens/s above floor_tps, times MiB under top_mem) they dominate."""
    total, least = 0.0, top_mem
    for tps, mem in sorted(points, key=lambda p: (-p[0], p[1])):
        if tps > floor_tps and mem < least:
            total += (tps - floor_tps) * (least - mem)
            least = mem
    return total
