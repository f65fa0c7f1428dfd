"""Correctness verdicts that know what they cannot know: a script's own randomness (unseeded data,
sampling or initialisation) told from the reduction's effect by what differed before any reduction, and
no PASSED without evidence."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.text import Text

from memdiag.analyze.correctness import correctness, what_varied
from memdiag.report.compare import correctness_text

REDUCTION_OK = {"world_size": 2, "reduction_checks": [
    {"name": "emb", "max_abs_diff": 1e-9, "max_rel_diff": 1e-8, "reduce_op": "average",
     "compression": "NoneCompressor"}]}


def fingerprints(rows: str, values: str) -> dict:
    """An IndexedSlices gradient's first reduction on two ranks: rank 1 as given, rank 0 fixed."""
    return {"emb:0": {"0": {"step": 0, "rows": 40, "indices_digest": "i0", "values_digest": "v0"},
                      "1": {"step": 0, "rows": 52, "indices_digest": rows, "values_digest": values}}}


def run_dir(tmp_path: Path, name: str, value: float, first: dict | None, initial: str = "aaaa") -> tuple[str, dict]:
    folder = tmp_path / name
    folder.mkdir()
    np.savez(folder / "params.npz", **{"0000:emb": np.full((3, 2), value, np.float32)})
    summary = {"status": "ok", "mode": name.split("-")[-1], "initial_params_digest": initial,
               "consistency": {"ranks_identical": None}, "steps_detail": [], "steps": 2}
    if first is not None:
        summary["first_gradients"] = first
    (folder / "summary.json").write_text(json.dumps(summary))
    return str(folder), summary


def compared(tmp_path: Path, sparse_first: dict | None, dense_first: dict | None, dense_value: float,
             verify: dict | None = None, order: tuple[float, dict] | None = None) -> dict:
    s_dir, s = run_dir(tmp_path, "n2-sparse", 1.0, sparse_first)
    d_dir, d = run_dir(tmp_path, "n2-dense", dense_value, dense_first)
    order_dirs = None
    if order is not None:
        o_dir, _ = run_dir(tmp_path, "verify-order-n2-dense", order[0], order[1])
        order_dirs = {(2, "dense"): o_dir}
    return correctness({(2, "sparse"): s_dir, (2, "dense"): d_dir}, {(2, "sparse"): s, (2, "dense"): d}, verify,
                       order_dirs=order_dirs)


def rendered(result: dict) -> str:
    text = Text()
    correctness_text({"correctness": result}, text)  # type: ignore[typeddict-item]
    console = Console(width=400, record=True)
    console.print(text)
    return " ".join(console.export_text().split())


def test_runs_whose_first_gradients_looked_up_other_rows_are_not_verifiable_and_the_data_is_named(tmp_path):
    # GIVEN sparse and dense runs of a script with the same initial parameters whose first step's gradient
    # already held other rows on rank 1 (unseeded data), ending 2.0 apart
    result = compared(tmp_path, fingerprints("i1", "v1"), fingerprints("i1-other", "v1-other"), 3.0)
    # THEN the parameter check decides nothing and says why, naming the data and the gradient
    [check] = result["checks"]
    assert check["passed"] is None and result["passed"] is None
    assert check["note"].startswith("not verifiable from the final parameters: the runs of sparse and dense are 2 apart")
    assert "the rows the first step looked up (the data) in emb:0" in check["note"]
    assert "Seed TensorFlow, NumPy and Python's random" in check["note"]
    # AND the report says "not decided", never FAILED, with the reason
    text = rendered(result)
    assert "Correctness not decided" in text and "FAILED" not in text and "PASSED" not in text
    assert "the rows the first step looked up" in text


def test_the_reduction_check_still_gives_its_verdict_beside_final_parameters_that_cannot_decide(tmp_path):
    # GIVEN the same runs and a verification run whose reductions agree within float rounding
    result = compared(tmp_path, fingerprints("i1", "v1"), fingerprints("i1-other", "v1-other"), 3.0, REDUCTION_OK)
    # THEN the verdict is the reduction check's: passed, with no figure of the final parameters
    assert result["passed"] is True and result["max_abs_diff"] is None and result["checks"][0]["passed"] is None
    text = rendered(result)
    assert "Correctness PASSED: final parameters not compared (below); reduction check at N=2" in text


