"""The rank's record file: ``rank-K.jsonl``, one JSON object a line, append-only.

Records of a step are buffered and written with one flush when the step ends, so a rank that is
killed loses at most the step it was in. Every record carries ``type``; see docs/records.md.

A long run stays small (docs/performance.md): every step has its ``step`` record and a ``mem`` record
of RSS aggregates, but only some steps keep their RSS samples (:func:`keeps_series`), and after the
first :data:`FULL_STEPS` steps a step's collectives are written as one ``collective_calls`` record
(which kind, when, and the shapes when they differ from the kind's first call) rather than one
``collective`` record each. Readers (:mod:`memdiag.collect`) expand them back into collective records.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any, Callable, Hashable, Sequence

# Steps written in full: the set-up and steps 0 .. FULL_STEPS-1 keep their RSS samples and have one
# ``collective`` record per collective. Later steps keep their samples only on SERIES_PER_DOUBLING
# evenly spaced steps of every doubling of the step count (32, 34, ..., 62; 64, 68, ..., 124; ...).
FULL_STEPS = 32
SERIES_PER_DOUBLING = 16
# Fields of a collective record that change from call to call; the others make its kind.
VARYING_FIELDS = frozenset(("step", "t", "shape_in", "shape_out", "bytes_in", "bytes_out", "kind"))


class RecordWriter:
    def __init__(self, path: str, rank: int) -> None:
        self.path = path
        self.rank = rank
        self._lock = threading.Lock()
        self._pending: list[str] = []
        # Called at every flush, before the pending lines are written (outside the writer's lock):
        # what buffers records of its own adds them there (compact collective calls).
        self.before_flush: list[Callable[[], None]] = []
        # O_APPEND: a restarted or concurrent writer can never truncate what is there.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._file = os.fdopen(fd, "w", encoding="utf-8")

    def add(self, record: dict[str, Any]) -> None:
        """Queue a record; it reaches the file at the next :meth:`flush`."""
        record.setdefault("rank", self.rank)
        record.setdefault("t", time.time())
        line = json.dumps(record, separators=(",", ":"), default=_jsonable)
        with self._lock:
            self._pending.append(line)

    def write_now(self, record: dict[str, Any]) -> None:
        self.add(record)
        self.flush()

    def flush(self) -> None:
        for hook in self.before_flush:
            hook()
        with self._lock:
            lines, self._pending = self._pending, []
            if lines:
                self._file.write("\n".join(lines) + "\n")
            self._file.flush()

    def close(self) -> None:
        self.flush()
        self._file.close()


def _jsonable(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    if hasattr(value, "item"):
        return value.item()
    return str(value)


# -- RSS samples ---------------------------------------------------------------------------------

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
                   window_end: float | None = None) -> dict[str, Any]:
    """A step's RSS samples reduced to what every reader needs: count, first, last, min, max (and when
    it was reached), mean, and the largest sample inside the step's collective window."""
    n = len(rss)
    if not n:
        return {"n": 0}
    top = max(range(n), key=rss.__getitem__)
    result: dict[str, Any] = {
        "n": n, "t_first": times[0], "rss_first": rss[0], "t_last": times[-1], "rss_last": rss[-1],
        "rss_min": min(rss), "rss_max": rss[top], "t_max": times[top], "rss_mean": round(sum(rss) / n)}
    inside = [r for t, r in zip(times, rss) if in_window(t, window_start, window_end)]
    if inside:
        result["rss_max_window"] = max(inside)
    return result


def mem_record(step: int, times: list[float], rss: list[int], window_start: float | None,
               window_end: float | None, keep_series: bool) -> dict[str, Any]:
    record: dict[str, Any] = {"type": "mem", "step": step,
                              **mem_aggregates(times, rss, window_start, window_end)}
    if keep_series:
        record["times"], record["rss"] = times, rss
    return record


# -- collectives ---------------------------------------------------------------------------------

def _kind_key(record: dict[str, Any]) -> Hashable:
    static = tuple((k, v) for k, v in record.items() if k not in VARYING_FIELDS)
    try:
        hash(static)
    except TypeError:  # a list among the fields: compare them as JSON
        return json.dumps(static, sort_keys=True, default=str)
    return static


class CollectiveRecords:
    """Writes a rank's collective records.

    A collective's *kind* is everything in its record but the step, the time and the shapes. The
    first call of each kind, and every call of the set-up and of the first FULL_STEPS steps, is a full
    ``collective`` record carrying its ``kind`` number. Other calls are buffered and written, at the
    writer's next flush (the end of the step, or the once-a-second flush of a long step), as one
    ``collective_calls`` record per step: the kind of each call, its completion time in microseconds
    after the record's ``t0``, and its shapes when they differ from the kind's first call.
    """

    def __init__(self, writer: RecordWriter) -> None:
        self.writer = writer
        self._lock = threading.Lock()
        self._kinds: dict[Hashable, tuple[int, Any, Any]] = {}  # kind -> (number, shapes of its first call)
        self._step: int | None = None
        self._t0 = 0.0
        self._kind: list[int] = []
        self._us: list[int] = []
        self._shapes: list[list[Any]] = []
        writer.before_flush.append(self.flush)

    def add(self, record: dict[str, Any]) -> None:
        """Write (or buffer) one completed collective's full record; sets its ``t`` and ``rank``."""
        record.setdefault("rank", self.writer.rank)
        record.setdefault("t", time.time())
        key = _kind_key(record)
        step = record.get("step")
        with self._lock:
            known = self._kinds.get(key)
            if known is None or not isinstance(step, int) or step < FULL_STEPS:
                if known is None:
                    known = (len(self._kinds), record.get("shape_in"), record.get("shape_out"))
                    self._kinds[key] = known
                record["kind"] = known[0]
                self._emit()  # calls buffered before this one go first: the file stays in time order
                self.writer.add(record)
                return
            if self._step is not None and step != self._step:
                self._emit()
            if self._step is None:
                self._step, self._t0 = step, record["t"]
            kind, shape_in, shape_out = known
            if record.get("shape_in") != shape_in or record.get("shape_out") != shape_out:
                self._shapes.append([len(self._kind), record.get("shape_in"), record.get("shape_out")])
            self._kind.append(kind)
            self._us.append(round((record["t"] - self._t0) * 1e6))

    def flush(self) -> None:
        with self._lock:
            self._emit()

    def _emit(self) -> None:
        if not self._kind:
            return
        record: dict[str, Any] = {"type": "collective_calls", "step": self._step, "t0": self._t0,
                                  "kind": self._kind, "us": self._us}
        if self._shapes:
            record["shapes"] = self._shapes
        self.writer.add(record)
        self._step, self._kind, self._us, self._shapes = None, [], [], []

