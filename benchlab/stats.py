"""Statistics for step times and repeats; plain numpy, checked against known inputs in tests."""

import math

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


def separated(a: tuple[float, float] | None, b: tuple[float, float] | None) -> bool | None:
    """Whether two intervals do not overlap; None when either is missing."""
    if a is None or b is None:
        return None
    return a[1] < b[0] or b[1] < a[0]
