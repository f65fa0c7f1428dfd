"""A parameter check that fails between sparse and dense under Keras 3 names Keras 3's optimizer.

Keras 3.15's Adam applies an IndexedSlices with repeated rows otherwise than their dense sum (measured in
docs/tf-distribute.md), so under Keras 3 sparse and dense runs train apart whatever the reduction. The
check still fails (a difference is a difference); it says why, and only where that reason can hold.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from memdiag.analyze.compare import _parameter_check

TABLE = "0000:transformer/source_embedding/embeddings:0"


def _run(path: Path, table: np.ndarray) -> str:
    path.mkdir()
    np.savez(path / "params.npz", **{TABLE: table})
    return str(path)


def _summary(keras: str) -> dict:
    return {"versions": {"tensorflow": "2.21.0", "keras": keras}, "policy": [], "steps": 2,
            "steps_detail": [{"step": 0, "loss_mean": 5.0}, {"step": 1, "loss_mean": 4.0}]}


@pytest.mark.parametrize("keras, mode, noted", [("3.15.1", "dense", True), ("2.15.0", "dense", False),
                                                 ("3.15.1", "dedup", False)])
def test_only_a_failed_check_against_dense_under_keras_3_names_the_optimizer(tmp_path, keras, mode, noted):
    table = np.full((4, 2), 0.5, np.float32)
    ref = _run(tmp_path / "sparse", table)
    other = _run(tmp_path / mode, table + np.float32(0.01))  # far beyond atol + rtol |a| = 5.1e-5
    check = _parameter_check(2, mode, "sparse", ref, other, _summary(keras), _summary(keras))
    assert check["passed"] is False
    assert ("Keras 3.15.1" in check.get("note", "") and "Adam's second moment" in check["note"]) is noted


def test_a_passing_check_under_keras_3_carries_no_note(tmp_path):
    table = np.full((4, 2), 0.5, np.float32)
    check = _parameter_check(2, "dense", "sparse", _run(tmp_path / "a", table), _run(tmp_path / "b", table),
                             _summary("3.15.1"), _summary("3.15.1"))
    assert check["passed"] is True and "note" not in check
