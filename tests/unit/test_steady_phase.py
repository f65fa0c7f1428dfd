"""Steady state and the phase that set a step's peak."""

from __future__ import annotations

from memdiag.agent.tracer import live_copies, phase_peaks
from memdiag.analyze.steady import steady_figures, steady_start

MiB = 2**20


def test_the_steady_state_begins_where_two_consecutive_peaks_agree_within_one_percent():
    # the design notes' N=1 sparse run kept rising (1080, 1099, 1223 MiB): never steady in 3 steps
    assert steady_start([1080, 1099, 1223]) == (1, False)
    # 1223 -> 1230 is +0.6%: steady from the step that reached 1223
    assert steady_start([1080, 1099, 1223, 1230, 1228]) == (2, True)
    assert steady_start([500]) == (0, False)


def test_steady_figures_leave_the_first_step_apart():
    steps = [{"step": k, "peak_rss_bytes": p * MiB, "compute_peak_rss_bytes": c * MiB,
              "collective_peak_rss_bytes": g * MiB, "peak_phase": ph, "collective_live_peak_bytes": 64 * MiB}
             for k, (p, c, g, ph) in enumerate([(1400, 1400, 900, "compute"), (1000, 1000, 990, "compute"),
                                                (1005, 900, 1005, "collectives"), (1004, 950, 1004, "collectives")])]
    figures = steady_figures(steps)
    assert figures["steady"] is True and figures["steady_from_step"] == 1
    assert figures["first_step_peak_rss_bytes"] == 1400 * MiB
    assert figures["steady_peak_rss_bytes"] == 1005 * MiB and figures["peak_phase"] == "collectives"
    assert figures["compute_peak_rss_bytes"] == 1000 * MiB and figures["collective_peak_rss_bytes"] == 1005 * MiB


def test_a_peak_inside_the_collective_window_is_the_collectives():
    times = [0.0, 0.1, 0.2, 0.3, 0.4]
    rss = [100, 300, 250, 400, 120]
    # window from 0.25 to 0.35 holds the 400 sample
    result = phase_peaks(times, rss, 0.25, 0.35, peak=400)
    assert result == {"compute_peak_rss_bytes": 300, "collective_peak_rss_bytes": 400, "peak_phase": "collectives"}
    # without a window (no collective in the step) everything is compute
    assert phase_peaks(times, rss, None, None, peak=410)["compute_peak_rss_bytes"] == 410
    # a high-water mark between samples goes to the phase whose samples came closer
    assert phase_peaks(times, rss, 0.05, 0.15, peak=420) == {
        "compute_peak_rss_bytes": 420, "collective_peak_rss_bytes": 300, "peak_phase": "compute"}


def test_averaged_gathered_values_are_held_twice_and_everything_else_once():
    assert live_copies({"op": "allgather", "part": "values", "reduce_op": "average"}) == 2
    assert live_copies({"op": "allgather", "part": "values", "reduce_op": "sum"}) == 1
    assert live_copies({"op": "allgather", "part": "indices", "reduce_op": "average"}) == 1
    assert live_copies({"op": "allreduce", "part": None, "reduce_op": "average"}) == 1
