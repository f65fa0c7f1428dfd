"""The reduction check per reduction: dense and merged each compared with the allgather."""

from memdiag.analyze.compare import reduction_result


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

    policy = {"mode": "auto", "decision": "dedup", "distinct_rows": 100, "rows_per_rank": 256, "dedup_guard": 1.25}
    seen = {"name": "emb", "distinct_rows_max": 125}
    assert guard_outgrown(seen, policy) is None  # 100 x 1.25 = 125 planned
    warning = guard_outgrown({**seen, "distinct_rows_max": 126}, policy)
    assert warning and "126" in warning and "125" in warning
    assert guard_outgrown({**seen, "distinct_rows_max": 200}, {**policy, "mode": "dedup"}) is None
