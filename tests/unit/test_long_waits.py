"""A collective not completed 2 s after it started is a hang in the making: one ``waiting`` record at a
time, the largest overdue, so that a step whose reductions complete together (one end mark for a graph's
conds) leaves one record and a hang's report still reads the collective it hangs in."""

import json
import time

from memdiag.agent.sampler import MemorySampler
from memdiag.agent.tracer import Tracer
from memdiag.format.writer import RecordWriter


def _meta(name: str) -> dict:
    return {"op": "allreduce", "name": name, "part": None, "dtype": "float32", "itemsize": 4, "sparse": False,
            "densified": False, "merged": False, "grouped": False, "gradient": True, "reduce_op": "average",
            "process_set_size": None}


def _waits(writer: RecordWriter, path) -> list[tuple[int, str]]:
    writer.flush()
    return [(r["step"], r["name"]) for r in map(json.loads, path.read_text().splitlines()) if r["type"] == "waiting"]


def test_one_wait_at_a_time_the_largest_overdue_then_the_next_once_it_completes(tmp_path):
    # GIVEN a step with three all-reduces begun 3 s ago (a graph's, which complete together) and one just now
    path = tmp_path / "rank-0.jsonl"
    writer = RecordWriter(str(path), 0)
    tracer = Tracer(writer, MemorySampler(), 0, auto_steps=False)
    tracer.begin_step(0)
    long_ago = time.time() - 3.0
    for name, size in (("small", 64), ("large", 4096), ("middle", 512)):
        tracer.begin_collective(_meta(name), size, in_graph=True, t=long_ago)
    tracer.begin_collective(_meta("recent"), 1 << 20, in_graph=True)
    # WHEN the sampler's tick looks for long waits, several times
    for _ in range(3):
        tracer.report_long_wait()
    # THEN one record: the overdue collective receiving the most bytes (the recent one is not overdue)
    assert _waits(writer, path) == [(0, "large")]
    # AND once it completes, the next tick records the largest still overdue, and only it
    tracer.collective(_meta("large"), [1024], [1024])
    tracer.report_long_wait()
    tracer.report_long_wait()
    assert _waits(writer, path) == [(0, "large"), (0, "middle")]
    # AND when the whole group completes together, nothing more is recorded
    for name in ("middle", "small", "recent"):
        tracer.collective(_meta(name), [16], [16])
    tracer.report_long_wait()
    assert _waits(writer, path) == [(0, "large"), (0, "middle")]


def test_a_collective_abandoned_while_overdue_is_recorded_again_when_it_is_overdue_again(tmp_path):
    # GIVEN an overdue collective, recorded as a wait, that Horovod then refused (abandoned, never run)
    path = tmp_path / "rank-0.jsonl"
    writer = RecordWriter(str(path), 0)
    tracer = Tracer(writer, MemorySampler(), 0, auto_steps=False)
    tracer.begin_step(0)
    tracer.begin_collective(_meta("grad"), 64, in_graph=True, t=time.time() - 3.0)
    tracer.report_long_wait()
    tracer.abandon_collective("allreduce", "grad")
    # WHEN the same collective starts again and is overdue again
    tracer.begin_collective(_meta("grad"), 64, in_graph=True, t=time.time() - 3.0)
    tracer.report_long_wait()
    # THEN it is recorded again: the hang's report must find it
    assert _waits(writer, path) == [(0, "grad"), (0, "grad")]
