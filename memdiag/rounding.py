"""Float rounding's bound on a sum, shared by the reduction check (in the ranks) and the parameter
check (in the analysis).

Summing n + 1 numbers in any order is off their exact sum by at most gamma(n) times the sum of their
magnitudes, gamma(n) = n u / (1 - n u), u the unit roundoff of the format (Higham, *Accuracy and
Stability of Numerical Algorithms*, section 3.1).
"""

from __future__ import annotations

from typing import Any

import numpy as np

# float32's unit roundoff: the relative error of one rounding (half its machine epsilon).
FLOAT32_UNIT_ROUNDOFF = 2.0**-24


def gamma(n: Any, unit: float = FLOAT32_UNIT_ROUNDOFF) -> Any:
    """gamma(n) = n u / (1 - n u), elementwise for an array of n; where n u reaches 1 the bound
    means nothing, and the denominator is held at u (a huge gamma) instead of dividing by zero."""
    n = np.asarray(n, dtype=np.float64)
    return n * unit / np.maximum(1 - n * unit, unit)
