"""Steady state and the phase that set a step's peak."""

from __future__ import annotations

from memdiag.agent.tracer import phase_rises, quotient_bytes
from memdiag.analyze.steady import steady_figures, steady_start

MiB = 2**20


def test_the_design_notes_rising_runs_are_not_steady():
    # the design notes' N=1 sparse run kept rising (1080, 1099, 1223 MiB): never steady in 3 steps
    assert steady_start([1080, 1099, 1223]) == (0, False)
    # 1223, 1230, 1228 lie within 1%, but their trend (2.5 MiB a step) over the run's 5 steps is
    # 12.5 MiB, above 1% of 1223 MiB: not steady yet
    assert steady_start([1080, 1099, 1223, 1230, 1228]) == (2, False)
    # one step more at that level: the trend over the last four is 1.3 MiB a step x 6 = 7.8 MiB
    assert steady_start([1080, 1099, 1223, 1230, 1228, 1228]) == (2, True)


def _step(k, peak, start=None, end=None, live=64, added=None):
    return {"step": k, "peak_rss_bytes": peak * MiB, "window_start": start, "window_end": end,
            "collective_live_peak_bytes": live * MiB, "collective_added_peak_bytes": (live if added is None else added) * MiB}


def _mem(step, pairs):
    return {"step": step, "times": [t for t, _ in pairs], "rss": [r * MiB for _, r in pairs]}


MEMORY = [_mem(-1, [(0.0, 500), (0.5, 900)]),
          _mem(0, [(1.0, 1000), (1.6, 1100), (1.9, 1200), (2.5, 1200)]),
          _mem(1, [(3.0, 1205), (3.6, 1205)]), _mem(2, [(5.0, 1206), (5.6, 1206)])]


def _windows(live, added=None):
    return [_step(0, 1200, 1.5, 2.0, live, added), _step(1, 1205, 3.5, 4.0, live, added),
            _step(2, 1206, 5.5, 6.0, live, added)]


def test_gathered_buffers_that_push_rss_past_the_compute_peak_set_it():
    # GIVEN a rank that needed 1000 MiB before its first gradient reduction (t=1.5), whose collective
    # windows (1.5-2.0, 3.5-4.0) then pushed RSS to 1200 MiB, and whose compute added 5 MiB more, with
    # 190 MiB of gathered outputs alive at once
    figures = steady_figures(_windows(190), MEMORY)
    # THEN the steady state starts at step 0 (1200, 1205, 1206 lie within 1%, with a trend of 3 MiB a
    # step x 3 steps, within 1% of 1200 MiB), the first step is apart,
    # and the collectives set the peak: without the 190 MiB they add, it would stand lower
    assert figures["steady"] is True and figures["steady_from_step"] == 0
    assert figures["first_step_peak_rss_bytes"] == 1200 * MiB and figures["steady_peak_rss_bytes"] == 1206 * MiB
    assert figures["compute_peak_rss_bytes"] == 1000 * MiB
    assert figures["collective_rise_bytes"] == 200 * MiB and figures["compute_rise_bytes"] == 6 * MiB
    assert figures["peak_phase"] == "collectives"
    # down to 1% of the rest of the peak: 12 MiB > 1% of 1194 MiB, 11 MiB < 1% of 1195 MiB
    assert steady_figures(_windows(12), MEMORY)["peak_phase"] == "collectives"
    assert steady_figures(_windows(11), MEMORY)["peak_phase"] == "compute"


def test_memory_that_grows_while_collectives_run_but_that_they_do_not_hold_is_computes():
    # GIVEN the same RSS, all of its rise inside the collective windows (a tf.function step whose
    # reductions overlap its backward pass), and 13.5 MiB of allreduce outputs alive at once, each the
    # size of the gradient it replaces: the collectives add nothing
    figures = steady_figures(_windows(13.5, added=0), MEMORY)
    # THEN the time says collectives (+200 MiB in their windows), what is held says compute
    assert figures["collective_rise_bytes"] == 200 * MiB and figures["compute_rise_bytes"] == 6 * MiB
    assert figures["peak_phase"] == "compute" and figures["collective_live_peak_bytes"] == 13.5 * MiB
    assert figures["collective_added_peak_bytes"] == 0


