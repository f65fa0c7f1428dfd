"""``summary.json``: one run's records reduced to per-rank and per-tensor figures."""

from __future__ import annotations

import bisect
import math
import os
import statistics
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from memdiag.analyze.attribution import summary_entry as attribution_entry
from memdiag.analyze.failure import diagnose
from memdiag.analyze.mode_applied import mode_applied, not_applied_reasons
from memdiag.analyze.steady import steady_figures
from memdiag.format import rundir
from memdiag.format.reader import CollectiveLog, RankRecords, Run
from memdiag.format.records import DistinctRowsRecord, FirstGradient, StepRecord
from memdiag.format.results import (
    CollectiveSummary,
    Consistency,
    DistinctRowsSummary,
    PaddingSummary,
    PolicySummary,
    RankSummary,
    RunSummary,
    StepDetail,
)


def rank_status(records: RankRecords) -> str:
    if records.killed is not None:
        return "killed"
    if records.end is not None:
        return records.end.get("status", "ok")
    return "died" if records.steps or records.start else "missing"


def _training_steps(records: RankRecords) -> list[StepRecord]:
    return [s for s in records.steps if s.get("step", 0) >= 0]


def typical_step_time(steps: Sequence[StepRecord]) -> float | None:
    """Median step time, leaving out step 0 (graph tracing) when later steps exist."""
    times = [s["step_time_s"] for s in steps if s.get("step", 0) >= 1] or [s["step_time_s"] for s in steps]
    return statistics.median(times) if times else None


def rank_summary(records: RankRecords, live: dict[int, _LiveStep] | None = None) -> RankSummary:
    """One rank's figures. ``live``: its collective outputs alive at once per step, by the analysis's
    model (:func:`live_steps`); they replace the figure the rank wrote, which counted a name's allgathers
    as one tensor and grouped ones one at a time."""
    steps = _training_steps(records)
    if live is None:
        live, _ = live_steps(_log(records.collectives))
    if live:
        steps = [s.copy() for s in steps]
        for s in steps:
            found = live.get(s["step"])
            s["collective_live_peak_bytes"] = found.live_bytes if found else 0
            s["collective_added_peak_bytes"] = found.added_bytes if found else 0
    step_ids = {s["step"] for s in steps}
    per_op = _bytes_per_op(records.collectives, step_ids)
    n = max(1, len(step_ids))
    peaks = [s["peak_rss_bytes"] for s in records.steps if "peak_rss_bytes" in s]
    if records.killed:
        peaks.append(max(records.killed.get("rss_bytes", 0), records.killed.get("hwm_bytes", 0)))
    end = records.end
    hwms = [s.get("hwm_bytes", 0) for s in records.steps] + [end.get("hwm_bytes", 0) if end else 0]
    return {
        "rank": records.rank,
        "status": rank_status(records),
        "host": records.start.get("host") if records.start else None,
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
        "replayed_steps": next((r.get("steps") for r in records.replayed), None),
    }


def _agent_wall(records: RankRecords) -> float | None:
    start = records.start.get("t") if records.start else None
    end = records.end.get("t") if records.end else None
    return end - start if isinstance(start, (int, float)) and isinstance(end, (int, float)) else None


def _log(collectives: Sequence[Mapping[str, Any]]) -> CollectiveLog:
    return collectives if isinstance(collectives, CollectiveLog) else CollectiveLog(collectives)


def _bytes_per_op(collectives: Sequence[Mapping[str, Any]], step_ids: set[int]) -> dict[str, int]:
    """Bytes received per op over the collectives of the steps ``step_ids``."""
    log = _log(collectives)
    kind, step, _, bytes_out = log.columns()
    per_op: dict[str, int] = defaultdict(int)
    if len(kind):
        wanted = (kind >= 0) & np.isin(step, np.fromiter(step_ids, dtype=np.int64, count=len(step_ids)))
        totals = np.bincount(kind[wanted], weights=bytes_out[wanted], minlength=len(log.kinds))
        for k, total in enumerate(totals.tolist()):
            if total:
                per_op[log.kinds[k]["op"]] += int(total)
    for _, c in log.whole():
        if c.get("step") in step_ids:
            per_op[c["op"]] += c["bytes_out"]
    return per_op


