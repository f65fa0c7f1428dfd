import json
from pathlib import Path

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
    from memdiag.analyze.correctness import correctness

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
    assert any(note.startswith("not verifiable from the final parameters") and "the initial parameters" in note
               and "Seed TensorFlow, NumPy and Python's random" in note for note in result["notes"])
    assert result["passed"] is True and result["reduction"]["passed"] is True


def test_the_same_start_and_different_ends_fail(tmp_path):
    from memdiag.analyze.correctness import correctness

    dirs = {(2, "sparse"): _params(tmp_path, "s", 1.0), (2, "dense"): _params(tmp_path, "d", 5.0)}
    summaries = {(2, "sparse"): _summary("aaaa"), (2, "dense"): _summary("aaaa")}
    result = correctness(dirs, summaries, None)
    assert result["passed"] is False and result["checks"][0]["max_rel_diff"] == 4.0


def test_fp16_compression_gets_half_precisions_tolerance():
    from memdiag.analyze.verify import FP16_REDUCTION_RTOL, REDUCTION_RTOL, reduction_rtol

    assert reduction_rtol("FP16Compressor") == FP16_REDUCTION_RTOL > reduction_rtol("NoneCompressor") == REDUCTION_RTOL


def test_rounding_of_long_sums_is_allowed_in_proportion_to_the_update_and_a_fault_is_not():
    from memdiag.analyze.verify import update_allowance

    unit_roundoff = 2.0**-24  # float32

    # GIVEN a table row that moved 0.02 from its start over the run, where one gradient element summed
    # up to 786,432 numbers (4 ranks x 196,608 rows)
    initial = {"t": np.zeros(4, np.float32)}
    ref = {"t": np.array([0.02, 0.01, 0.0, -0.005], np.float32)}
    terms = 786_432
    allowance = 2 * terms * unit_roundoff / (1 - terms * unit_roundoff)  # by hand: 0.0985
    assert abs(update_allowance(terms) - allowance) < 1e-12
    # WHEN the other mode's row differs by 6.35e-5 (a summation order's rounding, 0.3% of the update)
    rounded = {"t": ref["t"] + np.float32(6.35e-5)}
    # THEN the fixed tolerance alone fails it, the update-relative allowance passes it
    assert not compare_parameters(ref, rounded)[0].passed
    [d] = compare_parameters(ref, rounded, initial=initial, terms=terms)
    assert d.passed and abs(d.max_update - 0.02) < 1e-9 and abs(d.allowance - allowance * 0.02) < 1e-9
    # AND a fault that doubles the update (a sum for an average at N=2) fails even with it
    doubled = {"t": 2 * ref["t"]}
    assert not compare_parameters(ref, doubled, initial=initial, terms=terms)[0].passed
    # AND a sum so long that rounding could explain anything caps the allowance at the update itself
    assert update_allowance(2**24) == 1.0


# -- a failed parameter check looked at again, MPI's allreduce in rank order -------------------------------

def _run(tmp_path, name, values, mode="dense"):
    """A run directory with final parameters ``values`` (one variable) and a summary of 2 steps."""
    folder = tmp_path / name
    folder.mkdir()
    np.savez(folder / "params.npz", **{"0000:w": np.asarray(values, np.float32)})
    summary = {**_summary("aaaa"), "mode": mode, "steps": 2,
               "steps_detail": [{"step": 0, "loss_mean": 2.0}, {"step": 1, "loss_mean": 1.5}]}
    (folder / "summary.json").write_text(json.dumps(summary))
    return str(folder)


def _pair(tmp_path, dense_values):
    dirs = {(4, "sparse"): _run(tmp_path, "s", [0.5, -0.25, 1.0], "sparse"),
            (4, "dense"): _run(tmp_path, "d", dense_values)}
    return dirs, {key: json.loads(open(f"{path}/summary.json").read()) for key, path in dirs.items()}


