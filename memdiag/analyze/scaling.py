"""How a workload scales across rank counts: the measured side of ``memdiag scale``.

A scaling study's figures (throughput, speedup, efficiency, memory, bytes, time in collectives) are
read back from its run directories, so ``memdiag scale --from DIR`` redoes the analysis and the
projection without running anything again. Running the study is :mod:`memdiag.launch.studies`.
"""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass
from typing import Any

import numpy as np

from memdiag._errors import UserError
from memdiag.analyze import projection as model
from memdiag.format import rundir
from memdiag.format.manifest import RunManifest, read_manifest
from memdiag.format.reader import read_rank_file
from memdiag.format.records import SETUP_STEP
from memdiag.format.results import RunSummary, ScaleResult, ScaleRow, Study
from memdiag.hosts import ranks_per_host

COLLECTIVE_TIME_METHOD = (
    "in coll.: from rank 0's Horovod timeline, the union of the intervals in which a collective was "
    "executing (negotiation, i.e. waiting for the other ranks, left out) within each step, and its share "
    "of rank 0's step; medians over the steps after the first. It can overlap backward-pass compute, so "
    "it is not all exposed time"
)


@dataclass(frozen=True)
class ProjectionRequest:
    rank_counts: list[int]
    network: model.Network
    fusion_bytes: int = model.DEFAULT_FUSION_BYTES
    compute_s: float | None = None  # replaces the measured compute time per step
    items_per_rank: float | None = None  # project at this per-rank batch instead of the measured one


def analyze_dir(path: str, projection: ProjectionRequest | None) -> ScaleResult:
    """Redo the analysis (and the projection) of a scale directory, or of one run directory."""
    scale_file = os.path.join(path, rundir.SCALE_FILE)
    if os.path.isfile(scale_file):
        saved = rundir.read_json(scale_file)
        run_dirs = {row["world_size"]: os.path.join(path, row["run_dir"]) for row in saved["rows"]}
        return build_result(saved["study"], run_dirs, projection)
    if os.path.isfile(os.path.join(path, rundir.SUMMARY)) and os.path.isfile(os.path.join(path, rundir.RUN_MANIFEST)):
        summary = rundir.read_summary(path)
        study: Study = {"workload": summary["workload"] or os.path.basename(os.path.normpath(path)),
                        "preset": summary["preset"], "scaling": None, "mode": summary["mode"],
                        "steps": summary["steps"] or 0, "rank_counts": [summary["world_size"]],
                        "hosts": read_manifest(path).get("hosts"),
                        "overrides": {}, "batch_overrides": {}}
        return build_result(study, {summary["world_size"]: path}, projection)
    raise UserError(f"--from {path}: no {rundir.SCALE_FILE} or run summary there; give a directory written by "
                    "`memdiag scale` or `memdiag run`")


# -- the analysis -----------------------------------------------------------------------------------

def build_result(study: Study, run_dirs: dict[int, str], projection: ProjectionRequest | None) -> ScaleResult:
    rows = [measured_row(rundir.read_summary(d), read_manifest(d), d)
            for _, d in sorted(run_dirs.items())]
    add_ratios(rows)
    experiment, warnings = study_warnings(rows)
    if study["scaling"] == "strong":
        totals = {row["items_per_rank"] * row["world_size"] for row in rows if row["items_per_rank"]}
        if len(totals) > 1:
            warnings.append(f"the global batch differs between rank counts ({', '.join(f'{t:g}' for t in sorted(totals))} "
                            "items), because it does not divide evenly by every N")
    for row in rows:
        if row["status"] != "ok":
            # What `memdiag run` reports of the same run (analyze/failure.py): a kill names rank, step and limit.
            why = f": {row['failure']['headline']}" if row["failure"] else ""
            warnings.append(f"the run on {row['world_size']} rank(s) ended with status {row['status']}{why}; "
                            f"see {row['run_dir']}/{rundir.MPIRUN_LOG}")
        if row["collective_time_s"] is None and row["world_size"] > 1:
            warnings.append(f"N={row['world_size']}: no Horovod timeline, so the time in collectives is unknown")
    result: ScaleResult = {
        "study": study,
        "rows": rows,
        "scaling_experiment": experiment,
        "warnings": warnings,
        "collective_time_method": COLLECTIVE_TIME_METHOD,
        "projection": None,
        "projection_error": None,
    }
    if projection is not None:
        # The measured rows are kept whatever happens to the projection (e.g. every run failed).
        try:
            result["projection"] = project_from(rows, run_dirs, study["workload"], projection)
        except UserError as exc:
            result["projection_error"] = str(exc)
    return result


