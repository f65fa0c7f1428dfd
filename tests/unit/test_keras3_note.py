"""A parameter check that fails between sparse and dense under Keras 3 names Keras 3's optimizer only
where the run's measurements support it.

Keras 3.15's Adam applies an IndexedSlices with repeated rows otherwise than their dense sum (measured in
docs/howto/failed-check.md), so under Keras 3 sparse and dense runs can train apart with a correct reduction.
The check still fails (a difference is a difference). The note says why only when (1) the comparison's
reduction check found allgather and dense allreduce within float rounding's bound, and (2) the gap is of
the optimizer's size: within each failing variable's own largest update over the run. Both sides of
each condition are tested here, with figures worked out by hand.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from memdiag.analyze.correctness import correctness, parameter_check, reduction_result

TABLE = "0000:transformer/source_embedding/embeddings:0"
START = 0.5


def _run(path: Path, table: np.ndarray, initial: bool = False) -> str:
    path.mkdir()
    np.savez(path / "params.npz", **{TABLE: table})
    if initial:  # the reference's parameters before the first update
        np.savez(path / "params_initial.npz", **{TABLE: np.full_like(table, START)})
    return str(path)


def _summary(keras: str) -> dict:
    return {"versions": {"tensorflow": "2.21.0", "keras": keras}, "policy": [], "steps": 2, "status": "ok",
            "consistency": {"ranks_identical": True},
            "steps_detail": [{"step": 0, "loss_mean": 5.0}, {"step": 1, "loss_mean": 4.0}]}


def _verification(bound_ratio: float) -> dict:
    """A verification run's reduction check of the table: both reductions ``bound_ratio`` of float
    rounding's bound apart (<= 1: within it)."""
    return {"world_size": 2, "status": "ok", "reduction_checks": [
        {"name": TABLE, "against": "dense", "max_abs_diff": 1e-8, "max_rel_diff": 2e-7,
         "rounding_bound_ratio": bound_ratio, "terms_max": 512}]}


def _check(tmp_path: Path, keras: str = "3.15.1", mode: str = "dense", moved: float = 0.02, gap: float = 0.01,
           verification: dict | None = None) -> dict:
    # GIVEN a reference (sparse) that moved the table from 0.5 by ``moved`` and another mode ``gap`` from it:
    # far beyond the tolerance, atol + rtol |a| = 1e-6 + 1e-4 x 0.48 = 4.9e-5
    reference = np.full((4, 2), START - moved, np.float32)
    ref = _run(tmp_path / "sparse", reference, initial=True)
    other = _run(tmp_path / mode, reference + np.float32(gap))
    reduction = None if verification is None else reduction_result(verification)
    return parameter_check(2, mode, "sparse", ref, other, _summary(keras), _summary(keras), reduction)


def test_a_gap_within_the_update_with_the_reduction_within_rounding_names_the_optimizer(tmp_path):
    check = _check(tmp_path, verification=_verification(0.26))
    assert check["passed"] is False  # still a failure
    note = check["note"]
    assert "Keras 3.15.1" in note and "Adam's second moment" in note
    # the evidence, in figures: the reduction check's 0.26 of the bound, the 0.01 gap within the 0.02 update
    assert "within 0.26 of float rounding's bound" in note
    assert "the largest gap, 0.01 in" in note and "own largest update (0.02)" in note


def test_a_gap_larger_than_the_variables_whole_update_is_not_explained(tmp_path):
    # 0.01 apart on a table that moved 1e-4 (about 200 x the tolerance): no optimizer applying the same
    # gradient otherwise does that
    check = _check(tmp_path, moved=1e-4, verification=_verification(0.26))
    assert check["passed"] is False and "note" not in check


@pytest.mark.parametrize("verification", [None, _verification(3.0)], ids=["no reduction check", "beyond the bound"])
def test_without_a_reduction_check_within_rounding_the_optimizer_is_not_named(tmp_path, verification):
    check = _check(tmp_path, verification=verification)
    assert check["passed"] is False and "note" not in check


@pytest.mark.parametrize("keras, mode", [("2.15.0", "dense"), ("3.15.1", "dedup")])
def test_only_keras_3_and_a_check_against_dense_can_carry_the_note(tmp_path, keras, mode):
    check = _check(tmp_path, keras=keras, mode=mode, verification=_verification(0.26))
    assert check["passed"] is False and "note" not in check


def test_a_passing_check_under_keras_3_carries_no_note(tmp_path):
    check = _check(tmp_path, gap=0.0, verification=_verification(0.26))
    assert check["passed"] is True and "note" not in check


def test_the_comparison_hands_its_reduction_check_to_the_parameter_check(tmp_path):
    reference = np.full((4, 2), START - 0.02, np.float32)
    dirs = {(2, "sparse"): _run(tmp_path / "sparse", reference, initial=True),
            (2, "dense"): _run(tmp_path / "dense", reference + np.float32(0.01))}
    summaries = {key: _summary("3.15.1") for key in dirs}
    explained = correctness(dirs, summaries, _verification(0.26))
    assert explained["passed"] is False and len(explained["notes"]) == 1
    assert correctness(dirs, summaries, _verification(3.0))["notes"] == []


def test_the_markdown_report_carries_the_note_with_its_evidence(tmp_path):
    from memdiag.report.markdown import compare_markdown

    check = _check(tmp_path, verification=_verification(0.26))
    result = {"workload": "w", "rows": [], "growth_bytes_per_rank": {},
              "correctness": {"passed": False, "max_abs_diff": check["max_abs_diff"],
                              "max_rel_diff": check["max_rel_diff"], "checks": [check], "notes": [check["note"]]}}
    assert f"- {check['note']}" in compare_markdown(result)
