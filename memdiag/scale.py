"""``memdiag scale``: one workload at several rank counts, weak or strong, then projected further.

Each rank count is an ordinary ``memdiag run`` (its own run directory under the scale directory) with
Horovod's timeline always on: it is the one record of when each collective ran (the ``t`` of a
collective record inside ``tf.function`` is not its completion time; see docs/scaling.md).
The study's figures (throughput, speedup, efficiency, memory, bytes, time in collectives) are read
back from those directories, so ``--from DIR`` can redo the analysis and the projection without
running anything again.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import statistics
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from memdiag._errors import UserError
from memdiag.analyze import projection as model
from memdiag.collect import HOROVOD_TIMELINE, RUN_MANIFEST, SUMMARY, read_rank_file
from memdiag.launch.mpirun import ranks_per_host
from memdiag.compare import _progress
from memdiag.launch.session import RunRequest, execute, prepare_run_dir, run_request_from, validate
from memdiag.workloads import check as check_workload, configs

SCALE_FILE = "scale.json"
PARAMETERS = "params.npz"  # written by rank 0 of a built-in workload (memdiag.workloads.loop)
# The preset setting that holds each built-in workload's per-rank batch (items per step).
PER_RANK_BATCH = {"transformer": "tokens_per_rank", "mixed": "tokens_per_rank", "resnet50": "batch_per_rank"}
COLLECTIVE_TIME_METHOD = (
    "in coll.: from rank 0's Horovod timeline, the union of the intervals in which a collective was "
    "executing (negotiation, i.e. waiting for the other ranks, left out) within each step, and its share "
    "of rank 0's step; medians over the steps after the first. It can overlap backward-pass compute, so "
    "it is not all exposed time"
)


@dataclass
class ScaleRequest:
    target: str
    rank_counts: list[int]
    scaling: str  # "weak": same batch per rank; "strong": same global batch divided among the ranks
    mode: str = "sparse"
    steps: int = 4
    preset: str = "tiny"
    out: str | None = None
    force: bool = False
    hosts: str | None = None
    timeout_s: float | None = None
    margin: float = 1.0
    seed: int = 1234
    script_args: list[str] = field(default_factory=list)
    overrides: dict[str, str] = field(default_factory=dict)
    spool: str = "shared"
    memray: bool = False
    mem_limit_bytes: int | None = None
    threads_per_rank: int | None = None

    @property
    def is_script(self) -> bool:
        return self.run_request(1, {}, "").is_script

    @property
    def label(self) -> str:
        return self.run_request(1, {}, "").label

    def batch_overrides(self, world_size: int) -> dict[str, str]:
        """The preset settings for one rank count: strong scaling divides the global batch by N."""
        if self.scaling == "weak":
            return dict(self.overrides)
        label = self.label
        if self.is_script or label not in PER_RANK_BATCH:
            raise UserError(f"--strong needs a built-in workload ({', '.join(PER_RANK_BATCH)}); for a script, "
                            "run --weak and pass the per-rank batch yourself")
        check_workload(label, self.preset)
        key = PER_RANK_BATCH[label]
        config = configs.with_overrides(configs.PRESETS[label][self.preset], self.overrides)
        total = getattr(config, key)
        per_rank = total // world_size
        if key == "tokens_per_rank":
            # Whole sequences only, so that the tokens counted are the tokens trained on.
            per_rank -= per_rank % config.seq_len
        if per_rank < 1:
            raise UserError(f"--strong: a global batch of {total} ({key}) leaves nothing for each of "
                            f"{world_size} ranks; raise it with --set {key}=... or use fewer ranks")
        return {**self.overrides, key: str(per_rank)}

    def run_request(self, world_size: int, overrides: dict[str, str], out: str) -> RunRequest:
        # Time in collectives is read from Horovod's timeline: always recorded in a scaling study.
        return run_request_from(self, world_size=world_size, overrides=overrides, out=out, horovod_timeline=True)


@dataclass(frozen=True)
class ProjectionRequest:
    rank_counts: list[int]
    network: model.Network
    fusion_bytes: int = model.DEFAULT_FUSION_BYTES
    compute_s: float | None = None  # replaces the measured compute time per step
    items_per_rank: float | None = None  # project at this per-rank batch instead of the measured one


def run_scale(request: ScaleRequest, projection: ProjectionRequest | None, console: Console) -> dict[str, Any]:
    """Run every rank count, write scale.json and return it."""
    if len(set(request.rank_counts)) != len(request.rank_counts):
        raise UserError(f"--ranks {','.join(map(str, request.rank_counts))}: give each rank count once")
    rank_counts = sorted(request.rank_counts)
    # Everything is checked before the first directory is made.
    plans = {n: request.batch_overrides(n) for n in rank_counts}
    for n in rank_counts:
        validate(request.run_request(n, plans[n], out=""))
    if request.out is None:
        stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        request.out = os.path.join("runs", f"scale-{request.label}-{request.scaling}-{stamp}")
    prepare_run_dir(request.out, request.force)
    run_dirs: dict[int, str] = {}
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        overall = progress.add_task(f"{request.scaling} scaling", total=len(rank_counts))
        for n in rank_counts:
            task = progress.add_task(f"  N={n}: steps", total=request.steps)
            out = os.path.join(request.out, f"n{n}")
            run_dirs[n] = execute(request.run_request(n, plans[n], out), on_steps=_progress(progress, task))
            progress.remove_task(task)
            progress.advance(overall)
            console.print(f"  finished N={n}", highlight=False)
    study = {
        "workload": request.label,
        "preset": None if request.is_script else request.preset,
        "scaling": request.scaling,
        "mode": request.mode,
        "steps": request.steps,
        "rank_counts": rank_counts,
        "hosts": request.hosts,
        "overrides": request.overrides,
        "batch_overrides": {str(n): plans[n] for n in rank_counts},
    }
    result = build_result(study, run_dirs, projection)
    with open(os.path.join(request.out, SCALE_FILE), "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2, default=str)
    return result


def analyze_dir(path: str, projection: ProjectionRequest | None) -> dict[str, Any]:
    """Redo the analysis (and the projection) of a scale directory, or of one run directory."""
    scale_file = os.path.join(path, SCALE_FILE)
    if os.path.isfile(scale_file):
        saved = _load_json(scale_file)
        run_dirs = {row["world_size"]: os.path.join(path, row["run_dir"]) for row in saved["rows"]}
        return build_result(saved["study"], run_dirs, projection)
    if os.path.isfile(os.path.join(path, SUMMARY)) and os.path.isfile(os.path.join(path, RUN_MANIFEST)):
        summary = _load_json(os.path.join(path, SUMMARY))
        study = {"workload": summary["workload"], "preset": summary["preset"], "scaling": None,
                 "mode": summary["mode"], "steps": summary["steps"], "rank_counts": [summary["world_size"]],
                 "hosts": _load_json(os.path.join(path, RUN_MANIFEST)).get("hosts"), "overrides": {},
                 "batch_overrides": {}}
        return build_result(study, {summary["world_size"]: path}, projection)
    raise UserError(f"--from {path}: no {SCALE_FILE} or run summary there; give a directory written by "
                    "`memdiag scale` or `memdiag run`")


# -- the analysis -----------------------------------------------------------------------------------

def build_result(study: dict[str, Any], run_dirs: dict[int, str], projection: ProjectionRequest | None) -> dict[str, Any]:
    rows = [measured_row(_load_json(os.path.join(d, SUMMARY)), _load_json(os.path.join(d, RUN_MANIFEST)), d)
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
            warnings.append(f"the run on {row['world_size']} rank(s) ended with status {row['status']}; "
                            f"see {row['run_dir']}/mpirun.log")
        if row["collective_time_s"] is None and row["world_size"] > 1:
            warnings.append(f"N={row['world_size']}: no Horovod timeline, so the time in collectives is unknown")
    result = {
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


def measured_row(summary: dict[str, Any], manifest: dict[str, Any], run_dir: str) -> dict[str, Any]:
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


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """Speedup and efficiency against the smallest rank count that produced a throughput."""
    measured = [r for r in rows if r["throughput"]]
    if not measured:
        return
    base = min(measured, key=lambda r: r["world_size"])
    for row in measured:
        row["speedup"] = model.speedup(row["throughput"], base["throughput"])
        row["efficiency"] = model.scaling_efficiency(row["throughput"], row["world_size"], base["throughput"],
                                                     base["world_size"])


def study_warnings(rows: list[dict[str, Any]]) -> tuple[bool, list[str]]:
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
                        "measure contention, not scaling. Run across hosts with --hosts (docs/scaling.md).")
    return not warnings, warnings


def rank0_step_timings(run_dir: str) -> list[dict[str, Any]]:
    """Rank 0's typical steps (step 0, which traces the graph, left out when later steps exist) with
    the seconds its collectives were executing, from Horovod's timeline."""
    path = os.path.join(run_dir, "rank-0.jsonl")
    if not os.path.isfile(path):
        return []
    steps = [s for s in read_rank_file(path, 0).steps if s.get("step", -1) >= 0]
    typical = [s for s in steps if s["step"] >= 1] or steps
    intervals = read_timeline(os.path.join(run_dir, HOROVOD_TIMELINE))
    return [{
        "step": s["step"],
        "step_s": s["step_time_s"],
        "items": s.get("items"),
        "collective_s": None if intervals is None else covered_seconds(intervals, s["t_start"], s["t_end"]),
    } for s in typical]


