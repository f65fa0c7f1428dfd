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
