"""A run as Chrome trace-event JSON, for Perfetto (ui.perfetto.dev) and chrome://tracing.

One process per rank ("rank K", pid K + 1) with a counter track "RSS" from the memory samples, a
thread of step spans and a thread of collectives. memdiag records a collective when it completes and
knows nothing of when it started, so each collective is an instant event at its completion time
(ph "i") rather than a span that would claim a start it does not know. Horovod's own timeline,
when the run has one, is merged in under its own processes (one per tensor, as Horovod draws it).

All timestamps are microseconds since the earliest event of the run (``otherData`` holds that
origin as Unix time). memdiag's records and Horovod's timeline both use the wall clock: Horovod's
``ts`` counts from ``start_time_since_epoch_in_micros``, which its first metadata event carries.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from memdiag._errors import UserError
from memdiag.format.reader import Run, mem_points
from memdiag.format.records import SETUP_STEP
from memdiag.format.rundir import HOROVOD_TIMELINE, Timeline, read_timeline, write_json
from memdiag.report.reporter import Refusing, RunResult, StudyResult
from memdiag.report.terminal import common_scope, short_name

HOROVOD_PID_BASE = 100_000  # Horovod's own pids start here, clear of the ranks' pids
STEPS_TID, COLLECTIVES_TID = 1, 2
DEFAULT_TRACE = "trace.json"


def _us(seconds: float, origin: float) -> float:
    return round((seconds - origin) * 1e6, 3)


def _origin(run: Run) -> float | None:
    times: list[float] = []
    for records in run.ranks.values():
        for m in records.memory:
            times.extend(t for t, _ in mem_points(m)[:1])
        times.extend(s["t_start"] for s in records.steps if "t_start" in s)
        times.extend(c["t"] for c in records.collectives if "t" in c)
        times.extend(r["t"] for r in (records.start, records.end) if r and "t" in r)
    return min(times) if times else None


def _meta(pid: int, name: str, args: dict[str, Any], tid: int = 0) -> dict[str, Any]:
    return {"ph": "M", "name": name, "pid": pid, "tid": tid, "ts": 0, "args": args}


def _rank_events(rank: int, records: Any, origin: float, scope: str) -> list[dict[str, Any]]:
    pid = rank + 1
    events = [
        _meta(pid, "process_name", {"name": f"rank {rank}"}),
        _meta(pid, "process_sort_index", {"sort_index": rank}),
        _meta(pid, "thread_name", {"name": "steps"}, STEPS_TID),
        _meta(pid, "thread_name", {"name": "collectives (at completion)"}, COLLECTIVES_TID),
    ]
    for record, name in ((records.start, "started (after hvd.init)"), (records.end, "ended")):
        if record and "t" in record:
            args = {k: record[k] for k in ("host", "pid", "size", "status") if k in record}
            events.append({"ph": "i", "s": "p", "name": name if "status" not in args else f"{name}: {args['status']}",
                           "cat": "rank", "pid": pid, "tid": STEPS_TID, "ts": _us(record["t"], origin), "args": args})
    for m in records.memory:  # the samples a step kept, or its first, largest and last
        for t, rss in mem_points(m):
            events.append({"ph": "C", "name": "RSS", "pid": pid, "tid": 0, "ts": _us(t, origin),
                           "args": {"bytes": rss}})
    for s in records.steps:
        if "t_start" not in s or "t_end" not in s:
            continue
        step = s.get("step")
        args = {k: s[k] for k in ("step", "step_time_s", "peak_rss_bytes", "hwm_bytes", "loss", "items") if k in s}
        events.append({"ph": "X", "name": "set-up" if step == SETUP_STEP else f"step {step}", "cat": "step",
                       "pid": pid, "tid": STEPS_TID, "ts": _us(s["t_start"], origin),
                       "dur": round(max(0.0, s["t_end"] - s["t_start"]) * 1e6, 3), "args": args})
    for c in records.collectives:
        if "t" not in c:
            continue
        tensor = short_name(c.get("name", "?"), scope)
        part = f" [{c['part']}]" if c.get("part") else ""
        events.append({
            "ph": "i", "s": "t", "name": f"{c.get('op')} {tensor}{part}", "cat": "collective",
            "pid": pid, "tid": COLLECTIVES_TID, "ts": _us(c["t"], origin),
            "args": {"op": c.get("op"), "tensor": c.get("name"), "part": c.get("part"), "step": c.get("step"),
                     "dtype": c.get("dtype"), "shape_in": c.get("shape_in"), "shape_out": c.get("shape_out"),
                     "bytes_in": c.get("bytes_in"), "bytes_out": c.get("bytes_out"),
                     "sparse": bool(c.get("sparse")), "densified": bool(c.get("densified"))},
        })
    return events


def _horovod_events(timeline: Timeline, offset_us: float) -> list[dict[str, Any]]:
    """Horovod's events on the run's clock, each with ph, ts, pid, tid and name (Horovod leaves the
    name off its end events and the ts off its metadata: both are filled in)."""
    events: list[dict[str, Any]] = []
    open_spans: dict[tuple[int, int], list[str]] = {}
    for raw in timeline.events:
        ph, pid = raw.get("ph"), raw.get("pid")
        if not isinstance(ph, str) or not isinstance(pid, int):
            continue
        event = dict(raw)
        event["pid"] = HOROVOD_PID_BASE + pid
        event["tid"] = raw.get("tid", 0) if isinstance(raw.get("tid"), int) else 0
        if ph == "M":
            event["ts"] = 0
            args = dict(raw.get("args") or {})
            if raw.get("name") == "process_name":
                label = args.get("name")
                args["name"] = f"horovod: {label}" if label else "horovod timeline (rank 0)"
            elif raw.get("name") == "process_sort_index":
                args["sort_index"] = HOROVOD_PID_BASE + int(args.get("sort_index", pid))
            event["args"] = args
            event.setdefault("name", "metadata")
            events.append(event)
            continue
        if not isinstance(raw.get("ts"), (int, float)):
            continue
        event["ts"] = round(raw["ts"] + offset_us, 3)
        stack = open_spans.setdefault((event["pid"], event["tid"]), [])
        if ph == "B":
            stack.append(str(raw.get("name", "?")))
        elif ph == "E":
            event.setdefault("name", stack.pop() if stack else "?")
        event.setdefault("name", "?")
        events.append(event)
    return events


@dataclass(frozen=True)
class TraceSummary:
    path: str
    events: int
    ranks: int
    horovod_events: int
    notes: tuple[str, ...]


def chrome_trace(run: Run, timeline: Timeline | None = None) -> tuple[dict[str, Any], list[str]]:
    """The trace of ``run`` (and of Horovod's ``timeline``) and notes on what could not be placed."""
    notes: list[str] = []
    origins = [_origin(run)]
    if timeline is not None and timeline.start_us is not None:
        first = min((e["ts"] for e in timeline.events if isinstance(e.get("ts"), (int, float))), default=0)
        origins.append((timeline.start_us + first) / 1e6)
    origin = min((o for o in origins if o is not None), default=0.0)
    names = [c.get("name", "") for r in run.ranks.values() for c in r.collectives]
    scope = common_scope(names) if names else ""
    events: list[dict[str, Any]] = []
    for rank in sorted(run.ranks):
        events.extend(_rank_events(rank, run.ranks[rank], origin, scope))
    if timeline is not None and timeline.events:
        if timeline.start_us is not None:
            offset = timeline.start_us - origin * 1e6
        else:  # no start time in the file: Horovod's clock starts at hvd.init(), just before rank 0's start record
            rank0 = run.ranks[0].start if 0 in run.ranks else None
            start = rank0.get("t", origin) if rank0 else origin
            first = min((e["ts"] for e in timeline.events if isinstance(e.get("ts"), (int, float))), default=0)
            offset = (start - origin) * 1e6 - first
            notes.append("Horovod's timeline has no start time: aligned its first event with rank 0's start")
        if not timeline.complete:
            notes.append(f"{HOROVOD_TIMELINE} ends without its closing bracket (Horovod writes it as it goes): "
                         f"read its {len(timeline.events)} complete events")
        events.extend(_horovod_events(timeline, offset))
    trace = {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"memdiag_run": os.path.abspath(run.path), "clock_origin_unix_s": origin,
                      "collectives": "instant events at their completion time"},
    }
    return trace, notes