def test_a_check_that_fails_as_run_passes_when_the_rank_order_run_agrees_and_both_figures_are_kept(tmp_path):
    from memdiag.analyze.correctness import correctness

    # GIVEN dense 1e-4 away from sparse in one element (beyond atol 1e-6 + rtol 1e-4 x 0.5), and the
    # same mode again with the ranks' gradients summed in rank order, 1e-8 away
    dirs, summaries = _pair(tmp_path, [0.5001, -0.25, 1.0])
    again = _run(tmp_path, "verify-order-n4-dense", [0.50000001, -0.25, 1.0])
    # WHEN compared without and with the second look
    alone = correctness(dirs, summaries, None)
    looked = correctness(dirs, summaries, None, order_dirs={(4, "dense"): again})
    # THEN alone it fails; with it, it passes, saying so, with the measured run's difference kept
    assert alone["passed"] is False and alone["checks"][0].get("rank_order") is None
    [check] = looked["checks"]
    assert looked["passed"] is True and check["passed"] is True and check["as_run_passed"] is False
    assert abs(check["max_abs_diff"] - 1e-4) < 1e-6
    assert check["rank_order"]["run"] == "verify-order-n4-dense" and check["rank_order"]["passed"] is True
    assert check["rank_order"]["max_abs_diff"] < 1e-7


def test_a_rank_order_run_that_still_differs_keeps_the_check_failed(tmp_path):
    from memdiag.analyze.correctness import correctness

    # GIVEN a dense run twice sparse's (a sum for an average) and its rank-order run just the same
    dirs, summaries = _pair(tmp_path, [1.0, -0.5, 2.0])
    again = _run(tmp_path, "verify-order-n4-dense", [1.0, -0.5, 2.0])
    result = correctness(dirs, summaries, None, order_dirs={(4, "dense"): again})
    # THEN the comparison fails, the second look's figure recorded beside the first
    [check] = result["checks"]
    assert result["passed"] is False and check["passed"] is False
    assert check["rank_order"]["passed"] is False and check["rank_order"]["max_rel_diff"] == 1.0


def test_a_difference_within_what_the_summation_order_alone_makes_passes_and_one_beyond_it_fails(tmp_path):
    from memdiag.analyze.correctness import correctness

    # GIVEN dense 1e-4 from sparse, and dense again in rank order 2e-4 from sparse and 3e-4 from the
    # measured dense: the summation order alone moves this job's parameters by 3e-4
    dirs, summaries = _pair(tmp_path, [0.5001, -0.25, 1.0])
    again = _run(tmp_path, "verify-order-n4-dense", [0.4998, -0.25, 1.0])
    # WHEN compared with the second look
    result = correctness(dirs, summaries, None, order_dirs={(4, "dense"): again})
    # THEN the rank-order run alone fails, but the difference between modes is within the two dense
    # runs' own distance: passed, all three figures kept
    [check] = result["checks"]
    assert check["rank_order"]["passed"] is False and abs(check["rank_order"]["max_abs_diff"] - 2e-4) < 1e-6
    assert abs(check["rank_order"]["spread"]["max_abs_diff"] - 3e-4) < 1e-6
    assert check["rank_order"]["spread"]["within"] is True and check["passed"] is True and result["passed"] is True

    # GIVEN instead a rank-order run 1e-5 from the measured dense (a tenth of the difference between modes)
    beyond = _run(tmp_path, "verify-order-n4-dense-2", [0.50009, -0.25, 1.0])
    result = correctness(dirs, summaries, None, order_dirs={(4, "dense"): beyond})
    # THEN the difference between modes is beyond what the order makes: failed
    [check] = result["checks"]
    assert check["rank_order"]["spread"]["within"] is False and check["passed"] is False and result["passed"] is False


def test_only_failed_densifying_modes_get_a_rank_order_run_and_equal_parameters_share_one(tmp_path):
    from memdiag.analyze.correctness import rank_order_candidates

    # GIVEN at N=4 dense and auto both 1e-4 away from sparse with bit-identical parameters, dedup as far
    # away, and at N=2 a dense run that agrees
    dirs = {(4, "sparse"): _run(tmp_path, "s4", [0.5, -0.25, 1.0], "sparse"),
            (4, "auto"): _run(tmp_path, "a4", [0.5001, -0.25, 1.0], "auto"),
            (4, "dense"): _run(tmp_path, "d4", [0.5001, -0.25, 1.0]),
            (4, "dedup"): _run(tmp_path, "m4", [0.5001, -0.25, 1.0], "dedup"),
            (2, "sparse"): _run(tmp_path, "s2", [0.5, -0.25, 1.0], "sparse"),
            (2, "dense"): _run(tmp_path, "d2", [0.5, -0.25, 1.0])}
    # WHEN the comparison asks which need a second look
    shared = rank_order_candidates(dirs)
    # THEN N=4 auto and dense, one run for both (dedup's rows never pass through the allreduce)
    assert shared == {(4, "auto"): (4, "auto"), (4, "dense"): (4, "auto")}