class _LiveStep:
    """The collective outputs of one step that the live model counts as alive at once (modelled from
    the records, not measured):

    - every output but an allgather's is alive until the step's update: summed;
    - Horovod completes allgathers one after another and frees each gathered output once its quotient
      (values / N under op=Average) is made: one tensor's gathered outputs at a time, the largest,
      beside one quotient, the largest;
    - but the allgathers of one grouped call (``grouped`` records: Horovod's grouped_allgather, and
      grouped_allreduce or ``num_groups``/``groups=`` of IndexedSlices, values then indices) are
      allocated in one response and alive together: they count as one, their quotients too;
    - a tensor is its name and its occurrence in the step: the k-th allgather of one name and part in
      a step (an unnamed one from one line of code, ``allgather@file.py:12[shape]``, called in a loop)
      is a tensor of its own, not added to the first's.
    """

    def __init__(self) -> None:
        self.other = 0
        self.units: list[list[int]] = []  # per unit alive together: [gathered bytes, quotient bytes]
        self.names: list[set[str]] = []
        self._unit_of: dict[tuple[str, int], int] = {}  # (name, occurrence) -> unit
        self._seen: dict[tuple[str, Any], int] = defaultdict(int)  # (name, part) -> occurrences so far
        self._run: int | None = None  # the unit of the grouped call being read
        self._run_part: Any = None

    def add(self, c: dict[str, Any], bytes_out: int) -> None:
        if c.get("op") != "allgather":
            self.other += bytes_out
            self._run = None
            return
        name, part = str(c.get("name")), c.get("part")
        occurrence = self._seen[(name, part)]
        self._seen[(name, part)] += 1
        key = (name, occurrence)
        grouped = bool(c.get("grouped"))
        # a grouped IndexedSlices call gathers every values part, then every indices part: a values part
        # after an indices part starts another call
        if not grouped or (self._run_part == "indices" and part == "values"):
            self._run = None
        unit = self._unit_of.get(key)
        if unit is None:
            unit = self._run if grouped and self._run is not None else len(self.units)
            if unit == len(self.units):
                self.units.append([0, 0])
                self.names.append(set())
            self._unit_of[key] = unit
        if grouped:
            self._run, self._run_part = unit, part
        self.units[unit][0] += bytes_out
        self.names[unit].add(name)
        if part == "values" and c.get("reduce_op") in (None, "average"):
            self.units[unit][1] += bytes_out

    @property
    def live_bytes(self) -> int:
        return self.other + self.added_bytes

    @property
    def added_bytes(self) -> int:
        """What the collectives add to what the step holds: the gathered outputs and the quotient alive at
        once. Every other output (an allreduce's, a broadcast's) replaces an input as large, which its
        consumer frees."""
        return max((u[0] for u in self.units), default=0) + max((u[1] for u in self.units), default=0)


def live_collective_bytes(log: CollectiveLog) -> tuple[dict[int, int], list[list[str]]]:
    """Per training step of one rank, the collective outputs alive at once by :class:`_LiveStep`'s model;
    and the sets of tensors whose allgathers were alive together (grouped calls, more than one tensor)."""
    steps, groups = live_steps(log)
    return {s: live.live_bytes for s, live in steps.items()}, groups


def live_steps(log: CollectiveLog) -> tuple[dict[int, _LiveStep], list[list[str]]]:
    """Per training step of one rank, its :class:`_LiveStep`; and the sets of tensors whose allgathers were
    alive together (grouped calls, more than one tensor)."""
    kind, step, _, bytes_out = log.columns()
    whole = dict(log.whole())
    steps: dict[int, _LiveStep] = {}
    for i, (k, s, b) in enumerate(zip(kind.tolist(), step.tolist(), bytes_out.tolist())):
        c = whole[i] if k < 0 else log.kinds[k]
        if k < 0:
            s, b = c.get("step"), c.get("bytes_out")
        if not isinstance(s, int) or s < 0 or not isinstance(b, int):
            continue
        steps.setdefault(s, _LiveStep()).add(c, b)
    groups = sorted({tuple(sorted(names)) for live in steps.values() for names in live.names if len(names) > 1})
    return steps, [list(g) for g in groups]


@dataclass
class _Tensor:
    """One (tensor, op, part) of collective_summary, added up rank by rank."""

    last: tuple[int, int]  # (rank, position) of its largest call (bytes out; the last of equals)
    bytes_in_max: int = 0
    bytes_out_max: int = 0
    bytes_out_sum: int = 0
    calls: int = 0
    steps: int = 0  # distinct (rank, step) pairs


