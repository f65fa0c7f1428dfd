"""A terminated rank names the step no record covers yet, and no step ends after it is frozen."""

import json
import threading

from memdiag.agent.sampler import MemorySampler
from memdiag.agent.tracer import Tracer
from memdiag.format.writer import RecordWriter


def _tracer(tmp_path):
    writer = RecordWriter(str(tmp_path / "rank-0.jsonl"), 0)
    return writer, Tracer(writer, MemorySampler(), 0, auto_steps=False)


def _steps(path):
    return [r["step"] for r in map(json.loads, path.read_text().splitlines()) if r["type"] == "step"]


def test_frozen_inside_a_step_names_that_step(tmp_path):
    writer, tracer = _tracer(tmp_path)
    tracer.begin_step(0)
    tracer.end_step(0)
    tracer.begin_step(1)
    step, in_flight = tracer.freeze()
    assert (step, in_flight) == (1, None)


def test_frozen_between_two_steps_names_the_next_one_since_the_last_has_its_record(tmp_path):
    # GIVEN a tracer whose step 4 ended and whose step 5 has not begun (the main thread in between)
    writer, tracer = _tracer(tmp_path)
    for step in range(5):
        tracer.begin_step(step)
        tracer.end_step(step)
    # WHEN it is frozen
    step, _ = tracer.freeze()
    # THEN it names step 5, and every step before it has a record
    assert step == 5 and _steps(tmp_path / "rank-0.jsonl") == [0, 1, 2, 3, 4]


def test_frozen_before_the_first_step_names_the_set_up(tmp_path):
    _, tracer = _tracer(tmp_path)
    assert tracer.freeze()[0] < 0


def test_no_step_ends_once_frozen(tmp_path):
    # GIVEN a tracer frozen by one thread inside step 0
    writer, tracer = _tracer(tmp_path)
    tracer.begin_step(0)
    tracer.freeze()
    # WHEN another thread (the script's) ends that step
    ender = threading.Thread(target=tracer.end_step, args=(0,), daemon=True)
    ender.start()
    ender.join(timeout=1.0)
    # THEN it is still waiting, and step 0 has no record
    assert ender.is_alive()
    writer.flush()
    assert _steps(tmp_path / "rank-0.jsonl") == []
