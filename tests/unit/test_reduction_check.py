"""The reduction check per reduction: dense and merged each compared with the allgather."""

from memdiag.analyze.correctness import reduction_result


def _check(against, rel, compression=None):
    return {"name": "emb", "against": against, "max_abs_diff": rel, "max_rel_diff": rel, "scale": 1.0,
            "reduce_op": "average", "compression": compression}


def test_a_merged_reduction_beyond_its_tolerance_fails_the_check_and_is_named():
    result = reduction_result({"world_size": 2, "reduction_checks": [_check("dense", 2e-7), _check("dedup", 0.98)]})
    assert result["passed"] is False and result["max_rel_diff"] == 0.98
    assert result["by_reduction"]["dense"]["passed"] is True
    assert result["by_reduction"]["dedup"]["passed"] is False


def test_fp16_compression_loosens_the_dense_tolerance_only():
    # 1e-3: within fp16's 4e-3 for the dense path, beyond 1e-5 for merging (gathered uncompressed)
    checks = [_check("dense", 1e-3, "FP16Compressor"), _check("dedup", 1e-3, "FP16Compressor")]
    result = reduction_result({"world_size": 2, "reduction_checks": checks})
    assert result["by_reduction"]["dense"]["passed"] is True
    assert result["by_reduction"]["dedup"]["passed"] is False and result["passed"] is False


def test_records_without_against_are_dense_checks():
    older = {k: v for k, v in _check("dense", 1e-7).items() if k != "against"}
    result = reduction_result({"world_size": 2, "reduction_checks": [older]})
    assert set(result["by_reduction"]) == {"dense"} and result["passed"] is True


def test_the_run_report_says_when_u_outgrew_the_guard_auto_decided_with():
    from memdiag.report.terminal import guard_outgrown

    policy = {"mode": "auto", "decision": "dedup", "distinct_rows": 100, "agreed_rows": 256, "dedup_guard": 1.25}
    seen = {"name": "emb", "distinct_rows_max": 125}
    assert guard_outgrown(seen, policy) is None  # 100 x 1.25 = 125 planned
    warning = guard_outgrown({**seen, "distinct_rows_max": 126}, policy)
    assert warning and "126" in warning and "125" in warning
    assert guard_outgrown({**seen, "distinct_rows_max": 200}, {**policy, "mode": "dedup"}) is None


# -- float rounding's bound ---------------------------------------------------------------------------

def test_the_bound_by_hand():
    import numpy as np

    from memdiag.agent.reduction_check import rounding_bound_ratio

    u = 2.0**-24
    # one row of one element: 3 terms, magnitudes summing to 1.0, the reduction's value 0.5
    bound = 2 * (3 * u / (1 - 3 * u)) * 1.0 + 2 * u * 0.5
    diff = np.array([[bound / 2]])
    ratio = rounding_bound_ratio(diff, np.array([[0.5]]), np.array([3.0]), np.array([1.0]), u)
    assert ratio == 0.5
    # nothing summed, yet a difference: beyond any bound
    assert rounding_bound_ratio(np.array([[1e-9]]), np.array([[0.0]]), np.array([0.0]), np.array([0.0]), u) \
        == float("inf")


def test_two_summation_orders_of_thousands_of_float32_terms_stay_within_the_bound_and_a_wrong_sum_does_not():
    import numpy as np

    from memdiag.agent.reduction_check import rounding_bound_ratio

    rng = np.random.default_rng(5)
    terms = rng.normal(scale=1e-3, size=(4000, 8)).astype(np.float32)  # 4000 lookups of one row
    forward = np.zeros(8, np.float32)
    for t in terms:
        forward += t
    backward = np.zeros(8, np.float32)
    for t in terms[::-1]:
        backward += t
    diff = np.abs(forward.astype(np.float64) - backward.astype(np.float64))[None, :]
    assert diff.max() > 0  # the orders do differ...
    magnitude = np.abs(terms.astype(np.float64)).sum(axis=0)[None, :]
    u = float(np.finfo(np.float32).eps) / 2
    ratio = rounding_bound_ratio(diff, forward[None, :].astype(np.float64), np.array([4000.0]), magnitude, u)
    assert ratio <= 1  # ...within the bound
    # keeping the first term instead of the sum (--inject-fault drop-duplicates) is far beyond it
    first = np.abs(forward.astype(np.float64) - terms[0].astype(np.float64))[None, :]
    assert rounding_bound_ratio(first, forward[None, :].astype(np.float64), np.array([4000.0]), magnitude, u) > 10
    # the bound is the worst case, linear in the terms: dropping one of 4000 similar terms hides in it,
    # while on a row of two terms dropping one is caught
    dropped = np.abs(forward.astype(np.float64) - (forward - terms[0]).astype(np.float64))[None, :]
    assert rounding_bound_ratio(dropped, forward[None, :].astype(np.float64), np.array([4000.0]), magnitude, u) < 1
    pair = terms[:2].astype(np.float64)
    assert rounding_bound_ratio(np.abs(pair[1])[None, :], pair.sum(axis=0)[None, :], np.array([2.0]),
                                np.abs(pair).sum(axis=0)[None, :], u) > 1000


def test_a_check_within_the_rounding_bound_passes_though_beyond_the_fixed_tolerance():
    within = {**_check("dense", 3.4e-5), "rounding_bound_ratio": 0.2, "terms_max": 12000}
    result = reduction_result({"world_size": 2, "reduction_checks": [within]})
    assert result["passed"] is True and result["terms_max"] == 12000
    beyond = {**_check("dedup", 3.4e-7), "rounding_bound_ratio": 1.5, "terms_max": 3}
    result = reduction_result({"world_size": 2, "reduction_checks": [within, beyond]})
    assert result["passed"] is False and result["by_reduction"]["dedup"]["passed"] is False
    assert result["by_reduction"]["dense"]["passed"] is True


def test_a_verification_run_that_did_not_finish_fails_the_check():
    result = reduction_result({"world_size": 2, "status": "error", "reduction_checks": []})
    assert result["passed"] is False and result["failed_run"] == "error"
    assert reduction_result({"world_size": 2, "status": "ok", "reduction_checks": []})["passed"] is None


def test_under_fp16_compression_the_relative_tolerance_decides_the_dense_path():
    checks = [{**_check("dense", 1e-3, "FP16Compressor")}]
    assert reduction_result({"world_size": 2, "reduction_checks": checks})["passed"] is True
    checks = [{**_check("dense", 1e-2, "FP16Compressor")}]
    assert reduction_result({"world_size": 2, "reduction_checks": checks})["passed"] is False