def measured_row(summary: RunSummary, manifest: RunManifest, run_dir: str) -> ScaleRow:
    """One rank count: what the table shows, all per rank and per step, maxima over ranks."""
    ranks = summary["ranks"]
    step_times = [r["step_time_s"] for r in ranks if r["step_time_s"] is not None]
    timings = rank0_step_timings(run_dir)
    items = [t["items"] for t in timings if t["items"] is not None]
    busy = [t["collective_s"] for t in timings if t["collective_s"] is not None]
    fractions = [t["collective_s"] / t["step_s"] for t in timings if t["collective_s"] is not None and t["step_s"] > 0]
    # Without a timeline all of the step counts as compute: the projection then adds communication twice.
    compute = [t["step_s"] - (t["collective_s"] or 0.0) for t in timings]
    n = summary["world_size"]
    cores = manifest.get("cores_per_host") or 1
    # As mpirun placed the ranks: the slots of --hosts filled in order, not the ranks spread evenly.
    per_host = ranks_per_host(n, manifest.get("hosts"))
    return {
        "world_size": n,
        "status": summary["status"],
        "failure": summary.get("failure"),
        "items_per_rank": statistics.median(items) if items else None,
        "step_time_s": max(step_times) if step_times else None,
        "throughput": summary.get("throughput_items_per_s"),
        "speedup": None,
        "efficiency": None,
        "peak_rss_bytes_max": summary.get("peak_rss_bytes_max"),
        "collective_bytes_per_rank": max((r["collective_bytes_per_step"] for r in ranks), default=0),
        "allgather_bytes_per_rank": max((r["allgather_bytes_per_step"] for r in ranks), default=0),
        "allreduce_bytes_per_rank": max((r["allreduce_bytes_per_step"] for r in ranks), default=0),
        "collective_time_s": statistics.median(busy) if busy else None,
        "collective_time_fraction": statistics.median(fractions) if fractions else None,
        "compute_time_s": statistics.median(compute) if compute else None,
        "ranks_per_host": per_host,
        "cores_per_host": cores,
        "cores_per_rank": max(1, cores // per_host),
        "oversubscribed": bool(manifest.get("oversubscribed")) or per_host > cores,
        "run_dir": os.path.basename(os.path.normpath(run_dir)),
    }


def add_ratios(rows: list[ScaleRow]) -> None:
    """Speedup and efficiency against the smallest rank count that produced a throughput."""
    measured = [(r, throughput) for r in rows if (throughput := r["throughput"])]
    if not measured:
        return
    base, base_throughput = min(measured, key=lambda found: found[0]["world_size"])
    for row, throughput in measured:
        row["speedup"] = model.speedup(throughput, base_throughput)
        row["efficiency"] = model.scaling_efficiency(throughput, row["world_size"], base_throughput, base["world_size"])


def study_warnings(rows: list[ScaleRow]) -> tuple[bool, list[str]]:
    """Whether the study measured scaling at all: every rank must have had the same cores at every N."""
    warnings = []
    crowded = [r for r in rows if r["oversubscribed"]]
    cores_per_rank = {r["cores_per_rank"] for r in rows}
    if crowded or len(cores_per_rank) > 1:
        reasons = [f"N={r['world_size']} put {r['ranks_per_host']} ranks on a host with {r['cores_per_host']} cores "
                   "(oversubscribed)" for r in crowded]
        if len(cores_per_rank) > 1:
            reasons.append("cores per rank went " + ", ".join(f"{r['cores_per_rank']} at N={r['world_size']}"
                                                             for r in rows))
        warnings.append("NOT a scaling experiment: ranks shared the cores of one host (" + "; ".join(reasons) +
                        "). Added ranks brought no added hardware, so throughput, speedup and efficiency here "
                        "measure contention, not scaling. Run across hosts with --hosts (docs/howto/scaling-study.md).")
    return not warnings, warnings


def rank0_step_timings(run_dir: str) -> list[dict[str, Any]]:
    """Rank 0's typical steps (step 0, which traces the graph, left out when later steps exist) with
    the seconds its collectives were executing, from Horovod's timeline."""
    path = os.path.join(run_dir, rundir.rank_file(0))
    if not os.path.isfile(path):
        return []
    steps = [s for s in read_rank_file(path, 0).steps if s.get("step", SETUP_STEP) > SETUP_STEP]
    typical = [s for s in steps if s["step"] >= 1] or steps
    intervals = timeline_intervals(os.path.join(run_dir, rundir.HOROVOD_TIMELINE))
    return [{
        "step": s["step"],
        "step_s": s["step_time_s"],
        "items": s.get("items"),
        "collective_s": None if intervals is None else covered_seconds(intervals, s["t_start"], s["t_end"]),
    } for s in typical]


def timeline_intervals(path: str) -> list[tuple[float, float]] | None:
    """Wall-clock intervals (seconds) in which rank 0 executed a collective; None without a timeline.
    A timeline cut short by a killed rank gives the intervals of its complete events."""
    timeline = rundir.read_timeline(path)
    return None if timeline is None else execution_intervals(timeline.events)


def execution_intervals(events: list[dict[str, Any]]) -> list[tuple[float, float]]:
    """Top-level ALLREDUCE / ALLGATHER / BROADCAST ... activities of each tensor, not NEGOTIATE_*.

    Activities nest per tensor (``pid``) as B/E pairs; ``ts`` counts microseconds from the start
    time that the first metadata event gives in microseconds since the epoch.
    """
    origin = next((e["args"]["start_time_since_epoch_in_micros"] for e in events
                   if e.get("ph") == "M" and "start_time_since_epoch_in_micros" in e.get("args", {})), None)
    if origin is None:
        return []
    open_stacks: dict[Any, list[tuple[str, float]]] = {}
    intervals = []
    for event in events:
        phase = event.get("ph")
        if phase == "B":
            open_stacks.setdefault(event["pid"], []).append((event.get("name", ""), event["ts"]))
        elif phase == "E":
            stack = open_stacks.get(event["pid"])
            if not stack:
                continue
            name, start = stack.pop()
            if not stack and not name.startswith("NEGOTIATE"):
                intervals.append(((origin + start) / 1e6, (origin + event["ts"]) / 1e6))
    return intervals


def covered_seconds(intervals: list[tuple[float, float]], start: float, end: float) -> float:
    """Length of the union of ``intervals`` clipped to [start, end]: overlapping collectives count once."""
    clipped = sorted((max(a, start), min(b, end)) for a, b in intervals if b > start and a < end)
    total, reach = 0.0, start
    for a, b in clipped:
        if b > reach:
            total += b - max(a, reach)
            reach = b
    return total


def project_from(rows: list[ScaleRow], run_dirs: dict[int, str], workload: str | None,
                 request: ProjectionRequest) -> dict[str, Any]:
    """Project from the smallest rank count that ran collectives (N >= 2: real message sizes) or, when
    there is none, from one rank with the sizes of its saved parameters (a pure compute time)."""
    usable = [r for r in rows if r["status"] == "ok" and r["compute_time_s"] is not None]
    multi = [r for r in usable if r["world_size"] >= 2]
    single = [r for r in usable if r["world_size"] == 1
              and os.path.isfile(os.path.join(run_dirs[1], rundir.PARAMETERS))]
    if not multi and not single:
        raise UserError("--project needs a successful run on 2 or more ranks, or on 1 rank of a built-in "
                        "workload (Horovod runs no collective on 1 rank; the saved parameters give the sizes)")
    row = min(multi, key=lambda r: r["world_size"]) if multi else single[0]
    compute_s = request.compute_s if request.compute_s is not None else row["compute_time_s"]
    if compute_s is None or compute_s <= 0:
        raise UserError(f"N={row['world_size']}: no compute time is left after the time in collectives; "
                        "give one with --step-compute SECONDS")
    items = row["items_per_rank"]
    if items is None:
        # A script's steps do not say how many examples they hold; a throughput cannot be projected.
        raise UserError(f"N={row['world_size']}: the run's steps record no items (a script's steps do not say how many "
                        "examples they hold), and the projection's throughput needs them; project a built-in "
                        "workload's run (memdiag scale WORKLOAD ... --project N,N)")
    run_dir = run_dirs[row["world_size"]]
    summary = rundir.read_summary(run_dir)
    parameters = None if multi else parameter_bytes(os.path.join(run_dir, rundir.PARAMETERS))
    base = model.base_from_summary(summary, row["run_dir"], items, compute_s, parameters)
    if request.items_per_rank is not None:
        base = model.at_batch(base, request.items_per_rank)
    result = model.projection_result(base, workload, sorted(request.rank_counts), request.network,
                                     request.fusion_bytes)
    sizes = "recorded allreduces" if multi else f"sizes of the parameters in {rundir.PARAMETERS}"
    if request.compute_s is not None:
        result["compute_source"] = f"--step-compute; message sizes from {sizes}"
    elif row["collective_time_s"] is None and multi:
        result["compute_source"] = (f"N={row['world_size']}: whole step time (no timeline: communication counted "
                                    f"as compute); message sizes from {sizes}")
    else:
        result["compute_source"] = (f"N={row['world_size']}: rank 0's step time minus its time in collectives; "
                                    f"message sizes from {sizes}")
    if request.items_per_rank is not None:
        result["compute_source"] += (f"; scaled from {row['items_per_rank']:g} to {request.items_per_rank:g} "
                                     "items per rank (--project-batch)")
    return result


def parameter_bytes(path: str) -> dict[str, int]:
    """Bytes of every trainable variable a built-in workload saved (``NNNN:name`` keys)."""
    with np.load(path) as saved:
        return {key.split(":", 1)[1]: saved[key].nbytes for key in saved.files}
