"""One rank's figures in ``summary.json`` (``ranks[]``): its status, steps, peaks, bytes and time per step.

Also memdiag's own cost on the rank (its sampling thread's CPU seconds, the seconds from its start record
to its end record), and a rank's training steps, which the run's figures and the steps table share.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from memdiag.analyze.collective_table import bytes_per_op, collective_log
from memdiag.analyze.live_bytes import LiveStep, live_steps
from memdiag.analyze.steady import steady_figures
from memdiag.format.reader import RankRecords
from memdiag.format.records import StepRecord
from memdiag.format.results import RankSummary


def rank_status(records: RankRecords) -> str:
    if records.killed is not None:
        return "killed"
    if records.end is not None:
        return records.end.get("status", "ok")
    return "died" if records.steps or records.start else "missing"


def training_steps(records: RankRecords) -> list[StepRecord]:
    return [s for s in records.steps if s.get("step", 0) >= 0]


def typical_step_time(steps: Sequence[StepRecord]) -> float | None:
    """Median step time, leaving out step 0 (graph tracing) when later steps exist."""
    times = [s["step_time_s"] for s in steps if s.get("step", 0) >= 1] or [s["step_time_s"] for s in steps]
    return statistics.median(times) if times else None


def rank_summary(records: RankRecords, live: dict[int, LiveStep] | None = None) -> RankSummary:
    """One rank's figures. ``live``: its collective outputs alive at once per step, by the analysis's
    model (:func:`live_steps`); they replace the figure the rank wrote, which counted a name's allgathers
    as one tensor and grouped ones one at a time."""
    steps = training_steps(records)
    if live is None:
        live, _ = live_steps(collective_log(records.collectives))
    if live:
        steps = [s.copy() for s in steps]
        for s in steps:
            found = live.get(s["step"])
            s["collective_live_peak_bytes"] = found.live_bytes if found else 0
            s["collective_added_peak_bytes"] = found.added_bytes if found else 0
            s["collective_live_all_peak_bytes"] = found.all_at_once_bytes if found else 0
    step_ids = {s["step"] for s in steps}
    per_op = bytes_per_op(records.collectives, step_ids)
    n = max(1, len(step_ids))
    peaks = [s["peak_rss_bytes"] for s in records.steps if "peak_rss_bytes" in s]
    if records.killed:
        peaks.append(max(records.killed.get("rss_bytes", 0), records.killed.get("hwm_bytes", 0)))
    end = records.end
    hwms = [s.get("hwm_bytes", 0) for s in records.steps] + [end.get("hwm_bytes", 0) if end else 0]
    # memdiag's own work on the rank (its own_work spans: reading and saving parameters, a step's hooks),
    # cut out of every step's figures: how many, their seconds, the most RSS rose above where one began
    work = [w for w in records.own_work
            if isinstance(w.get("peak_rss_bytes"), int) and isinstance(w.get("rss_before_bytes"), int)]
    return {
        "rank": records.rank,
        "status": rank_status(records),
        "host": records.start.get("host") if records.start else None,
        # the CPUs it could run on (the launcher's binding) and its host's CPUs, from its start record
        "cpus_allowed": records.start.get("cpus_allowed") if records.start else None,
        "cpu_count": records.start.get("cpu_count") if records.start else None,
        "steps_completed": len(steps),
        "last_step": max(step_ids) if step_ids else None,
        "peak_rss_bytes": max(peaks) if peaks else None,
        "hwm_bytes": max(hwms) or None,
        "allgather_bytes_per_step": per_op.get("allgather", 0) // n,
        "allreduce_bytes_per_step": per_op.get("allreduce", 0) // n,
        "collective_bytes_per_step": sum(per_op.values()) // n,
        "step_time_s": typical_step_time(steps),
        **steady_figures(sorted(steps, key=lambda s: s["step"]), records.memory),
        "error": end.get("error") if end else None,
        "killed": records.killed,
        # memdiag's own cost on this rank: its sampling thread's CPU seconds (end record), and the
        # seconds from the rank's start record to its end record
        "sampler_cpu_s": end.get("sampler_cpu_s") if end else None,
        "agent_wall_s": _agent_wall(records),
        # --record-every (0: every step): how much of its records a rank killed outright may have lost
        "record_every_s": float(records.start.get("record_every_s") or 0.0) if records.start else 0.0,
        "marks_file": bool(records.start.get("marks_file")) if records.start else False,
        "own_setup_rss_bytes": records.start.get("own_setup_rss_bytes") if records.start else None,
        "marks_ring_bytes": records.start.get("marks_ring_bytes") if records.start else None,
        "mark_ops": end.get("mark_ops") if end else None,
        "mark_op_heap_bytes": end.get("mark_op_heap_bytes") if end else None,
        "mark_op_resident_bytes": end.get("mark_op_resident_bytes") if end else None,
        "begins_shared": end.get("begins_shared") if end else None,
        "own_work_spans": len(work),
        "own_work_s": sum(max(0.0, w.get("t_end", 0.0) - w.get("t_start", 0.0)) for w in work) if work else None,
        "own_work_rise_bytes": max(max(0, w["peak_rss_bytes"] - w["rss_before_bytes"]) for w in work) if work else None,
        "replayed_steps": next((r.get("steps") for r in records.replayed), None),
    }


def _agent_wall(records: RankRecords) -> float | None:
    start = records.start.get("t") if records.start else None
    end = records.end.get("t") if records.end else None
    return end - start if isinstance(start, (int, float)) and isinstance(end, (int, float)) else None