def write_chrome_trace(run: Run, path: str | None = None) -> TraceSummary:
    """Write the run's trace (default RUN_DIR/trace.json), with Horovod's timeline if present."""
    path = path or os.path.join(run.path, DEFAULT_TRACE)
    timeline = read_timeline(os.path.join(run.path, HOROVOD_TIMELINE))
    trace, notes = chrome_trace(run, timeline)
    write_json(path, trace, indent=None)
    horovod = sum(1 for e in trace["traceEvents"] if e["pid"] >= HOROVOD_PID_BASE)
    return TraceSummary(path, len(trace["traceEvents"]), len(run.ranks), horovod, tuple(notes))


class ChromeReporter(Refusing):
    name = "chrome"
    output_help = "the trace file (default DIR/trace.json)"

    def run(self, result: RunResult, output: str | None) -> None:
        trace = write_chrome_trace(result.run, output)
        print(f"wrote {trace.path}: {trace.events} events, {trace.ranks} ranks"
              + (f", {trace.horovod_events} from Horovod's timeline" if trace.horovod_events else "")
              + " (open it in ui.perfetto.dev or chrome://tracing)")
        for note in trace.notes:
            print(f"note: {note}")

    def study(self, result: StudyResult, output: str | None) -> None:
        raise UserError(f"--format chrome traces one run: give a run directory inside {result.path}")
