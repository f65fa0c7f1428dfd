"""Does the fix keep training the same? Parameters and losses compared between modes.

Reducing IndexedSlices by allgather and by dense allreduce adds the same numbers in a different
order, so float32 results agree to rounding, not bit for bit. The tolerance says how close is same.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from memdiag.rounding import FLOAT32_UNIT_ROUNDOFF, gamma

# Parameters after a few optimizer steps: float32 sums re-associated across ranks, then Adam.
RTOL = 1e-4
ATOL = 1e-6
# One reduced gradient, both ways: the same N float32 terms summed in another order.
REDUCTION_RTOL = 1e-5
# With fp16 compression the dense path is rounded to half precision (the allgather path never is):
# a few units of float16's epsilon (9.8e-4) relative to the largest value.
FP16_REDUCTION_RTOL = 4e-3


def reduction_rtol(compression: str | None) -> float:
    """How close the two reductions of one gradient must be, given the script's compression."""
    return FP16_REDUCTION_RTOL if compression and "FP16" in compression.upper() else REDUCTION_RTOL


def update_allowance(terms: int) -> float:
    """How far float rounding alone can move a parameter's update, as a fraction of the update: a
    gradient element that sums ``terms`` numbers is off its exact sum by at most gamma(terms) x the sum
    of their magnitudes (gamma(n) = n u / (1 - n u)), so two summation orders differ by at most twice
    that. Where the terms share a sign (a row looked up thousands of times) that is the update's own
    size; a fault (a sum for an average, dropped duplicates) changes the update by a whole multiple of
    it. Capped at 1 (where it reaches 1, rounding can explain anything and the check loses its power)."""
    n = max(1, int(terms))
    if n * FLOAT32_UNIT_ROUNDOFF >= 0.5:
        return 1.0
    return min(1.0, 2 * float(gamma(n)))


@dataclass(frozen=True)
class VariableDiff:
    name: str
    max_abs_diff: float
    max_rel_diff: float
    passed: bool
    max_update: float | None = None  # the reference's largest |final - initial| in this variable
    allowance: float = 0.0  # what rounding may add to the tolerance: update_allowance x max_update


def load_parameters(path: str) -> dict[str, np.ndarray[Any, Any]]:
    with np.load(path) as data:
        return {key.split(":", 1)[1] if ":" in key else key: data[key] for key in data.files}


def compare_parameters(reference: dict[str, np.ndarray[Any, Any]], other: dict[str, np.ndarray[Any, Any]],
                       rtol: float = RTOL, atol: float = ATOL, initial: dict[str, np.ndarray[Any, Any]] | None = None,
                       terms: int | None = None) -> list[VariableDiff]:
    """Per variable: max |a - b|, max |a - b| / |a|, and whether |a - b| <= atol + rtol |a| holds.

    Given the reference's ``initial`` parameters and ``terms`` (the most numbers any reduced gradient
    element sums), rounding's share is added: ``update_allowance(terms)`` x the variable's largest
    update |a - initial| (over the run). Without them the fixed tolerance alone decides."""
    if set(reference) != set(other):
        missing = sorted(set(reference) ^ set(other))
        return [VariableDiff(name, float("inf"), float("inf"), False) for name in missing]
    diffs = []
    for name, ref in reference.items():
        got = other[name]
        if ref.shape != got.shape:
            diffs.append(VariableDiff(name, float("inf"), float("inf"), False))
            continue
        ref64, got64 = ref.astype(np.float64), got.astype(np.float64)
        delta = np.abs(ref64 - got64)
        scale = np.abs(ref64)
        rel = np.divide(delta, scale, out=np.zeros_like(delta), where=scale > 0)
        start = None if initial is None else initial.get(name)
        max_update, allowance = None, 0.0
        if start is not None and start.shape == ref.shape and terms:
            max_update = float(np.abs(ref64 - start.astype(np.float64)).max(initial=0.0))
            allowance = update_allowance(terms) * max_update
        passed = bool(np.all(delta <= atol + rtol * scale + allowance))
        diffs.append(VariableDiff(name, float(delta.max(initial=0.0)), float(rel.max(initial=0.0)), passed,
                                  max_update, allowance))
    return diffs


def compare_losses(reference: list[float | None], other: list[float | None], rtol: float = RTOL) -> float:
    """Largest relative difference between two loss curves (inf if their lengths differ)."""
    if len(reference) != len(other):
        return float("inf")
    worst = 0.0
    for a, b in zip(reference, other):
        if a is None or b is None:
            continue
        worst = max(worst, abs(a - b) / max(abs(a), 1e-12))
    return worst