def test_gathered_buffers_that_fit_under_the_compute_peak_leave_it_to_compute():
    # GIVEN 1200 MiB reached before any collective, and windows that reuse that memory (+5 MiB)
    steps = [_step(0, 1205, 1.5, 2.0), _step(1, 1205, 3.5, 4.0)]
    memory = [_mem(0, [(1.0, 1200), (1.6, 1205)]), _mem(1, [(3.0, 1205), (3.6, 1205)])]
    figures = steady_figures(steps, memory)
    assert figures["compute_peak_rss_bytes"] == 1200 * MiB and figures["peak_phase"] == "compute"
    # one rank runs no collective: everything is compute
    assert steady_figures([_step(0, 900), _step(1, 900)], [])["peak_phase"] == "compute"


def test_a_steps_rises_are_counted_in_the_phase_they_happen_in():
    times = [0.0, 0.1, 0.2, 0.3, 0.4]
    rss = [100 * MiB, 300 * MiB, 250 * MiB, 400 * MiB, 120 * MiB]
    result = phase_rises(times, rss, 0.25, 0.35)
    assert result["compute_rise_bytes"] == 200 * MiB and result["collective_rise_bytes"] == 150 * MiB
    assert result["peak_phase"] == "compute"
    assert phase_rises(times, [5] * 5, 0.25, 0.35)["peak_phase"] == "held"


def test_only_averaged_gathered_values_need_a_second_buffer_for_a_moment():
    assert quotient_bytes({"op": "allgather", "part": "values", "reduce_op": "average"}, 100) == 100
    assert quotient_bytes({"op": "allgather", "part": "values", "reduce_op": None}, 100) == 100
    assert quotient_bytes({"op": "allgather", "part": "values", "reduce_op": "sum"}, 100) == 0
    assert quotient_bytes({"op": "allgather", "part": "indices", "reduce_op": "average"}, 100) == 0
    assert quotient_bytes({"op": "allreduce", "part": None, "reduce_op": "average"}, 100) == 0


def test_a_steps_live_collective_bytes_hold_one_gathered_output_and_one_quotient_at_a_time(tmp_path):
    """Two averaged embeddings: Horovod completes their allgathers one after another and frees each
    dividend once its quotient is made, so one tensor's gathered output (the larger) and one quotient
    (the larger) are alive at once; a dense output adds in full."""
    import json

    from memdiag.agent.sampler import MemorySampler
    from memdiag.agent.tracer import Tracer
    from memdiag.format.writer import RecordWriter

    writer = RecordWriter(str(tmp_path / "rank-0.jsonl"), 0)
    tracer = Tracer(writer, MemorySampler(), 0, auto_steps=False)
    tracer.begin_step(0)
    for name, rows in (("a", 300), ("b", 200)):
        for part, shape in (("values", [2 * rows, 16]), ("indices", [2 * rows])):
            meta = {"op": "allgather", "name": name, "part": part, "dtype": "float32" if part == "values" else "int32",
                    "itemsize": 4, "sparse": True, "densified": False, "reduce_op": "average", "gradient": True}
            tracer.collective(meta, [rows, *shape[1:]], shape)
    dense = {"op": "allreduce", "name": "kernel", "dtype": "float32", "itemsize": 4, "sparse": False,
             "densified": False, "reduce_op": "average", "gradient": True}
    tracer.collective(dense, [10, 10], [10, 10])
    tracer.end_step(0)
    writer.close()
    step = next(r for r in map(json.loads, (tmp_path / "rank-0.jsonl").read_text().splitlines())
                if r["type"] == "step")
    gathered_a = 600 * 16 * 4 + 600 * 4  # a's values and indices, the larger tensor (b: 400 rows)
    assert step["collective_live_peak_bytes"] == gathered_a + 600 * 16 * 4 + 10 * 10 * 4  # + a's quotient + dense


def test_a_scripts_tail_is_left_out_of_the_steady_state_and_reported_apart():
    # GIVEN a script whose last step runs on to its end, where it reads its whole table back (+244 MiB)
    steps = [_step(0, 1000), _step(1, 1010), _step(2, 1012), {**_step(3, 1256), "tail": True}]
    figures = steady_figures(steps, [])
    # THEN the steady peak is the training steps' and the tail's peak is apart
    assert figures["steady_peak_rss_bytes"] == 1012 * MiB and figures["steady_from_step"] == 0
    assert figures["tail_peak_rss_bytes"] == 1256 * MiB
    # AND a run of one step, its tail, still has a steady figure (from that step)
    assert steady_figures([{**_step(0, 900), "tail": True}], [])["steady_peak_rss_bytes"] == 900 * MiB
