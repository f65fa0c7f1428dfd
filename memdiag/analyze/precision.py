"""How precisely repeats pin a growth figure: the standard error of the fitted growth per added rank.

With ``--repeats R`` each row's peak is the median of its R runs, and the runs' spread at that rank count
(their sample standard deviation ``s``) says how far such a median strays: for normal draws its variance
is ``s^2 x m(R)``, ``m(R)`` the variance of the median of R standard normal draws (:func:`median_variance`;
1/R for a mean, 0.449 for the median of three, about pi / (2 R) for many). The growth is a least-squares
slope over the rank counts, a weighted sum of the rows' medians, so its variance is the weights' squares
times theirs (:func:`slope_standard_error`). Halving it takes four times the repeats (:func:`repeats_for`).
Two rows' medians at one rank count differ with the sum of their variances (:func:`difference_standard_error`).

A verdict with repeats calls a difference beyond the noise where it exceeds two of these standard errors
(:data:`WITHIN`): about one chance in twenty for normal draws. The range of a row's repeats, the noise figure
without them, widens as repeats are added and so judges more leniently the more runs there are.

What it leaves out: the runs of a comparison run one after another within minutes, so a drift of the
machine over longer times (measured: docs/explanation/measurement.md#noise) moves every
run of one comparison together and is not in ``s``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

WITHIN = 2.0  # standard errors: a difference no larger is within the repeats' noise
_GRID = np.linspace(-9.0, 9.0, 36_001)
_STEP = float(_GRID[1] - _GRID[0])


def _integral(values: npt.NDArray[np.float64]) -> float:
    """The trapezoidal rule over the grid."""
    return float((values.sum() - (values[0] + values[-1]) / 2) * _STEP)


@functools.cache
def median_variance(repeats: int) -> float:
    """The variance of the median of ``repeats`` independent standard normal draws: an odd count's middle
    order statistic, an even count's mean of its two middle ones, by numerical integration of their
    densities (exact for one and two: 1 and 1/2)."""
    if repeats < 1:
        raise ValueError("repeats must be at least 1")
    x = _GRID
    pdf = np.exp(-x * x / 2) / math.sqrt(2 * math.pi)
    cdf = 0.5 * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))
    if repeats % 2:
        k = (repeats + 1) // 2  # the k-th smallest of ``repeats``
        scale = math.factorial(repeats) / (math.factorial(k - 1) * math.factorial(repeats - k))
        density = scale * pdf * cdf ** (k - 1) * (1 - cdf) ** (repeats - k)
        return _integral(x * x * density)
    k = repeats // 2  # the median is the mean of the k-th and (k+1)-th smallest
    scale = math.factorial(repeats) / (math.factorial(k - 1) * math.factorial(repeats - k - 1))
    lower = cdf ** (k - 1) * pdf  # the k-th's factor, integrated up to the (k+1)-th's value y

    def below(power: int) -> npt.NDArray[np.float64]:
        integrand = x**power * lower
        return np.concatenate(([0.0], np.cumsum((integrand[1:] + integrand[:-1]) / 2 * _STEP)))

    a0, a1, a2 = below(0), below(1), below(2)
    upper = scale * pdf * (1 - cdf) ** (repeats - k - 1)
    return _integral(upper * (a2 + 2 * x * a1 + x * x * a0) / 4)


def slope_standard_error(points: Sequence[tuple[float, float, int]]) -> float | None:
    """The standard error of the least-squares slope through rows at (rank count, sample standard deviation of
    its repeats, repeats), each row the median of its repeats; None with fewer than two rank counts or a row
    of one run."""
    if len({n for n, _, _ in points}) < 2 or any(r < 2 for _, _, r in points):
        return None
    mean_n = sum(n for n, _, _ in points) / len(points)
    sxx = sum((n - mean_n) ** 2 for n, _, _ in points)
    return math.sqrt(sum(((n - mean_n) / sxx) ** 2 * sd * sd * median_variance(r) for n, sd, r in points))


def difference_standard_error(points: Sequence[tuple[float, int]]) -> float | None:
    """The standard error of the difference between two rows' medians, each given as (sample standard deviation
    of its repeats, repeats); None where either is one run."""
    if len(points) != 2 or any(r < 2 for _, r in points):
        return None
    return math.sqrt(sum(sd * sd * median_variance(r) for sd, r in points))


def within(difference: float, standard_error: float) -> bool:
    """Whether a difference of byte figures is within :data:`WITHIN` standard errors of it, to the byte (the
    figures are fits of whole bytes: a fraction of one is the arithmetic's, not a difference)."""
    return abs(difference) <= WITHIN * standard_error + 0.5


def repeats_for(standard_error: float, repeats: int, half_width: float) -> int:
    """About how many repeats at each rank count put two standard errors within ``half_width`` (the standard
    error falling as one over the square root of the repeats); ``repeats`` where they do already."""
    if half_width <= 0:
        raise ValueError("half_width must be positive")
    needed = math.ceil(repeats * (2 * standard_error / half_width) ** 2)
    return max(repeats, needed)