def read_timeline(path: str) -> list[tuple[float, float]] | None:
    """Wall-clock intervals (seconds) in which rank 0 executed a collective; None without a timeline."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return None
    try:
        events = json.loads(text)
    except ValueError:
        # A rank that was killed leaves the JSON array unterminated: keep the complete events.
        try:
            events = json.loads(text[: text.rfind("}") + 1] + "]")
        except ValueError:
            return None
    return execution_intervals(events)


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


def project_from(rows: list[dict[str, Any]], run_dirs: dict[int, str], workload: str | None,
                 request: ProjectionRequest) -> dict[str, Any]:
    """Project from the smallest rank count that ran collectives (N >= 2: real message sizes) or, when
    there is none, from one rank with the sizes of its saved parameters (a pure compute time)."""
    usable = [r for r in rows if r["status"] == "ok" and r["compute_time_s"] is not None]
    multi = [r for r in usable if r["world_size"] >= 2]
    single = [r for r in usable if r["world_size"] == 1
              and os.path.isfile(os.path.join(run_dirs[1], PARAMETERS))]
    if not multi and not single:
        raise UserError("--project needs a successful run on 2 or more ranks, or on 1 rank of a built-in "
                        "workload (Horovod runs no collective on 1 rank; the saved parameters give the sizes)")
    row = min(multi, key=lambda r: r["world_size"]) if multi else single[0]
    compute_s = request.compute_s
    if compute_s is None:
        compute_s = row["compute_time_s"]
        if compute_s <= 0:
            raise UserError(f"N={row['world_size']}: no compute time is left after the time in collectives; "
                            "give one with --step-compute SECONDS")
    run_dir = run_dirs[row["world_size"]]
    summary = _load_json(os.path.join(run_dir, SUMMARY))
    parameters = None if multi else parameter_bytes(os.path.join(run_dir, PARAMETERS))
    base = model.base_from_summary(summary, row["run_dir"], row["items_per_rank"], compute_s, parameters)
    if request.items_per_rank is not None:
        base = model.at_batch(base, request.items_per_rank)
    result = model.projection_result(base, workload, sorted(request.rank_counts), request.network,
                                     request.fusion_bytes)
    sizes = "recorded allreduces" if multi else f"sizes of the parameters in {PARAMETERS}"
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


def _load_json(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except OSError:
        raise UserError(f"{path} is missing; the run directory is incomplete") from None
    except ValueError:
        raise UserError(f"{path} is not valid JSON; the run directory is damaged") from None