def _tensors_of_rank(log: CollectiveLog) -> dict[tuple[Any, ...], tuple[int, int, int, int, int, int]]:
    """Per (tensor, op, part), over one rank's training-step collectives: (position of its largest call
    by bytes out, the last of equals; largest bytes in, largest bytes out, bytes out summed, calls,
    distinct steps). Array by array, not call by call: rows that change from step to step are shown
    by the largest call, as the formula takes them."""
    kind, step, bytes_in, bytes_out = log.columns()
    ids: dict[tuple[Any, ...], int] = {}
    group_of_kind = np.array([ids.setdefault((k["name"], k["op"], k.get("part")), len(ids)) for k in log.kinds] + [-1],
                             dtype=np.int64)
    position = np.nonzero((kind >= 0) & (step >= 0))[0]
    group = group_of_kind[kind[position]]
    n = len(ids)
    calls = np.bincount(group, minlength=n)
    sums = np.bincount(group, weights=bytes_out[position], minlength=n)
    largest_in, largest_out, last = np.zeros(n, np.int64), np.zeros(n, np.int64), np.full(n, -1, np.int64)
    np.maximum.at(largest_in, group, bytes_in[position])
    np.maximum.at(largest_out, group, bytes_out[position])
    largest = bytes_out[position] == largest_out[group]
    np.maximum.at(last, group[largest], position[largest])
    steps = step[position]
    low = int(steps.min()) if len(steps) else 0
    span = (int(steps.max()) - low + 1) if len(steps) else 1
    pairs = np.unique(group * span + (steps - low))
    distinct = np.bincount(pairs // span, minlength=n)
    found = {key: (int(last[i]), int(largest_in[i]), int(largest_out[i]), int(sums[i]), int(calls[i]),
                   int(distinct[i])) for key, i in ids.items() if calls[i]}
    # records kept whole (a field missing or odd): one by one; a record without a step is training
    extra: dict[tuple[Any, ...], list[Any]] = {}
    for pos, c in log.whole():
        if (0 if c.get("step") is None else c["step"]) < 0:
            continue
        key = (c["name"], c["op"], c.get("part"))
        last_pos, b_in, b_out, total, count, _ = found.get(key, (-1, 0, 0, 0, 0, 0))
        larger = c["bytes_out"] > b_out or (c["bytes_out"] == b_out and pos > last_pos)
        found[key] = (pos if larger else last_pos, max(b_in, c["bytes_in"]), max(b_out, c["bytes_out"]),
                      total + c["bytes_out"], count + 1, 0)
        extra.setdefault(key, []).append(c.get("step"))
    for key, whole_steps in extra.items():
        i = ids.get(key)
        regular = set(steps[group == i].tolist()) if i is not None else set()
        found[key] = (*found[key][:5], len(regular | set(whole_steps)))
    return found


def collective_summary(run: Run) -> list[CollectiveSummary]:
    """One entry per (tensor, op, part) over the training steps of every rank."""
    groups: dict[tuple[Any, ...], _Tensor] = {}
    for rank, records in run.ranks.items():
        for key, (last_call, b_in, b_out, total, calls, steps) in _tensors_of_rank(_log(records.collectives)).items():
            group = groups.setdefault(key, _Tensor((rank, last_call)))
            if b_out >= group.bytes_out_max:
                group.last = (rank, last_call)
            group.bytes_in_max = max(group.bytes_in_max, b_in)
            group.bytes_out_max = max(group.bytes_out_max, b_out)
            group.bytes_out_sum += total
            group.calls += calls
            group.steps += steps
    entries: list[CollectiveSummary] = []
    for (name, op, part), group in groups.items():
        rank, position = group.last
        last = _log(run.ranks[rank].collectives)[position]
        shape_in, shape_out = last.get("shape_in"), last.get("shape_out")
        entries.append({
            "name": name,
            "op": op,
            "part": part,
            "sparse": bool(last.get("sparse")),
            "densified": bool(last.get("densified")),
            "merged": bool(last.get("merged")),
            "reduce_op": last.get("reduce_op"),
            "process_set_size": last.get("process_set_size"),
            "dtype": last.get("dtype"),
            "shape_in": shape_in,
            "shape_out": shape_out,
            "rows_in": shape_in[0] if shape_in else None,
            "rows_out": shape_out[0] if shape_out else None,
            "bytes_in_per_rank": group.bytes_in_max,
            "bytes_out_per_rank": group.bytes_out_max,
            "bytes_out_mean": group.bytes_out_sum / group.calls,
            "calls_per_step": group.calls / max(1, group.steps),
        })
    entries.sort(key=lambda e: (-e["bytes_out_per_rank"], e["name"], e["part"] or ""))
    return entries


def distinct_rows_summary(run: Run) -> list[DistinctRowsSummary]:
    """Per IndexedSlices gradient: its rows T and distinct rows U per rank over the training steps
    (``distinct_rows`` records), the first step's largest U (what auto decided from), the largest U
    of any step, and the merge's compute time per step where the rows were merged."""
    by_name: dict[str, list[DistinctRowsRecord]] = defaultdict(list)
    for records in run.ranks.values():
        when = _step_of_time(records)
        for r in records.distinct_rows:
            # the step whose span holds the count, not its stamp, which can lag (see _recorded_rows)
            step = when(r.get("t"), r.get("step", 0))
            if isinstance(step, int) and step >= 0:
                by_name[r["name"]].append(cast(DistinctRowsRecord, {**r, "step": step}))
    entries: list[DistinctRowsSummary] = []
    for name, found in sorted(by_name.items()):
        first = min(r["step"] for r in found)
        per_rank: dict[str, list[int]] = {}
        for rank in sorted({r["rank"] for r in found}):
            mine = [r["distinct_rows"] for r in found if r["rank"] == rank]
            per_rank[str(rank)] = [min(mine), max(mine)]
        merge = [seconds for r in found if (seconds := r.get("merge_s")) is not None]
        entries.append({
            "name": name,
            "rows_max": max(r["rows"] for r in found),
            "distinct_rows_min": min(r["distinct_rows"] for r in found),
            "distinct_rows_max": max(r["distinct_rows"] for r in found),
            "first_step_distinct_rows_max": max(r["distinct_rows"] for r in found if r["step"] == first),
            "distinct_rows_per_rank": per_rank,  # rank -> [min, max] over the steps
            "merge_s_median": statistics.median(merge) if merge else None,
            "steps": len({r["step"] for r in found}),
        })
    return entries


_SHAPE_FIELDS = ("row_bytes", "index_bytes", "row_elements", "dense_rows")


@dataclass
class _Recorded:
    """What one IndexedSlices gradient's records say of its sizes, rank by rank."""

    rows: dict[int, dict[int, int]]  # rank -> step -> rows T (every row, before any merge)
    shape: dict[str, int]  # of _SHAPE_FIELDS, those a record shows


def _step_of_time(records: RankRecords) -> Callable[[Any, Any], Any]:
    """``when(t, stamped)``: the step of this rank whose span [t_start, t_end) holds time ``t``, or
    ``stamped`` where no step's span does (or the records give no times)."""
    spans = sorted((s["t_start"], s["t_end"], s["step"]) for s in records.steps
                   if isinstance(s.get("t_start"), (int, float)) and isinstance(s.get("t_end"), (int, float))
                   and isinstance(s.get("step"), int))
    starts = [start for start, _, _ in spans]

    def when(t: Any, stamped: Any) -> Any:
        if not isinstance(t, (int, float)) or not spans:
            return stamped
        i = bisect.bisect_right(starts, t) - 1
        if i >= 0 and spans[i][0] <= t < spans[i][1]:
            return spans[i][2]
        return stamped

    return when


def _recorded_rows(run: Run, names: set[str]) -> dict[str, _Recorded]:
    """Per gradient, each rank's rows per training step as it ran: from its allgathers of values (each
    rank's own rows in, unmerged) or else from ``distinct_rows`` records (T, counted before merging:
    dense, auto and dedup); and the row width, index size and table rows the records show (the densified
    allreduce of a dense run has the table's shape)."""
    found = {name: _Recorded({}, {}) for name in names}
    for rank, records in run.ranks.items():
        counted: dict[tuple[str, int], int] = defaultdict(int)
        when = _step_of_time(records)
        for r in records.distinct_rows:
            step, rows = r.get("step"), r.get("rows")
            if r.get("name") not in names or not isinstance(rows, int):
                continue
            # The count runs inside the graph before the step's collectives mark the step, so its own stamp
            # can be an earlier step (set-up, even): the step whose time span holds it is the one it counted.
            step = when(r.get("t"), step)
            if isinstance(step, int) and step >= 0:
                counted[(r["name"], step)] += rows
        gathered: dict[tuple[str, int], int] = defaultdict(int)
        log = _log(records.collectives)
        relevant = {k for k, static in enumerate(log.kinds) if static.get("name") in names
                    and static.get("op") in ("allgather", "allreduce")}
        kind, _, _, _ = log.columns()
        positions = np.nonzero(np.isin(kind, np.fromiter(relevant, dtype=np.int64, count=len(relevant))))[0] \
            if relevant else np.zeros(0, np.int64)
        chosen = [log[int(i)] for i in positions] + [c for _, c in log.whole() if c.get("name") in names]
        for c in chosen:
            step, shape_in, itemsize = c.get("step"), c.get("shape_in"), c.get("itemsize")
            if not (isinstance(step, int) and isinstance(shape_in, list) and shape_in and isinstance(itemsize, int)):
                continue
            entry = found[c["name"]]
            if c.get("op") == "allreduce":
                if c.get("densified"):  # the IndexedSlices made dense: the table's shape
                    entry.shape.setdefault("dense_rows", int(shape_in[0]))
                continue
            if c.get("merged") or c.get("densified"):
                continue  # merged: U rows gathered, not T
            if c.get("part") == "indices":
                entry.shape.setdefault("index_bytes", itemsize)
            elif c.get("part") == "values" and step >= 0:
                elements = math.prod(shape_in[1:])
                entry.shape.setdefault("row_elements", elements)
                entry.shape.setdefault("row_bytes", elements * itemsize)
                # MultiWorkerMirroredStrategy pads the rows in: its record keeps the worker's own
                own = c["rows"] if isinstance(c.get("rows"), int) else shape_in[0]
                gathered[(c["name"], step)] += int(own)
        # A rank's own rows in its allgather are what moved; a distinct_rows record fills in only the steps
        # no unmerged allgather shows (dense and dedup runs).
        for (name, step), rows in {**counted, **gathered}.items():
            found[name].rows.setdefault(rank, {})[step] = rows
    return found


def saved_table_rows(run_dir: str) -> dict[str, int]:
    """Per variable rank 0 saved (``params_initial.npz``, else ``params.npz``), its first dimension: the
    rows of an embedding table whose gradient's shape the graph did not know. Read from each array's
    header alone, so a large table is not loaded."""
    import zipfile

    from numpy.lib import format as npy

    for file in (rundir.INITIAL_PARAMETERS, rundir.PARAMETERS):
        path = os.path.join(run_dir, file)
        if not os.path.isfile(path):
            continue
        rows: dict[str, int] = {}
        try:
            with zipfile.ZipFile(path) as archive:
                for info in archive.infolist():
                    with archive.open(info) as f:
                        version = npy.read_magic(f)  # type: ignore[no-untyped-call]
                        header = npy.read_array_header_1_0 if version == (1, 0) else npy.read_array_header_2_0
                        shape = header(f)[0]  # type: ignore[no-untyped-call]
                    key = info.filename.removesuffix(".npy")
                    if shape:  # keys are "INDEX:NAME" (memdiag.analyze.verify.load_parameters)
                        rows[key.split(":", 1)[1] if ":" in key else key] = int(shape[0])
        except (OSError, ValueError, zipfile.BadZipFile):
            continue  # damaged: the records alone decide
        return rows
    return {}


def gradient_rows(run: Run, policies: dict[str, list[dict[str, Any]]]) -> dict[str, PolicySummary]:
    """Per IndexedSlices gradient (``policies``: its policy record on each rank), the rows in three
    distinct meanings, and what the records add to its shape:

    - ``own_rows_by_rank``: each rank's own rows T (the most of any step), rank -> rows;
    - ``rows_gathered``: the rows every rank receives per step (the most of any step): under Horovod
      the sum over the ranks of their own rows (allgatherv), under MultiWorkerMirroredStrategy N x the
      longest worker's (padded);
    - ``rows_largest_rank``: the largest rank's own rows.

    Rows come from the records of the run where they show them, else from each rank's policy record,
    read when the graph was traced (``local_rows``); ``rows_from`` says "trace" when every rank's graph
    knew its rows, "records" when they had to be read off the run's records; unknown: None.
    A policy record whose shape was unknown at trace time gets row width, index size and table rows
    from the records where they show them, the table rows else from the parameters rank 0 saved
    (``shape_from`` "records")."""
    recorded = _recorded_rows(run, set(policies))
    saved: dict[str, int] | None = None
    world = run.manifest.get("world_size")
    ranks = set(range(world)) if isinstance(world, int) and world > 0 else set(run.ranks)
    out: dict[str, PolicySummary] = {}
    for name, records in policies.items():
        seen = recorded[name]
        traced = {p["rank"]: p["local_rows"] for p in records
                  if isinstance(p.get("rank"), int) and isinstance(p.get("local_rows"), int)}
        own = {rank: max(steps.values()) for rank, steps in seen.rows.items() if steps}
        # where the rows come from when the trace did not know them all; the records' figures are used
        # wherever they exist (what ran), and equal the trace's where both are known
        source = "trace" if ranks <= set(traced) else ("records" if own else None)
        for rank, rows in traced.items():
            own.setdefault(rank, rows)
        workers = next((p["rows_per_worker"] for p in records if p.get("rows_per_worker")), None)
        gathered: int | None = None
        if workers:  # MWMS: agreed on every worker, and its gathers are padded to the longest
            own = {rank: int(rows) for rank, rows in enumerate(workers)}
            gathered = len(workers) * max(workers)
        elif ranks <= set(own):
            every = [step for step in seen.rows.get(min(ranks), {}) if all(step in seen.rows.get(r, {}) for r in ranks)]
            gathered = max((sum(seen.rows[r][step] for r in ranks) for step in every),
                           default=sum(own[r] for r in ranks))
        entry: PolicySummary = {
            "own_rows_by_rank": {str(rank): own[rank] for rank in sorted(own)} or None,
            "rows_gathered": gathered,
            "rows_largest_rank": max(own.values()) if own else None,
            "rows_from": source,
        }
        # Rows that change from step to step on some rank (a random batch): their range over every rank and
        # step; the figures above are the most.
        per_step = [rows for steps in seen.rows.values() for rows in steps.values()]
        if any(len(set(steps.values())) > 1 for steps in seen.rows.values()):
            entry["own_rows_range"] = _least_median_most(per_step)
            if not workers and ranks <= set(own):
                entry["gathered_rows_range"] = _least_median_most(
                    [sum(seen.rows[r][step] for r in ranks) for step in every])
        first = records[0]
        if first.get("dense_rows") is None and "dense_rows" not in seen.shape:
            saved = saved_table_rows(run.path) if saved is None else saved
            if name in saved:
                seen.shape["dense_rows"] = saved[name]
        filled = {k: v for k, v in seen.shape.items() if first.get(k) is None}
        if filled:
            entry.update(cast(PolicySummary, filled))
            entry["shape_from"] = "records"
        out[name] = entry
    return out


def _least_median_most(values: Sequence[int]) -> list[int]:
    """[least, median (the lower middle), most] of ``values``."""
    ordered = sorted(values)
    return [ordered[0], ordered[(len(ordered) - 1) // 2], ordered[-1]]


def padding_summary(run: Run) -> list[PaddingSummary]:
    """``--engine tf-distribute``: per IndexedSlices gradient whose rows differ between workers, the zero
    rows MultiWorkerMirroredStrategy padded its gathers with (values and indices, ``pad_out_bytes``)
    and the bytes gathered, per worker and step: the step and worker with the most padding. Every
    worker receives the same bytes (N x the longest worker's rows), so the figures are the same on each."""
    if run.manifest.get("engine") != "tf-distribute":
        return []
    cells: dict[str, dict[tuple[int, int], list[int]]] = defaultdict(dict)
    for rank, records in run.ranks.items():
        for c in records.collectives:
            step = c.get("step")
            if c.get("part") not in ("values", "indices") or not isinstance(step, int) or step < 0:
                continue
            cell = cells[c["name"]].setdefault((rank, step), [0, 0])
            cell[0] += int(c.get("pad_out_bytes") or 0)
            cell[1] += int(c.get("bytes_out") or 0)
    policies = {p["name"]: p for records in run.ranks.values() for p in records.policies}
    entries: list[PaddingSummary] = []
    for name, found in sorted(cells.items()):
        padding, gathered = max(found.values())
        if not padding:
            continue  # equal rows: MWMS gathers without padding
        policy = policies.get(name)
        rows = policy.get("rows_per_worker") if policy else None
        entries.append({"name": name, "padding_bytes_per_step": padding, "gathered_bytes_per_step": gathered,
                        "padding_share": padding / gathered if gathered else None,
                        "rows_per_worker": rows})
    return entries


def step_summary(run: Run) -> tuple[list[StepDetail], Consistency]:
    """Per step across ranks: loss, slowest rank, highest peak, and whether parameters agree."""
    by_step: dict[int, list[StepRecord]] = defaultdict(list)
    for records in run.ranks.values():
        for s in _training_steps(records):
            by_step[s["step"]].append(s)
    rows: list[StepDetail] = []
    mismatched: list[int] = []
    checked = 0
    for step in sorted(by_step):
        entries = by_step[step]
        digests = {e["param_digest"] for e in entries if "param_digest" in e}
        identical = None
        if digests and len(entries) == len(run.ranks):
            checked += 1
            identical = len(digests) == 1
            if not identical:
                mismatched.append(step)
        losses = [e["loss"] for e in entries if e.get("loss") is not None]
        rows.append({
            "step": step,
            "loss_mean": statistics.fmean(losses) if losses else None,
            "step_time_s_max": max(e["step_time_s"] for e in entries),
            "peak_rss_bytes_max": max(e["peak_rss_bytes"] for e in entries),
            "params_identical_across_ranks": identical,
        })
    consistency: Consistency = {"checked_steps": checked, "ranks_identical": not mismatched if checked else None,
                   "mismatched_steps": mismatched}
    return rows, consistency


def summarize(run: Run) -> RunSummary:
    m = run.manifest
    lives = {r: live_steps(_log(run.ranks[r].collectives)) for r in sorted(run.ranks)}
    ranks = [rank_summary(run.ranks[r], lives[r][0]) for r in sorted(run.ranks)]
    steps, consistency = step_summary(run)
    items = [s["items"] for r in run.ranks.values() for s in _training_steps(r) if s.get("items")]
    step_times = [r["step_time_s"] for r in ranks if r["step_time_s"]]
    throughput = None
    if items and step_times:
        throughput = len(ranks) * statistics.median(items) / max(step_times)
    policy: dict[str, PolicySummary] = {}
    every_rank: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for records in run.ranks.values():
        seen: set[str] = set()
        for p in records.policies:
            entry = policy.setdefault(p["name"], cast(PolicySummary, {k: v for k, v in p.items()
                                                                      if k not in ("type", "rank", "t", "step")}))
            if p.get("optimizer_input") and "optimizer_input" not in entry:
                # auto: a later record says the optimizer took the gathered rows dense (memdiag.optimizer_input)
                entry.update({"optimizer_input": p["optimizer_input"], "optimizer": p.get("optimizer") or "",
                              "reason": p["reason"]})
            if p["name"] not in seen:
                seen.add(p["name"])
                every_rank[p["name"]].append({**p, "rank": records.rank})
    # One rank's record is not the job's: rows differ between ranks outside auto (gradient_rows).
    for name, found in gradient_rows(run, every_rank).items():
        entry = policy[name]
        entry.update(found)
        rows, row_bytes, index_bytes = entry.get("rows_gathered"), entry.get("row_bytes"), entry.get("index_bytes")
        entry["formula_gathered_bytes"] = None if rows is None or row_bytes is None or index_bytes is None \
            else rows * (row_bytes + index_bytes)
    collectives = collective_summary(run)
    for name, entry in policy.items():
        # The reduce op decides what a gathered byte costs (Average adds one quotient at a time, Sum none).
        entry["reduce_op"] = next((c["reduce_op"] for c in collectives if c["name"] == name and c["reduce_op"]),
                                  "average")
    peaks = [r["peak_rss_bytes"] for r in ranks if r["peak_rss_bytes"]]
    steady = [r for r in ranks if r.get("steady_peak_rss_bytes")]
    top = max(steady, key=lambda r: r["steady_peak_rss_bytes"] or 0, default=None)
    by_name: list[Mapping[str, Any]] = list(ranks)  # read by a field's name

    def largest(key: str) -> int | None:
        values = [r[key] for r in by_name if r.get(key) is not None]
        return max(values) if values else None
    checks = [c for records in run.ranks.values() for c in records.reduction_checks]
    choices: list[dict[str, Any]] = []
    for records in run.ranks.values():
        for c in records.choices:
            choice = {k: v for k, v in c.items() if k not in ("type", "rank", "t", "step")}
            if choice not in choices:
                choices.append(choice)
    params = {"params_initial": {r: rec.get("digest") for r, records in run.ranks.items() for rec in records.params_initial},
              "params_final": {r: rec.get("digest") for r, records in run.ranks.items() for rec in records.params_final}}
    first_gradients: dict[str, dict[str, FirstGradient]] = {}
    for r, records in sorted(run.ranks.items()):
        for rec in records.first_gradients:
            first_gradients.setdefault(str(rec["name"]), {}).setdefault(str(r), {
                "step": rec.get("step"), "rows": rec.get("rows"), "indices_digest": rec.get("indices_digest"),
                "values_digest": rec.get("values_digest")})
    summary: RunSummary = {
        "format": rundir.SUMMARY_FORMAT,
        "workload": m.get("workload"),
        "script": m.get("script"),
        "preset": m.get("preset"),
        "mode": str(m.get("mode") or "unknown"),
        "world_size": int(m.get("world_size") or len(run.ranks)),
        "steps": m.get("steps"),
        "steps_recorded": max((r["steps_completed"] for r in ranks), default=0),
        "status": str(m.get("status") or "unknown"),
        "oversubscribed": m.get("oversubscribed"),
        "peak_rss_bytes_max": max(peaks) if peaks else None,
        # Steady state (docs/explanation/measurement.md): what comparisons and predictions use.
        "steady_peak_rss_bytes_max": largest("steady_peak_rss_bytes"),
        "steady": None if not steady else all(r["steady"] for r in steady),
        "first_step_peak_rss_bytes_max": largest("first_step_peak_rss_bytes"),
        "compute_peak_rss_bytes_max": largest("compute_peak_rss_bytes"),
        "collective_peak_rss_bytes_max": largest("collective_peak_rss_bytes"),
        "collective_live_peak_bytes_max": largest("collective_live_peak_bytes"),
        # tensors whose allgathers one grouped call made alive together (the live model counts them as one)
        "allgather_groups": [list(g) for g in sorted({tuple(g) for live in lives.values() for g in live[1]})],
        "peak_phase": None if top is None else top["peak_phase"],
        "throughput_items_per_s": throughput,
        "ranks": ranks,
        "collectives": collectives,
        "policy": sorted(policy.values(), key=lambda p: p["name"]),
        # What the script asked Horovod for (DistributedGradientTape / DistributedOptimizer arguments).
        "script_choices": choices,
        "changes_to_job": m.get("changes_to_job", []),
        "memory_environment": m.get("memory_environment", {}),
        "initial_params_digest": params["params_initial"].get(0),
        "final_params_digest": params["params_final"].get(0),
        # a comparison's runs: each IndexedSlices gradient the first time it was reduced, per rank, before any
        # mode changed it (what tells the script's own randomness from a mode's effect)
        "first_gradients": dict(sorted(first_gradients.items())),
        "steps_detail": steps,
        "consistency": consistency,
        "reduction_checks": checks,
        "distinct_rows": distinct_rows_summary(run),
        "engine": m.get("engine", "horovod"),
        # What the first rank to start ran on (TensorFlow, Keras, Horovod, MPI), from its start record.
        "versions": next((r.start.get("versions", {}) for _, r in sorted(run.ranks.items()) if r.start), {}),
        "padding": padding_summary(run),  # tf-distribute: MWMS's zero rows per tensor
        "failure": diagnose(run),
        "warnings": list(run.warnings),
    }
    if summary["engine"] == "horovod":
        labelling = next((str(r.get("error")) for records in run.ranks.values() for r in records.bookkeeping
                          if str(r.get("what", "")).startswith("label")), None)
        not_applied = [r for records in run.ranks.values() for r in records.not_applied]
        summary["mode_applied"] = mode_applied(summary["mode"], collectives, summary["policy"],
                                               not_applied_reasons(not_applied), labelling)
    attribution = attribution_entry(run.path)
    if attribution is not None:  # only when the run has memray files
        summary["attribution"] = attribution
    return summary
