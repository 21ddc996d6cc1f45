"""Statistics for step times and repeats; plain numpy, checked against known inputs in tests."""

import math
from typing import NamedTuple

import numpy as np

# Two-sided 95% Student t quantiles (t_0.975) for 1..30 degrees of freedom,
# from the standard table; past 30 the normal 1.96 is within 2%.
T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
        2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
        2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042]


def describe(values: list[float]) -> dict[str, float]:
    """Median, p10, p90 (linear interpolation), mean, sample std and CV (%) of a sample."""
    a = np.asarray(values, dtype=np.float64)
    if a.size == 0:
        raise ValueError("describe() needs at least one value")
    mean = float(a.mean())
    std = float(a.std(ddof=1)) if a.size > 1 else 0.0
    return {
        "median": float(np.median(a)),
        "p10": float(np.percentile(a, 10)),
        "p90": float(np.percentile(a, 90)),
        "mean": mean,
        "std": std,
        "cv_pct": 100.0 * std / mean if mean else 0.0,
        "min": float(a.min()),
        "max": float(a.max()),
    }


def t_interval(values: list[float]) -> tuple[float, float] | None:
    """t-based 95% confidence interval for the mean; None with fewer than two values."""
    n = len(values)
    if n < 2:
        return None
    a = np.asarray(values, dtype=np.float64)
    t = T975[n - 2] if n - 1 <= len(T975) else 1.96
    half = t * float(a.std(ddof=1)) / math.sqrt(n)
    return float(a.mean()) - half, float(a.mean()) + half


def prediction_interval(values: list[float]) -> tuple[float, float] | None:
    """95% prediction interval for one more run: mean +- t * s * sqrt(1 + 1/n); None with fewer than two.

    A confidence interval for the mean shrinks as repeats pile up, so two
    sessions' intervals stop overlapping as soon as sessions differ at all; this
    one says where the next independent run's value should fall, which is what
    a second run of the matrix is.
    """
    n = len(values)
    if n < 2:
        return None
    a = np.asarray(values, dtype=np.float64)
    t = T975[n - 2] if n - 1 <= len(T975) else 1.96
    half = t * float(a.std(ddof=1)) * math.sqrt(1.0 + 1.0 / n)
    return float(a.mean()) - half, float(a.mean()) + half


def halves_gap(values: list[float]) -> float:
    """Relative gap between the medians of the first and second half of a window."""
    half = len(values) // 2
    if half == 0:
        return 0.0
    first, second = float(np.median(values[:half])), float(np.median(values[half:]))
    return abs(second - first) / first if first else 0.0


# A timed step over this many times its window's median is a stall (the process stopped by kill -STOP or a
# debugger, swapped out or starved), not the spread of a steady loop: in the 95 timed windows committed under
# results/ the slowest step was at most 3.6x its median, save one 314 ms step among 6 ms ones (52x, h200-small's
# weights_bf16), which this flags.
STALL_FACTOR = 10.0


class Stalls(NamedTuple):
    """What stalled one timed window."""

    steps: int
    """Timed steps over STALL_FACTOR times the window's median."""
    longest_ms: float
    """The worst stalled step's time beyond the median; 0.0 for none."""
    outside_ms: float
    """The time between steps that stalled (see `stalls`); 0.0 for none."""


def stalls(step_ms: list[float], window_wall_ms: float | None, factor: float = STALL_FACTOR,
           gap_ms: list[float] | None = None) -> Stalls:
    """The stalls of one timed window: its steps over `factor` times the median, and the time between its steps
    that stalled.

    Both, because a stop lands inside a step (whose host or device time then holds it), between two steps, where
    CUDA events time nothing, or across the end of one into the gap after it. With `gap_ms` (the host's wall time
    from each step's end to the next one's start), a gap over `factor` median steps stalled by its excess over the
    median gap, wherever in the window it fell. Without (a measurement that kept no gaps), only the window's wall
    time outside the steps can say it, where that is longer than the steps themselves and than `factor` median
    steps: host work between steps (batches, copies) took a fifth of the steps' time at most in the committed runs,
    so more than all of it is no host work.
    """
    if not step_ms:
        return Stalls(0, 0.0, 0.0)
    median = float(np.median(step_ms))
    excess = [t - median for t in step_ms if t > factor * median]
    if gap_ms:
        usual = float(np.median(gap_ms))
        between = sum((g - usual for g in gap_ms if g > factor * median), 0.0)  # 0.0, not int 0, when none stalled
        return Stalls(len(excess), max(excess, default=0.0), between)
    outside = window_wall_ms - sum(step_ms) if window_wall_ms is not None else 0.0
    return Stalls(len(excess), max(excess, default=0.0),
                  outside if outside > max(sum(step_ms), factor * median) else 0.0)


def separated(a: tuple[float, float] | None, b: tuple[float, float] | None) -> bool | None:
    """Whether two intervals do not overlap; None when either is missing."""
    if a is None or b is None:
        return None
    return a[1] < b[0] or b[1] < a[0]


def t_cdf(t: float, df: int) -> float:
    """Student's t distribution function at `t` with `df` (a positive integer) degrees of freedom, in closed form
    (Abramowitz and Stegun 26.7.3 for odd df, 26.7.4 for even): with theta = atan(t / sqrt(df)), the probability
    of |T| <= t is a finite series in sin(theta) and cos(theta)."""
    theta = math.atan(t / math.sqrt(df))
    c2 = math.cos(theta) ** 2
    series, term = 0.0, math.cos(theta) if df % 2 else 1.0
    for k in range(df % 2, df - 1, 2):  # odd df: cos + (2/3)cos^3 + ...; even: 1 + (1/2)cos^2 + (1*3)/(2*4)cos^4 + ...
        series += term
        term *= c2 * (k + 1) / (k + 2)
    inside = 2 / math.pi * (theta + math.sin(theta) * series) if df % 2 else math.sin(theta) * series
    return 0.5 + 0.5 * inside


def one_sided_below(values: list[float], level: float) -> tuple[float, float]:
    """The one-sided one-sample t-test that the mean of `values` is below `level` (the speedrun's rule for a
    record): the t statistic and its p-value, P(T <= t) with n - 1 degrees of freedom. Needs two values or more;
    values all equal give t = -inf or +inf (p 0 or 1), or nan (p nan) at the level itself."""
    n = len(values)
    if n < 2:
        raise ValueError("one_sided_below() needs at least two values")
    a = np.asarray(values, dtype=np.float64)
    gap, sd = float(a.mean()) - level, float(a.std(ddof=1))
    if sd == 0.0:
        return (math.copysign(math.inf, gap), 0.0 if gap < 0 else 1.0) if gap else (math.nan, math.nan)
    t = gap / (sd / math.sqrt(n))
    return t, t_cdf(t, n - 1)
