"""A distinct_rows record counts toward the step whose time span holds it: its own stamp can lag, since
it counts inside the graph before the step's collectives mark the step (Keras fit, TF1 sessions)."""

from __future__ import annotations

from types import SimpleNamespace

from memdiag.analyze.rows import _step_of_time


def test_a_count_is_placed_in_the_step_whose_span_holds_it_and_its_stamp_kept_outside_every_span():
    # GIVEN a rank's steps -1 (set-up, to t=10.0), 0 (10.0-11.0), 1 (11.0-12.5)
    records = SimpleNamespace(steps=[{"step": -1, "t_start": 5.0, "t_end": 10.0},
                                     {"step": 0, "t_start": 10.0, "t_end": 11.0},
                                     {"step": 1, "t_start": 11.0, "t_end": 12.5}])
    when = _step_of_time(records)
    # THEN counts stamped -1, -1, 0 written at 10.0002, 11.0001 and 12.4 are steps 0, 1 and 1
    assert [when(t, stamped) for t, stamped in ((10.0002, -1), (11.0001, -1), (12.4, 0))] == [0, 1, 1]
    # AND a count after the last step, or without a time, keeps its stamp
    assert when(13.0, 2) == 2 and when(None, 0) == 0
    # AND a rank whose steps give no times changes nothing
    assert _step_of_time(SimpleNamespace(steps=[{"step": 0}]))(10.5, -1) == -1
