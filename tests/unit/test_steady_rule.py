"""The steady-state rule on synthetic per-step peaks (MiB): series that grow, settle and oscillate.

Every expected window is worked out by hand from the rule in memdiag/analyze/steady.py's docstring
(at least 3 steps at the end, largest peak within 1% of the smallest, least-squares slope x run steps
within 1% of the smallest)."""

from __future__ import annotations

import pytest

from memdiag.analyze.steady import least_squares_slope, steady_figures, steady_start

MiB = 2**20


def test_the_issues_growing_series_is_not_steady_although_its_first_two_steps_agree_within_one_percent():
    # 1000 -> 1005 is +0.5%: the old rule (two consecutive steps within 1%) called it steady from step 0
    assert steady_start([1000, 1005, 1200, 1400, 1600, 1800]) == (3, False)


@pytest.mark.parametrize("peaks", [
    pytest.param([1000 + 50 * k for k in range(8)], id="linear, +5% a step"),
    # +0.3% a step: any three steps lie within 1% (1015, 1018, 1021), but the trend over the run is +2.1%
    pytest.param([1000 + 3 * k for k in range(8)], id="slow creep over a short run"),
    # +0.05% a step for 100 steps: 20 steps lie within 1%, the run grew 5%
    pytest.param([1000 + k / 2 for k in range(100)], id="slow creep over a long run"),
    pytest.param([1300, 1000, 1000, 1000, 1000, 1100], id="late jump"),
    pytest.param([1000, 1000, 1000, 1000, 1000, 1012], id="late jump just beyond 1%"),
    # a level held for two steps inside a growth in jumps (as measured: 914, 914, 932, 932, 1004)
    pytest.param([914, 914, 932, 932, 1004, 1004], id="growth in jumps"),
])
def test_a_growing_series_is_not_steady(peaks):
    start, settled = steady_start(peaks)
    assert not settled
    assert start == len(peaks) - 3  # figures from the last three steps


def test_a_series_that_settles_after_its_warm_up_is_steady_from_where_its_level_was_reached():
    # step 0 traces (1300), the allocator grows for two steps, then noise of 4 MiB around 1200
    assert steady_start([1300, 1100, 1180, 1200, 1203, 1199, 1202, 1200]) == (3, True)
    # a first step above the level (tracing) is not part of the steady window
    assert steady_start([1300, 1000, 1000, 1000]) == (1, True)
    assert steady_start([1000, 1000, 1000]) == (0, True)


def test_a_rise_within_the_tolerance_over_the_whole_run_is_noise_to_the_rule():
    # +0.4% over five steps: slope 1 MiB a step x 5 steps = 5 MiB, within 1% of 1000 MiB
    assert steady_start([1000, 1001, 1002, 1003, 1004]) == (0, True)


def test_an_oscillation_is_steady_within_the_tolerance_and_not_beyond_it():
    assert steady_start([1000, 1008, 1000, 1008, 1000, 1008, 1000]) == (0, True)
    assert steady_start([1000, 1030, 1000, 1030, 1000, 1030]) == (3, False)


def test_fewer_than_three_steps_are_never_steady():
    assert steady_start([1000, 1000]) == (0, False)
    assert steady_start([500]) == (0, False)
    assert steady_start([]) == (0, False)


def test_the_least_squares_slope_is_per_step():
    assert least_squares_slope([0, 1, 2]) == 1
    assert least_squares_slope([5, 5, 5]) == 0
    assert least_squares_slope([0, 0, 3]) == 1.5
    assert least_squares_slope([7]) == 0


def test_a_growing_rank_is_reported_not_steady_with_its_last_three_steps_figures():
    steps = [{"step": k, "peak_rss_bytes": peak * MiB} for k, peak in enumerate([1000, 1005, 1200, 1400, 1600, 1800])]
    figures = steady_figures(steps, [])
    assert figures["steady"] is False and figures["steady_from_step"] == 3
    assert figures["steady_peak_rss_bytes"] == 1800 * MiB and figures["first_step_peak_rss_bytes"] == 1000 * MiB