def test_across_engines_a_failed_pair_is_compared_again_with_the_references_rank_order_run(tmp_path):
    from memdiag.analyze.engines import across_engines

    # GIVEN Horovod dense and MWMS dense 1e-4 apart in one element, and Horovod's dense again in rank
    # order 1e-8 from MWMS's
    runs = {"horovod": {(4, "dense"): _run(tmp_path, "h", [0.5, -0.25, 1.0])},
            "tf-distribute": {(4, "dense"): _run(tmp_path, "t", [0.5001, -0.25, 1.0])}}
    summaries = {e: {k: json.loads(Path(p, "summary.json").read_text()) for k, p in d.items()} for e, d in runs.items()}
    again = _run(tmp_path, "verify-order-n4-dense", [0.50009999, -0.25, 1.0])
    # WHEN compared without, then with, that run
    [alone] = across_engines(["horovod", "tf-distribute"], runs, summaries)
    [looked] = across_engines(["horovod", "tf-distribute"], runs, summaries, {(4, "dense"): again})
    # THEN alone it fails; with it, it passes, the first figure kept beside the second
    assert alone["passed"] is False and "rank_order" not in alone
    assert looked["passed"] is True and looked["as_run_passed"] is False
    assert abs(looked["max_abs_diff"] - 1e-4) < 1e-6 and looked["rank_order"]["max_abs_diff"] < 1e-7
    assert looked["rank_order"]["run"] == "verify-order-n4-dense"


def test_across_engines_a_pair_within_the_references_own_rounding_spread_passes_and_one_beyond_fails(tmp_path):
    from memdiag.analyze.engines import across_engines
    from memdiag.report.compare import second_look_outcome

    # GIVEN Horovod dense and MWMS dense 1e-4 apart; Horovod's dense again in rank order 2e-4 from MWMS's
    # and 3e-4 from Horovod's own measured run: the summation order alone moves Horovod's run by 3e-4
    runs = {"horovod": {(4, "dense"): _run(tmp_path, "h", [0.5, -0.25, 1.0])},
            "tf-distribute": {(4, "dense"): _run(tmp_path, "t", [0.5001, -0.25, 1.0])}}
    summaries = {e: {k: json.loads(Path(p, "summary.json").read_text()) for k, p in d.items()} for e, d in runs.items()}
    within = _run(tmp_path, "verify-order-n4-dense", [0.4997, -0.25, 1.0])
    # WHEN compared with the second look
    [check] = across_engines(["horovod", "tf-distribute"], runs, summaries, {(4, "dense"): within})
    # THEN the rank-order run alone fails, the pair is within Horovod's own two runs' distance: passed
    assert check["rank_order"]["passed"] is False and abs(check["rank_order"]["spread"]["max_abs_diff"] - 3e-4) < 1e-6
    assert check["rank_order"]["spread"]["within"] is True and check["passed"] is True
    words = second_look_outcome(check["rank_order"], check["mode"], "horovod's run", runs="horovod's two runs")
    assert "horovod's two runs" in words and "within that rounding" in words

    # GIVEN instead a rank-order run 1e-5 from Horovod's measured one (a tenth of the gap between engines)
    beyond = _run(tmp_path, "verify-order-n4-dense-2", [0.49999, -0.25, 1.0])
    [check] = across_engines(["horovod", "tf-distribute"], runs, summaries, {(4, "dense"): beyond})
    # THEN the gap between engines is beyond what the order makes: failed
    assert check["rank_order"]["spread"]["within"] is False and check["passed"] is False
