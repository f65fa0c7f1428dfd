"""How a rank file is laid out, shared by the agent that writes it and every reader of it.

Which steps keep their RSS samples and which only their aggregates, what the aggregates are, what
makes two collective records of one kind (so that later steps' collectives can be written as one
``collective_calls`` record), and how a series is thinned. The writer is memdiag/format/writer.py;
the readers are memdiag/format/reader.py, the analysis and the plots. docs/reference/records.md is the reference.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from memdiag.format.records import MemAggregates, MemRecord

# The layout's version, in every start record's ``format`` (none: 1). Format 1's policy records gave
# ``rows_per_rank``, a rank's own rows or the agreed ones depending on the mode; format 2 gives
# ``local_rows`` and ``agreed_rows`` (:func:`upgrade_policy` converts).
RECORDS_FORMAT = 2

# Steps written in full: the set-up and steps 0 .. FULL_STEPS-1 keep their RSS samples and have one
# ``collective`` record per collective. Later steps keep their samples only on SERIES_PER_DOUBLING
# evenly spaced steps of every doubling of the step count (32, 34, ..., 62; 64, 68, ..., 124; ...).
FULL_STEPS = 32
SERIES_PER_DOUBLING = 16
# Fields of a collective record that change from call to call; the others make its kind.
VARYING_FIELDS = frozenset(("step", "t", "shape_in", "shape_out", "bytes_in", "bytes_out", "kind"))


def upgrade_policy(entry: dict[str, Any]) -> dict[str, Any]:
    """A policy record (or a summary.json policy entry) written before ``agreed_rows``, in place: its
    ``rows_per_rank`` was the agreed rows where the ranks agreed (mode auto, or an engine named: every mode
    of MultiWorkerMirroredStrategy) and the rank's own rows elsewhere, which ``local_rows`` holds too."""
    if "rows_per_rank" in entry and "agreed_rows" not in entry:
        rows = entry.pop("rows_per_rank")
        entry["agreed_rows"] = rows if entry.get("mode") == "auto" or entry.get("engine") else None
        entry.setdefault("local_rows", None if entry["agreed_rows"] is not None else rows)
    return entry


def keeps_series(step: int) -> bool:
    """Whether the ``mem`` record of ``step`` carries its samples (``times``, ``rss``): the set-up,
    steps 0 .. FULL_STEPS-1, then SERIES_PER_DOUBLING evenly spaced steps of every doubling. A run of
    S steps keeps about FULL_STEPS + SERIES_PER_DOUBLING * log2(S / FULL_STEPS) series."""
    if step < FULL_STEPS:
        return True
    stride = 1 << max(0, step.bit_length() - 1 - (SERIES_PER_DOUBLING.bit_length() - 1))
    return step % stride == 0


class SeriesPolicy:
    """Which steps keep their samples: :func:`keeps_series`, and every step until the first one with a
    collective window, so that the compute peak (RSS before the first gradient reduction, see
    memdiag.analyze.steady) is always read from samples."""

    def __init__(self) -> None:
        self._window_seen = False

    def keep(self, step: int, window_start: float | None) -> bool:
        keep = keeps_series(step) or not self._window_seen
        if window_start is not None and step >= 0:
            self._window_seen = True
        return keep


def in_window(t: float, start: float | None, end: float | None) -> bool:
    """Whether a sample at ``t`` lies in a step's collective window (as memdiag.analyze.steady counts)."""
    return start is not None and t >= start and (end is None or t <= end)


def mem_aggregates(times: Sequence[float], rss: Sequence[int], window_start: float | None = None,
                   window_end: float | None = None) -> MemAggregates:
    """A step's RSS samples reduced to what every reader needs: count, first, last, min, max (and when
    it was reached), mean, and the largest sample inside the step's collective window."""
    n = len(rss)
    if not n:
        return MemAggregates(n=0)
    top = max(range(n), key=rss.__getitem__)
    result = MemAggregates(n=n, t_first=times[0], rss_first=rss[0], t_last=times[-1], rss_last=rss[-1],
                           rss_min=min(rss), rss_max=rss[top], t_max=times[top], rss_mean=round(sum(rss) / n))
    inside = [r for t, r in zip(times, rss) if in_window(t, window_start, window_end)]
    if inside:
        result["rss_max_window"] = max(inside)
    return result


def mem_record(step: int, times: list[float], rss: list[int], window_start: float | None,
               window_end: float | None, keep_series: bool) -> MemRecord:
    # MemAggregates is a part of MemRecord; mypy's extra checks refuse a ** of keys that may be absent
    record = MemRecord(type="mem", step=step, **mem_aggregates(times, rss, window_start, window_end))  # type: ignore[typeddict-item]
    if keep_series:
        record["times"], record["rss"] = times, rss
    return record



def decimate(times: list[float], rss: list[int]) -> tuple[list[float], list[int]]:
    """Half the samples: each pair becomes the larger RSS at the time it was seen."""
    kept_t, kept_r = [], []
    for i in range(0, len(rss) - 1, 2):
        j = i if rss[i] >= rss[i + 1] else i + 1
        kept_t.append(times[j])
        kept_r.append(rss[j])
    if len(rss) % 2:
        kept_t.append(times[-1])
        kept_r.append(rss[-1])
    return kept_t, kept_r