def test_values_that_differ_over_the_same_rows_are_named_as_sampling(tmp_path):
    # GIVEN first gradients over the same rows with other values (sampled negatives, unseeded)
    result = compared(tmp_path, fingerprints("i1", "v1"), fingerprints("i1", "v1-other"), 3.0)
    [check] = result["checks"]
    assert check["passed"] is None and "the first step's gradient values over the same rows" in check["note"]


def test_a_difference_with_the_same_first_gradients_still_fails(tmp_path):
    # GIVEN runs identical up to their first reduction that end 2.0 apart: the reduction made the difference
    result = compared(tmp_path, fingerprints("i1", "v1"), fingerprints("i1", "v1"), 3.0)
    [check] = result["checks"]
    assert check["passed"] is False and result["passed"] is False and "note" not in check
    assert "Correctness FAILED" in rendered(result)


def test_runs_that_agree_pass_even_where_their_first_gradients_differ(tmp_path):
    # GIVEN first gradients that differ in values only, and final parameters equal to 1e-9 (the check's
    # tolerance decides what it can)
    result = compared(tmp_path, fingerprints("i1", "v1"), fingerprints("i1", "v1-other"), 1.0 + 1e-9)
    assert result["checks"][0]["passed"] is True and result["passed"] is True


def test_a_rank_order_run_that_parted_before_any_reduction_makes_the_check_not_verifiable(tmp_path):
    # GIVEN sparse and dense with the same first gradients, 1e-3 apart at the end (beyond the tolerance),
    # and dense again in rank order whose first gradients looked up other rows: its distance from dense is
    # the script's randomness, not the summation order's
    same = fingerprints("i1", "v1")
    result = compared(tmp_path, same, same, 1.001, order=(1.5, fingerprints("i9", "v9")))
    [check] = result["checks"]
    assert check["passed"] is None and result["passed"] is None
    assert "the runs of dense and dense again" in check["note"] and "the data" in check["note"]
    # AND with the same first gradients the rank-order run decides as it did (here: as far from sparse as
    # dense, and equal to dense: failed)
    (tmp_path / "again").mkdir()
    result = compared(tmp_path / "again", same, same, 1.001, order=(1.001, same))
    assert result["checks"][0]["passed"] is False and result["checks"][0]["rank_order"]["passed"] is False


def test_nothing_compared_is_no_pass(tmp_path):
    # GIVEN runs with no parameters saved and no verification run, whose ranks agree with each other
    s_dir, d_dir = tmp_path / "s", tmp_path / "d"
    s_dir.mkdir()
    d_dir.mkdir()
    summary = {"status": "ok", "initial_params_digest": None, "consistency": {"ranks_identical": True},
               "steps_detail": []}
    result = correctness({(2, "sparse"): str(s_dir), (2, "dense"): str(d_dir)},
                         {(2, "sparse"): summary, (2, "dense"): summary}, None)
    # THEN there is no verdict (ranks that agree say nothing about the modes), and the report gives the reason
    assert result["passed"] is None and result["ranks_identical_every_step"] is True
    text = rendered(result)
    assert "PASSED" not in text and "no parameters saved" in text


def test_what_varied_names_the_initial_parameters_first():
    a = {"initial_params_digest": "a", "first_gradients": fingerprints("i1", "v1")}
    b = {"initial_params_digest": "b", "first_gradients": fingerprints("i2", "v2")}
    assert what_varied(a, b) == ["the initial parameters", "the rows the first step looked up (the data) in emb:0"]
    assert what_varied(a, {**a}) == []
    # runs without fingerprints (older, or no IndexedSlices gradient) tell nothing
    assert what_varied({"initial_params_digest": "a"}, {"initial_params_digest": "a", "first_gradients": {}}) == []
