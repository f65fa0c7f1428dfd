"""The reduction check: allgather and dense allreduce of the same gradient agree within float rounding's
bound for the rows' sums; a verification run that did not finish fails the check."""

import numpy as np

from memdiag.agent.hooks import rounding_bound_ratio
from memdiag.analyze.compare import reduction_result

U = 2.0**-24  # float32's unit roundoff


def _check(rel, ratio=None, compression="NoneCompressor"):
    check = {"name": "emb", "max_abs_diff": rel, "max_rel_diff": rel, "scale": 1.0, "reduce_op": "average",
             "compression": compression}
    if ratio is not None:
        check.update(rounding_bound_ratio=ratio, terms_max=12000)
    return check


def test_the_bound_by_hand():
    # one row of one element: 3 terms whose magnitudes sum to 1.0, the reduction's value 0.5
    bound = 2 * (3 * U / (1 - 3 * U)) * 1.0 + 2 * U * 0.5
    assert rounding_bound_ratio(np.array([[bound / 2]]), np.array([[0.5]]), np.array([3.0]), np.array([[1.0]]), U) == 0.5
    # nothing summed, yet a difference: beyond any bound
    assert rounding_bound_ratio(np.array([[1e-9]]), np.array([[0.0]]), np.array([0.0]), np.array([[0.0]]), U) \
        == float("inf")


def test_two_summation_orders_of_thousands_of_float32_terms_stay_within_the_bound_and_a_wrong_sum_does_not():
    rng = np.random.default_rng(5)
    terms = rng.normal(scale=1e-3, size=(4000, 8)).astype(np.float32)  # 4000 lookups of one row
    forward = np.zeros(8, np.float32)
    for t in terms:
        forward += t
    backward = np.zeros(8, np.float32)
    for t in terms[::-1]:
        backward += t
    a = forward[None, :].astype(np.float64)
    diff = np.abs(a - backward[None, :].astype(np.float64))
    assert diff.max() > 0  # the orders do differ...
    magnitude = np.abs(terms.astype(np.float64)).sum(axis=0)[None, :]
    assert rounding_bound_ratio(diff, a, np.array([4000.0]), magnitude, U) <= 1  # ...within the bound
    # keeping the first term instead of the sum (a reduction that lost the duplicates) is far beyond it
    first = np.abs(a - terms[0].astype(np.float64))
    assert rounding_bound_ratio(first, a, np.array([4000.0]), magnitude, U) > 10
    # the bound is the worst case, linear in the terms: dropping one of 4000 similar terms hides in it,
    # while on a row of two terms dropping one is caught
    dropped = np.abs(a - (forward - terms[0])[None, :].astype(np.float64))
    assert rounding_bound_ratio(dropped, a, np.array([4000.0]), magnitude, U) < 1
    pair = terms[:2].astype(np.float64)
    assert rounding_bound_ratio(np.abs(pair[1])[None, :], pair.sum(axis=0)[None, :], np.array([2.0]),
                                np.abs(pair).sum(axis=0)[None, :], U) > 1000


def test_a_check_within_the_rounding_bound_passes_though_beyond_a_fixed_1e_5():
    result = reduction_result({"world_size": 2, "reduction_checks": [_check(3.4e-5, ratio=0.38)]})
    assert result["passed"] is True and result["terms_max"] == 12000
    result = reduction_result({"world_size": 2, "reduction_checks": [_check(3.4e-5, ratio=0.38),
                                                                     _check(3.4e-7, ratio=1.5)]})
    assert result["passed"] is False and result["rounding_bound_ratio"] == 1.5


def test_under_fp16_compression_the_relative_tolerance_decides():
    assert reduction_result({"world_size": 2, "reduction_checks": [_check(1e-3, compression="FP16Compressor")]})[
        "passed"] is True
    assert reduction_result({"world_size": 2, "reduction_checks": [_check(1e-2, compression="FP16Compressor")]})[
        "passed"] is False


def test_a_verification_run_that_did_not_finish_fails_the_check():
    result = reduction_result({"world_size": 2, "status": "error", "reduction_checks": []})
    assert result["passed"] is False and result["failed_run"] == "error"
    assert reduction_result({"world_size": 2, "status": "ok", "reduction_checks": []})["passed"] is None
