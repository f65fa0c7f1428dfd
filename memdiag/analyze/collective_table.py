"""The collectives table of ``summary.json`` (``collectives[]``): one entry per (tensor, op, part).

Added up over every rank's training steps. Also the bytes a rank received per op, and a rank's
collectives as a :class:`CollectiveLog`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from memdiag.format.reader import CollectiveLog, Run
from memdiag.format.results import CollectiveSummary


def collective_log(collectives: Sequence[Mapping[str, Any]]) -> CollectiveLog:
    return collectives if isinstance(collectives, CollectiveLog) else CollectiveLog(collectives)


def bytes_per_op(collectives: Sequence[Mapping[str, Any]], step_ids: set[int]) -> dict[str, int]:
    """Bytes received per op over the collectives of the steps ``step_ids``."""
    log = collective_log(collectives)
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
        for key, (last_call, b_in, b_out, total, calls, steps) in _tensors_of_rank(collective_log(records.collectives)).items():
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
        last = collective_log(run.ranks[rank].collectives)[position]
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
