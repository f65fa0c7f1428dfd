"""The rank's record file: ``rank-K.jsonl``, one JSON object a line, append-only.

Records of a step are buffered and written with one flush when the step ends, so a rank that is
killed loses at most the step it was in. Every record carries ``type``; see docs/reference/records.md.

A long run stays small (docs/explanation/overhead.md): every step has its ``step`` record and a ``mem`` record
of RSS aggregates, but only some steps keep their RSS samples (:func:`memdiag.format.layout.keeps_series`), and after the
first :data:`memdiag.format.layout.FULL_STEPS` steps a step's collectives are written as one ``collective_calls`` record
(which kind, when, and the shapes when they differ from the kind's first call) rather than one
``collective`` record each. Readers (:mod:`memdiag.format.reader`) expand them back into collective records.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Hashable
from typing import Any, cast

from memdiag.format.layout import FULL_STEPS, VARYING_FIELDS
from memdiag.format.records import CollectiveCallsRecord, CollectiveRecord, Record


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

    def add(self, record: Record) -> None:
        """Queue a record (made with its class in :mod:`memdiag.format.records`, which mypy checks it
        against); it reaches the file at the next :meth:`flush`. Stamps ``rank`` and ``t`` where absent."""
        fields = cast("dict[str, Any]", record)
        fields.setdefault("rank", self.rank)
        fields.setdefault("t", time.time())
        if next(iter(fields)) != "type":  # the type first, always: a reader can tell a line's kind by it
            fields = {"type": fields.get("type"), **fields}
        line = json.dumps(fields, separators=(",", ":"), default=_jsonable)
        with self._lock:
            self._pending.append(line)

    def write_now(self, record: Record) -> None:
        self.add(record)
        self.flush()

    def discard(self) -> None:
        """Drop the records queued since the last flush (a replay's step that never ended)."""
        with self._lock:
            self._pending = []

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

    def add(self, record: CollectiveRecord, key: Hashable | None = None) -> Hashable:
        """Write (or buffer) one completed collective's full record; sets its ``t`` and ``rank``.
        ``key``: the record's kind as an earlier call returned it for a record with the same fields other
        than VARYING_FIELDS (computed here when None). Returns the kind."""
        record.setdefault("rank", self.writer.rank)
        record.setdefault("t", time.time())
        if key is None:
            key = _kind_key(cast("dict[str, Any]", record))
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
                return key
            self._append_call(known, step, record["t"], record.get("shape_in"), record.get("shape_out"))
            return key

    def add_call(self, key: Hashable, step: int, t: float | None, shape_in: Any, shape_out: Any) -> float | None:
        """Buffer one call of a kind already written (``key`` as :meth:`add` returned it) without its
        full record, where :meth:`add` would write it in the compact form, and return its time (``t``,
        or now, as :meth:`add` would set it); None (nothing done) where it would not: the kind is new
        here, or ``step`` is one whose calls are written in full."""
        with self._lock:
            known = self._kinds.get(key)
            if known is None or step < FULL_STEPS:
                return None
            if t is None:
                t = time.time()
            self._append_call(known, step, t, shape_in, shape_out)
            return t

    def _append_call(self, known: tuple[int, Any, Any], step: int, t: float, shape_in: Any, shape_out: Any) -> None:
        if self._step is not None and step != self._step:
            self._emit()
        if self._step is None:
            self._step, self._t0 = step, t
        kind, first_in, first_out = known
        if shape_in != first_in or shape_out != first_out:
            self._shapes.append([len(self._kind), shape_in, shape_out])
        self._kind.append(kind)
        self._us.append(round((t - self._t0) * 1e6))

    def flush(self) -> None:
        with self._lock:
            self._emit()

    def _emit(self) -> None:
        if not self._kind:
            return
        record = CollectiveCallsRecord(type="collective_calls", step=cast(int, self._step), t0=self._t0,
                                       kind=self._kind, us=self._us)
        if self._shapes:
            record["shapes"] = self._shapes
        self.writer.add(record)
        self._step, self._kind, self._us, self._shapes = None, [], [], []

