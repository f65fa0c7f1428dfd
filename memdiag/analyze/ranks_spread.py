"""The largest of N ranks: how much of a growth figure the ranks' own spread makes.

A comparison's peak for a rank count is its largest rank's. The ranks of one run run the same program, yet
their peaks differ (docs/explanation/measurement.md#noise); the largest of more of them stands higher by
that alone. If the ranks' peaks scatter about their mean with a standard deviation ``sigma``, the largest
of N lies ``sigma x e(N)`` above the mean on average, ``e(N)`` the expected largest of N independent
standard normal draws (0 for one, 1/sqrt(pi) = 0.564 for two, 1.029 for four, 1.424 for eight). So the
largest rank's peak grows with N by ``sigma x (e(b) - e(a)) / (b - a)`` per added rank from N=a to N=b
with no memory in it. ``sigma`` is measured within runs (the ranks' deviations from their run's mean,
pooled over the runs), not from the growth it is set against; the normal draws are the model's
assumption, and the mean over the ranks (:func:`rank_mean`) is the figure without the term.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from memdiag.analyze.model import linear_fit


def expected_largest_normal(n: int, steps: int = 4000) -> float:
    """The expected largest of ``n`` independent standard normal draws (n >= 1): the integral of
    x n phi(x) Phi(x)^(n-1) over x, by Simpson's rule over [-10, 10]."""
    if n < 1:
        raise ValueError("n must be at least 1")
    if n == 1:
        return 0.0
    low, high = -10.0, 10.0
    h = (high - low) / steps

    def f(x: float) -> float:
        phi = math.exp(-x * x / 2) / math.sqrt(2 * math.pi)
        cdf = 0.5 * (1 + math.erf(x / math.sqrt(2)))
        return x * n * phi * cdf ** (n - 1)

    total = f(low) + f(high)
    for i in range(1, steps):
        total += (4 if i % 2 else 2) * f(low + i * h)
    return total * h / 3


def rank_mean(peaks: Sequence[float | None]) -> float | None:
    """The mean of one run's ranks' steady peaks (None where a rank has none)."""
    if not peaks or any(p is None for p in peaks):
        return None
    return sum(p for p in peaks if p is not None) / len(peaks)


def within_run(peaks: Sequence[float | None]) -> tuple[float, int] | None:
    """One run's sum of squared deviations of its ranks' peaks from their mean, and its degrees of freedom
    (ranks - 1); None for one rank or a rank without a peak."""
    mean = rank_mean(peaks)
    if mean is None or len(peaks) < 2:
        return None
    return sum((p - mean) ** 2 for p in peaks if p is not None), len(peaks) - 1


def pooled_sd(parts: Sequence[tuple[float, int]]) -> float | None:
    """The standard deviation pooled over runs' (sum of squares, degrees of freedom)."""
    dof = sum(d for _, d in parts)
    return math.sqrt(sum(s for s, _ in parts) / dof) if dof else None


def largest_of_ranks_growth(sigma: float, world_sizes: Sequence[int]) -> float | None:
    """Per added rank, the least-squares slope of ``sigma x e(N)`` over ``world_sizes``: what the largest
    rank's peak grows by from the ranks' spread alone (None with fewer than two rank counts)."""
    points = sorted(set(world_sizes))
    fit = linear_fit([float(n) for n in points], [sigma * expected_largest_normal(n) for n in points])
    return None if fit is None else fit[0]
