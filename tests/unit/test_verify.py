import numpy as np

from memdiag.analyze.verify import compare_losses, compare_parameters


def test_identical_parameters_pass():
    a = {"w": np.ones((3, 3), np.float32)}
    [d] = compare_parameters(a, {"w": a["w"].copy()})
    assert d.passed and d.max_abs_diff == 0.0


def test_rounding_level_differences_pass_and_real_ones_fail():
    ref = {"w": np.full((4,), 0.5, np.float32)}
    [ok] = compare_parameters(ref, {"w": ref["w"] + np.float32(1e-7)})
    [bad] = compare_parameters(ref, {"w": ref["w"] * 2})
    assert ok.passed and not bad.passed
    assert bad.max_rel_diff == 1.0


def test_missing_or_reshaped_variables_fail():
    ref = {"w": np.zeros(3), "b": np.zeros(1)}
    assert not all(d.passed for d in compare_parameters(ref, {"w": np.zeros(3)}))
    assert not all(d.passed for d in compare_parameters(ref, {"w": np.zeros(4), "b": np.zeros(1)}))


def test_loss_curves():
    assert compare_losses([2.0, 1.0], [2.0, 1.0]) == 0.0
    assert compare_losses([2.0, 1.0], [2.0, 1.5]) == 0.5
    assert compare_losses([2.0], [2.0, 1.0]) == float("inf")


def _summary(initial_digest, passed_checks=True):
    return {"status": "ok", "initial_params_digest": initial_digest, "consistency": {"ranks_identical": True},
            "steps_detail": []}


def _params(tmp_path, name, value):
    folder = tmp_path / name
    folder.mkdir()
    np.savez(folder / "params.npz", **{"0000:w": np.full((3,), value, np.float32)})
    return str(folder)


def test_a_script_that_does_not_seed_itself_is_said_so_and_not_failed(tmp_path):
    from memdiag.analyze.compare import correctness

    # GIVEN two runs of a script whose initial parameters differ (it does not seed itself)
    dirs = {(2, "sparse"): _params(tmp_path, "s", 1.0), (2, "dense"): _params(tmp_path, "d", 5.0)}
    summaries = {(2, "sparse"): _summary("aaaa"), (2, "dense"): _summary("bbbb")}
    verify = {"world_size": 2, "reduction_checks": [
        {"name": "emb", "max_abs_diff": 1e-9, "max_rel_diff": 1e-8, "reduce_op": "average",
         "compression": "NoneCompressor"}]}
    # WHEN they are compared
    result = correctness(dirs, summaries, verify)
    # THEN the parameters are not compared, the reason is given, and the reduction check decides
    assert [c["passed"] for c in result["checks"]] == [None]
    assert any("does not seed" in note for note in result["notes"])
    assert result["passed"] is True and result["reduction"]["passed"] is True


def test_the_same_start_and_different_ends_fail(tmp_path):
    from memdiag.analyze.compare import correctness

    dirs = {(2, "sparse"): _params(tmp_path, "s", 1.0), (2, "dense"): _params(tmp_path, "d", 5.0)}
    summaries = {(2, "sparse"): _summary("aaaa"), (2, "dense"): _summary("aaaa")}
    result = correctness(dirs, summaries, None)
    assert result["passed"] is False and result["checks"][0]["max_rel_diff"] == 4.0


def test_fp16_compression_gets_half_precisions_tolerance():
    from memdiag.analyze.verify import FP16_REDUCTION_RTOL, REDUCTION_RTOL, reduction_rtol

    assert reduction_rtol("FP16Compressor") == FP16_REDUCTION_RTOL > reduction_rtol("NoneCompressor") == REDUCTION_RTOL
