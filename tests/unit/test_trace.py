"""The Chrome trace-event export: strict structure, Horovod's timeline merged and aligned, tolerant
parsing of a timeline that Horovod never closed."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from memdiag.format.reader import load_run
from memdiag.format.rundir import HOROVOD_TIMELINE, parse_timeline
from memdiag.report.trace import HOROVOD_PID_BASE, chrome_trace, write_chrome_trace
from tests.helpers import memdiag, read_records
from tests.unit.fake_run import make_run

PHASES = {"M", "C", "X", "i", "B", "E"}
METADATA = {"process_name", "process_sort_index", "thread_name", "thread_sort_index"}


def validate(trace: dict) -> list[dict]:
    """Every rule of the trace-event format that the export relies on, checked event by event."""
    assert set(trace) >= {"traceEvents"} and isinstance(trace["traceEvents"], list)
    events = trace["traceEvents"]
    open_spans: dict[tuple, list[dict]] = defaultdict(list)
    for e in events:
        assert e["ph"] in PHASES, e
        assert isinstance(e["name"], str) and e["name"], e
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int), e
        assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0, e
        if e["ph"] == "M":
            assert e["name"] in METADATA and isinstance(e["args"], dict), e
        elif e["ph"] == "X":
            assert isinstance(e["dur"], (int, float)) and e["dur"] >= 0, e
        elif e["ph"] == "C":
            assert e["args"] and all(isinstance(v, (int, float)) for v in e["args"].values()), e
        elif e["ph"] == "i":
            assert e["s"] in ("g", "p", "t"), e
        elif e["ph"] == "B":
            open_spans[(e["pid"], e["tid"])].append(e)
        elif e["ph"] == "E":
            begin = open_spans[(e["pid"], e["tid"])].pop()
            assert begin["name"] == e["name"] and begin["ts"] <= e["ts"], (begin, e)
    return events


def process_names(events: list[dict]) -> dict[int, str]:
    names = [e for e in events if e["ph"] == "M" and e["name"] == "process_name"]
    assert len({e["pid"] for e in names}) == len(names), "one name per process"
    return {e["pid"]: e["args"]["name"] for e in names}


# Horovod's timeline as Horovod 0.28 writes it: events relative to a start time, end events without
# names, and (the job having been cut off) no closing bracket and half an event at the end.
TIMELINE = (
    '[\n'
    '{"name": "process_name", "ph": "M", "pid": 0, "args": {"start_time_since_epoch_in_micros":%d}},\n'
    '{"name": "process_sort_index", "ph": "M", "pid": 0, "args": {"sort_index": 0}},\n'
    '{"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "HorovodAllgather_emb_0"}},\n'
    '{"name": "process_sort_index", "ph": "M", "pid": 1, "args": {"sort_index": 1}},\n'
    '{"ph": "B", "name": "NEGOTIATE_ALLGATHER", "ts": 1000, "pid": 1},{"ph": "E", "ts": 1500, "pid": 1},'
    '{"ph": "B", "name": "ALLGATHER", "ts": 1600, "pid": 1},{"ph": "B", "name": "MPI_ALLGATHER", "ts": 1700, "pid": 1},'
    '{"ph": "E", "ts": 2500, "pid": 1},{"ph": "E", "ts": 2600, "pid": 1, "args": {"dtype": "float32", '
    '"shape": "[512, 32]"}},{"ph": "X", "name": "1", "ts": 2700, "pid": 1, "dur": 0},\n'
    '{"ph": "B", "name": "NEGOTIATE_ALL'
)
START_US = 1_796_040_338_600_377


def timeline_for(run_dir: Path) -> tuple[str, int]:
    """The timeline text with Horovod's clock started 2 ms before rank 0's start record."""
    start = json.loads((run_dir / "rank-0.jsonl").read_text().splitlines()[0])["t"]
    start_us = int(start * 1e6) - 2000
    return TIMELINE % start_us, start_us


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return make_run(tmp_path / "run", world_size=3, steps=3)


def test_trace_of_a_run_is_valid_with_one_process_per_rank(run_dir):
    trace, notes = chrome_trace(load_run(str(run_dir)))
    events = validate(json.loads(json.dumps(trace)))
    assert notes == []
    assert process_names(events) == {1: "rank 0", 2: "rank 1", 3: "rank 2"}
    kinds = Counter((e["pid"], e["ph"]) for e in events)
    for pid in (1, 2, 3):
        # three steps; a counter event per RSS sample of the rank's records (the timer's, and the collectives')
        samples = sum(len(r["times"]) for r in read_records(run_dir / f"rank-{pid - 1}.jsonl")
                      if r["type"] == "mem" and "times" in r)
        assert kinds[(pid, "X")] == 3 and kinds[(pid, "C")] == samples >= 3
        # two allgathers (values, indices) and one allreduce per step, and the rank's start and end
        assert kinds[(pid, "i")] == 3 * 3 + 2
    assert {e["name"] for e in events if e["ph"] == "C"} == {"RSS"}
    assert min(e["ts"] for e in events if e["ph"] != "M") == 0  # microseconds from the first event


def test_collectives_carry_op_tensor_bytes_and_reduction(run_dir):
    trace, _ = chrome_trace(load_run(str(run_dir)))
    gathers = [e for e in trace["traceEvents"] if e.get("cat") == "collective" and e["args"]["op"] == "allgather"
               and e["args"]["part"] == "values" and e["pid"] == 1]
    assert len(gathers) == 3
    args = gathers[0]["args"]
    assert args["tensor"] == "m/emb:0" and args["sparse"] is True and args["densified"] is False
    assert args["bytes_in"] == 256 * 32 * 4 and args["bytes_out"] == 3 * 256 * 32 * 4
    assert gathers[0]["name"] == "allgather emb [values]"


def test_steps_are_spans_from_their_records(run_dir):
    run = load_run(str(run_dir))
    trace, _ = chrome_trace(run)
    origin = trace["otherData"]["clock_origin_unix_s"]
    step = next(s for s in run.ranks[1].steps if s["step"] == 2)
    span = next(e for e in trace["traceEvents"] if e["ph"] == "X" and e["pid"] == 2 and e["name"] == "step 2")
    assert span["ts"] == pytest.approx((step["t_start"] - origin) * 1e6, abs=1)
    assert span["dur"] == pytest.approx((step["t_end"] - step["t_start"]) * 1e6, abs=1)


def test_horovod_timeline_is_parsed_tolerantly():
    text = TIMELINE % START_US
    timeline = parse_timeline(text)
    assert not timeline.complete and timeline.start_us == START_US
    assert len(timeline.events) == 11  # the half-written last event is dropped
    closed = parse_timeline(text[:text.rindex(",\n")] + "]")
    assert closed.complete and len(closed.events) == 11
    assert parse_timeline("").events == [] and parse_timeline("garbage").events == []
    assert parse_timeline("[").events == [] and not parse_timeline("[").complete


def test_horovod_timeline_is_merged_under_its_own_processes_on_the_runs_clock(run_dir):
    text, start_us = timeline_for(run_dir)
    (run_dir / HOROVOD_TIMELINE).write_text(text)
    run = load_run(str(run_dir))
    summary = write_chrome_trace(run)
    assert summary.path == str(run_dir / "trace.json") and summary.horovod_events > 0
    assert any("closing bracket" in n for n in summary.notes)
    trace = json.loads((run_dir / "trace.json").read_text())
    events = validate(trace)
    names = process_names(events)
    assert names[HOROVOD_PID_BASE] == "horovod timeline (rank 0)"
    assert names[HOROVOD_PID_BASE + 1] == "horovod: HorovodAllgather_emb_0"
    assert [v for k, v in sorted(names.items()) if k < HOROVOD_PID_BASE] == ["rank 0", "rank 1", "rank 2"]
    origin_us = trace["otherData"]["clock_origin_unix_s"] * 1e6
    gather = [e for e in events if e["pid"] == HOROVOD_PID_BASE + 1 and e["name"] == "ALLGATHER"]
    assert [e["ph"] for e in gather] == ["B", "E"]
    assert gather[0]["ts"] == pytest.approx(start_us + 1600 - origin_us, abs=1)
    assert gather[1]["args"] == {"dtype": "float32", "shape": "[512, 32]"}


def test_horovod_timeline_without_start_time_is_aligned_to_rank_0_start(run_dir):
    text = TIMELINE.replace('"args": {"start_time_since_epoch_in_micros":%d}', '"args": {}')
    (run_dir / HOROVOD_TIMELINE).write_text(text)
    run = load_run(str(run_dir))
    trace, notes = chrome_trace(run, parse_timeline(text))
    validate(trace)
    assert any("no start time" in n for n in notes)
    origin = trace["otherData"]["clock_origin_unix_s"]
    first = min(e["ts"] for e in trace["traceEvents"] if e["pid"] >= HOROVOD_PID_BASE and e["ph"] != "M")
    assert first == pytest.approx((run.ranks[0].start["t"] - origin) * 1e6, abs=1)


def test_cli_writes_the_trace_where_asked(run_dir, tmp_path):
    result = memdiag("report", str(run_dir), "--format", "chrome")
    assert result.returncode == 0, result.stderr
    assert "wrote" in result.stdout and (run_dir / "trace.json").exists()
    validate(json.loads((run_dir / "trace.json").read_text()))
    elsewhere = tmp_path / "t.json"
    result = memdiag("report", str(run_dir), "--format", "chrome", "--output", str(elsewhere))
    assert result.returncode == 0 and elsewhere.exists()
    result = memdiag("report", str(run_dir), "--output", str(elsewhere))
    assert result.returncode == 2 and "--format chrome" in result.stderr
