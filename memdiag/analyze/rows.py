"""The rows of each IndexedSlices gradient: its distinct rows, its rows as recorded, its rows per rank and gathered.

``distinct_rows[]`` of ``summary.json`` (:func:`distinct_rows_summary`), and the rows :func:`gradient_rows`
adds to each ``policy[]`` entry: each rank's own rows step by step as the records show them, else as the
graph was traced, and a table's rows from the parameters rank 0 saved.
"""

from __future__ import annotations

import bisect
import math
import os
import statistics
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from memdiag.analyze.collective_table import collective_log
from memdiag.format import rundir
from memdiag.format.reader import RankRecords, Run
from memdiag.format.records import DistinctRowsRecord
from memdiag.format.results import DistinctRowsSummary, PolicySummary


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
        log = collective_log(records.collectives)
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
