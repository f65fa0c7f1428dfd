"""Read a run directory back into one result: the manifest and every rank's records.

A rank killed mid-write leaves a truncated last line; a damaged disk can leave garbage. What can be
read is kept, and what cannot is counted and reported as a warning, never an exception.

Record files are read line by line, and what a long run repeats is held compactly, so reading a run
takes memory for its steps, not for its collectives or RSS samples (docs/explanation/overhead.md):

- collective records, written in full (``collective``) or compactly (``collective_calls``, see
  :mod:`memdiag.format.writer`), all go into one :class:`CollectiveLog` per rank, which keeps each
  distinct kind and shape once and per call only four numbers, and gives the full records back;
- ``mem`` records keep their samples only for the steps the ranks keep them for
  (:func:`memdiag.format.writer.keeps_series`); every step keeps its aggregates. A run written before
  ranks aggregated their samples has them computed here, with the same rule for which samples stay.
"""

from __future__ import annotations

import glob
import json
import math
import os
from array import array
from collections.abc import Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast, overload

from memdiag._errors import UserError
from memdiag.format.layout import RECORDS_FORMAT, VARYING_FIELDS, SeriesPolicy, mem_aggregates, upgrade_policy
from memdiag.format.manifest import RunManifest, read_manifest
from memdiag.format.records import (
    BookkeepingRecord,
    ChoicesRecord,
    CollectiveRecord,
    DistinctRowsRecord,
    EndRecord,
    FirstGradientRecord,
    KilledRecord,
    MemRecord,
    NotAppliedRecord,
    OwnWorkRecord,
    ParamsFinalRecord,
    ParamsInitialRecord,
    PolicyRecord,
    ReductionCheckRecord,
    ReplayedRecord,
    StartRecord,
    StepRecord,
    TerminatedRecord,
    WaitingRecord,
)
from memdiag.format.rundir import MPIRUN_LOG, RANK_FILE, RANK_GLOB

_NO_TIME = math.nan
_WHOLE = -1  # a record kept as it was read (fields missing or of unexpected types)


class CollectiveLog(Sequence[CollectiveRecord]):
    """One rank's collective records in file order, held compactly.

    A record's kind (every field but the step, the time, the shapes and the bytes) and its shapes are
    stored once each; per record only the kind, step, time and shapes are numbers in arrays. Indexing
    and iterating build each record afresh as a dict, as it was written (or, for a compact call, as
    the rank would have written it in full). A record that does not fit (a field missing or of an
    unexpected type) is kept as it was read.
    """

    def __init__(self, records: Iterable[Mapping[str, Any]] = ()) -> None:
        self._statics: list[dict[str, Any]] = []
        self._static_index: dict[Hashable, int] = {}
        self._shapes: list[tuple[tuple[int, ...], tuple[int, ...], int, int]] = []
        self._shape_index: dict[tuple[Any, ...], int] = {}
        self._kind = array("l")
        self._step = array("q")
        self._t = array("d")
        self._shape = array("l")
        self._whole: dict[int, dict[str, Any]] = {}
        self._defined: dict[int, tuple[int, int]] = {}  # a rank's kind number -> (kind, shape) it was defined with
        self.unknown_calls = 0  # compact calls whose kind no full record defined
        for record in records:
            self.append(record)

    # -- building --------------------------------------------------------------------------------
    def append(self, record: Mapping[str, Any]) -> None:
        """Add one collective record (a dict as written by a rank)."""
        self._append_own(dict(record))

    def _append_own(self, record: dict[str, Any]) -> None:
        """:meth:`append` of a record nobody else holds: its varying fields are taken out of it."""
        step, t = record.get("step"), record.get("t", _NO_TIME)
        shape_in, shape_out = record.get("shape_in"), record.get("shape_out")
        bytes_in, bytes_out = record.get("bytes_in"), record.get("bytes_out")
        if not (type(step) is int and type(t) in (float, int) and type(shape_in) is list
                and type(shape_out) is list and type(bytes_in) is int and type(bytes_out) is int):
            self._push_whole(record)
            return
        try:
            shape = self._intern_shape(shape_in, shape_out, bytes_in, bytes_out)
        except TypeError:  # a shape that is not a list of numbers
            self._push_whole(record)
            return
        number = record.get("kind")
        for name in VARYING_FIELDS:
            record.pop(name, None)
        kind = self._intern_static(record)
        self._push(kind, step, float(t), shape)
        if type(number) is int:
            self._defined.setdefault(number, (kind, shape))

    def extend_calls(self, record: dict[str, Any]) -> bool:
        """Add the calls of a ``collective_calls`` record; False if the record is not one."""
        step, t0, kinds, us = record.get("step"), record.get("t0"), record.get("kind"), record.get("us")
        if not (type(step) is int and type(t0) in (float, int) and isinstance(kinds, list)
                and isinstance(us, list) and len(kinds) == len(us)):
            return False
        shapes: dict[int, tuple[Any, Any]] = {}
        for entry in record.get("shapes") or []:
            if isinstance(entry, list) and len(entry) == 3 and type(entry[0]) is int:
                shapes[entry[0]] = (entry[1], entry[2])
        if not shapes:  # the usual case: every call as its kind's first; added a list at a time
            try:
                pairs = [self._defined[number] for number in kinds]
                times = [t0 + offset / 1e6 for offset in us]
            except (KeyError, TypeError):
                pass
            else:
                self._kind.extend([kind for kind, _ in pairs])
                self._shape.extend([shape for _, shape in pairs])
                self._step.extend([step] * len(pairs))
                self._t.extend(times)
                return True
        for i, (number, offset) in enumerate(zip(kinds, us)):
            defined = self._defined.get(number) if type(number) is int else None
            if defined is None or type(offset) not in (int, float):
                self.unknown_calls += 1
                continue
            kind, shape = defined
            if i in shapes:
                try:
                    shape = self._resized(kind, shape, *shapes[i])
                except (TypeError, ValueError):
                    self.unknown_calls += 1
                    continue
            self._push(kind, step, t0 + offset / 1e6, shape)
        return True

    def _resized(self, kind: int, defined: int, shape_in: Any, shape_out: Any) -> int:
        itemsize = self._statics[kind].get("itemsize")
        if type(itemsize) is not int:  # written without it: the defining call's bytes per element
            d_in, _, b_in, _ = self._shapes[defined]
            itemsize = b_in // max(1, math.prod(d_in))
        return self._intern_shape(list(shape_in), list(shape_out), math.prod(shape_in) * itemsize,
                                  math.prod(shape_out) * itemsize)

    def _intern_static(self, static: dict[str, Any]) -> int:
        key: Hashable = tuple(static.items())
        try:
            index = self._static_index.get(key)
        except TypeError:  # a list among the fields: compare them as JSON
            key = json.dumps(static, sort_keys=True, default=str)
            index = self._static_index.get(key)
        if index is None:
            index = self._static_index[key] = len(self._statics)
            self._statics.append(static)
        return index

    def _intern_shape(self, shape_in: list[Any], shape_out: list[Any], bytes_in: int, bytes_out: int) -> int:
        key = (tuple(shape_in), tuple(shape_out), bytes_in, bytes_out)
        index = self._shape_index.get(key)  # TypeError: not a shape
        if index is None:
            index = self._shape_index[key] = len(self._shapes)
            self._shapes.append(key)
        return index

    def _push(self, kind: int, step: int, t: float, shape: int) -> None:
        self._kind.append(kind)
        self._step.append(step)
        self._t.append(t)
        self._shape.append(shape)

    def _push_whole(self, record: dict[str, Any]) -> None:
        self._whole[len(self._kind)] = record
        self._push(_WHOLE, 0, _NO_TIME, _WHOLE)

    # -- reading ---------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._kind)

    @overload
    def __getitem__(self, index: int) -> CollectiveRecord: ...

    @overload
    def __getitem__(self, index: slice) -> list[CollectiveRecord]: ...

    def __getitem__(self, index: int | slice) -> CollectiveRecord | list[CollectiveRecord]:
        if isinstance(index, slice):
            return [self._record(i) for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError("collective record index out of range")
        return self._record(index)

    def __iter__(self) -> Iterator[CollectiveRecord]:
        for i in range(len(self._kind)):
            yield self._record(i)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (CollectiveLog, list)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"CollectiveLog({len(self)} records of {len(self._statics)} kinds)"

    def _record(self, i: int) -> CollectiveRecord:
        kind = self._kind[i]
        if kind == _WHOLE:
            return cast(CollectiveRecord, self._whole[i])
        record = cast(CollectiveRecord, dict(self._statics[kind]))
        record["step"] = self._step[i]
        t = self._t[i]
        if t == t:  # not NaN: the record had a time
            record["t"] = t
        shape_in, shape_out, bytes_in, bytes_out = self._shapes[self._shape[i]]
        record["shape_in"], record["shape_out"] = list(shape_in), list(shape_out)
        record["bytes_in"], record["bytes_out"] = bytes_in, bytes_out
        return record

    @property
    def kinds(self) -> list[dict[str, Any]]:
        """The distinct kinds: every field but step, time, shapes and bytes (shared: do not change)."""
        return self._statics

    def columns(self) -> tuple[Any, Any, Any, Any]:
        """(kind, step, bytes in, bytes out) of every record, as numpy arrays in file order: what
        per-step and per-tensor figures need, without a dict per record. ``kind`` indexes
        :attr:`kinds`; it is -1 for a record kept whole (:meth:`whole`), whose other columns are 0."""
        import numpy as np

        kind = np.frombuffer(self._kind, dtype=f"i{self._kind.itemsize}").astype(np.int64)
        step = np.frombuffer(self._step, dtype=f"i{self._step.itemsize}").astype(np.int64)
        shape = np.frombuffer(self._shape, dtype=f"i{self._shape.itemsize}")
        # index -1 (a record kept whole) reads the 0 appended at the end of each table
        bytes_in = np.array([s[2] for s in self._shapes] + [0], dtype=np.int64)[shape]
        bytes_out = np.array([s[3] for s in self._shapes] + [0], dtype=np.int64)[shape]
        step[kind == _WHOLE] = 0
        return kind, step, bytes_in, bytes_out

    def whole(self) -> Iterator[tuple[int, dict[str, Any]]]:
        """(position, record) of each record kept as it was read."""
        return iter(sorted(self._whole.items()))


def mem_points(record: Mapping[str, Any]) -> list[tuple[float, int]]:
    """A ``mem`` record's RSS over time: its samples when it kept them, otherwise the points its
    aggregates give (first sample, the largest, last sample), in time order."""
    times, rss = record.get("times"), record.get("rss")
    if isinstance(times, list) and isinstance(rss, list):
        return list(zip(times, rss))
    points: list[tuple[float, int]] = []
    for t_key, r_key in (("t_first", "rss_first"), ("t_max", "rss_max"), ("t_last", "rss_last")):
        t, r = record.get(t_key), record.get(r_key)
        if isinstance(t, (int, float)) and isinstance(r, int):
            points.append((t, r))
    return sorted(set(points))


@dataclass
class RankRecords:
    rank: int
    start: StartRecord | None = None
    end: EndRecord | None = None
    killed: KilledRecord | None = None
    steps: list[StepRecord] = field(default_factory=list)
    collectives: CollectiveLog = field(default_factory=CollectiveLog)
    policies: list[PolicyRecord] = field(default_factory=list)
    memory: list[MemRecord] = field(default_factory=list)
    reduction_checks: list[ReductionCheckRecord] = field(default_factory=list)
    waiting: list[WaitingRecord] = field(default_factory=list)
    choices: list[ChoicesRecord] = field(default_factory=list)
    params_initial: list[ParamsInitialRecord] = field(default_factory=list)
    params_final: list[ParamsFinalRecord] = field(default_factory=list)
    distinct_rows: list[DistinctRowsRecord] = field(default_factory=list)
    first_gradients: list[FirstGradientRecord] = field(default_factory=list)
    not_applied: list[NotAppliedRecord] = field(default_factory=list)
    bookkeeping: list[BookkeepingRecord] = field(default_factory=list)
    own_work: list[OwnWorkRecord] = field(default_factory=list)
    terminated: list[TerminatedRecord] = field(default_factory=list)
    replayed: list[ReplayedRecord] = field(default_factory=list)
    other: list[dict[str, Any]] = field(default_factory=list)  # kinds this reader does not know

    def side_records(self) -> Iterator[Mapping[str, Any]]:
        """Every record beside the start, steps, memory, collectives, policies and end: each typed list,
        then the kinds this reader does not know."""
        for records in (self.reduction_checks, self.waiting, self.choices, self.params_initial, self.params_final,
                        self.distinct_rows, self.first_gradients, self.not_applied, self.bookkeeping, self.own_work,
                        self.terminated, self.replayed, self.other):
            yield from records
    bad_lines: int = 0


@dataclass
class Run:
    path: str
    manifest: RunManifest
    ranks: dict[int, RankRecords]
    warnings: list[str] = field(default_factory=list)
    log: str = ""


class _MemoryRecords:
    """``mem`` records into ``out``. Ranks aggregate their samples (``n`` ...); a record written before
    they did has only samples: it waits for its step's record (the collective window) to be aggregated
    here, and keeps its samples only where a rank would (SeriesPolicy)."""

    def __init__(self, out: list[MemRecord]) -> None:
        self.out = out
        self._pending: dict[Any, dict[str, Any]] = {}
        self._policy = SeriesPolicy()

    def add(self, record: dict[str, Any]) -> None:
        if "n" in record or not isinstance(record.get("times"), list):
            self.out.append(cast(MemRecord, record))
            return
        step = record.get("step")
        earlier = self._pending.pop(step, None) if isinstance(step, int) else None
        if earlier is not None:  # the earlier one never got its step record
            self._aggregate(earlier, None, None, decide=False)
        self._pending[step] = record

    def step_ended(self, step_record: StepRecord) -> None:
        step = step_record.get("step")
        record = self._pending.pop(step, None) if isinstance(step, int) else None
        if record is not None:
            self._aggregate(record, step_record.get("window_start"), step_record.get("window_end"), decide=True)

    def finish(self) -> None:
        for record in self._pending.values():
            self._aggregate(record, None, None, decide=False)
        self._pending.clear()

    def _aggregate(self, record: dict[str, Any], start: Any, end: Any, decide: bool) -> None:
        try:
            record.update(mem_aggregates(record["times"], record["rss"], start, end))
        except (KeyError, TypeError, ValueError, IndexError):  # samples that are not numbers: kept as read
            decide = False
        step = record.get("step")
        if decide and isinstance(step, int) and not self._policy.keep(step, start):
            del record["times"], record["rss"]
        self.out.append(cast(MemRecord, record))


def parse_records(lines: Iterable[bytes] | Iterable[str], rank: int) -> RankRecords:
    """Sort each readable record into its kind; count lines that are not records. ``lines`` may be
    any iterable of lines (a file opened in binary mode: read as it goes)."""
    result = RankRecords(rank)
    # The records are read as JSON and typed by their ``type``: a field's value is what the rank wrote
    # (readers check types where a damaged file could mislead them).
    buckets: dict[str, list[Any]] = {
        "reduction_check": result.reduction_checks, "waiting": result.waiting, "choices": result.choices,
        "params_initial": result.params_initial, "params_final": result.params_final,
        "distinct_rows": result.distinct_rows, "first_gradient": result.first_gradients,
        "not_applied": result.not_applied, "bookkeeping": result.bookkeeping, "own_work": result.own_work,
        "terminated": result.terminated, "replayed": result.replayed,
    }
    memory = _MemoryRecords(result.memory)
    version = 1  # the records' format, until the start record says (memdiag.format.layout.RECORDS_FORMAT)
    for raw in lines:
        if isinstance(raw, bytes):
            try:
                raw = raw.decode("utf-8")
            except UnicodeDecodeError:
                result.bad_lines += 1
                continue
        raw = raw.strip()
        if not raw:
            continue
        record = parse_line(raw)
        if record is None:
            result.bad_lines += 1
            continue
        kind = record["type"]
        if kind == "collective":
            result.collectives._append_own(record)
        elif kind == "collective_calls":
            if not result.collectives.extend_calls(record):
                result.bad_lines += 1
        elif kind == "mem":
            memory.add(record)
        elif kind == "step":
            step = cast(StepRecord, record)
            result.steps.append(step)
            memory.step_ended(step)
        elif kind == "start":
            result.start = cast(StartRecord, record)
            version = record.get("format", 1)
            if not isinstance(version, int) or version > RECORDS_FORMAT:
                raise UserError(f"rank {rank}'s records are in format {version!r}, newer than this memdiag reads "
                                f"(up to {RECORDS_FORMAT}): read them with the memdiag that wrote them, or upgrade")
        elif kind == "end":
            result.end = cast(EndRecord, record)
        elif kind == "killed":
            result.killed = cast(KilledRecord, record)
        elif kind == "policy":
            result.policies.append(cast(PolicyRecord, upgrade_policy(record) if version < 2 else record))
        else:
            buckets.get(kind, result.other).append(record)
    memory.finish()
    return result


def bookkeeping_warnings(records: RankRecords) -> list[str]:
    """What memdiag could not record on a rank (the job went on unchanged): one line per kind of
    failure, with its count (from the end record; 1 or more where the rank did not end) and first error."""
    counts = records.end.get("bookkeeping_failures") if records.end else None
    lines = []
    for record in records.bookkeeping:
        what = record.get("what")
        count = counts.get(what) if isinstance(counts, dict) and isinstance(what, str) else None
        times = f"{count} time(s)" if isinstance(count, int) else "at least once"
        lines.append(f"rank {records.rank}: memdiag could not {what} ({times}; first: {record.get('error')}); "
                     "the job ran unchanged, and the figures leave that out")
    return lines


_TYPE_FIRST = b'{"type":"'  # how every record line begins (memdiag.format.writer writes the type first)


def line_kind(line: bytes) -> str | None:
    """A record line's type, read from its first field without parsing the line (a reader following a
    growing file skips the kinds it does not want at that cost); None: not a record line."""
    if not line.startswith(_TYPE_FIRST):
        return None
    end = line.find(b'"', len(_TYPE_FIRST))
    return line[len(_TYPE_FIRST):end].decode("ascii", "replace") if end > 0 else None


def parse_line(line: bytes | str) -> dict[str, Any] | None:
    """One record line as the record, or None where it is not one (cut short, damaged)."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    return record if isinstance(record, dict) and isinstance(record.get("type"), str) else None


def read_rank_file(path: str, rank: int) -> RankRecords:
    with open(path, "rb") as f:
        return parse_records(f, rank)


def load_run(path: str) -> Run:
    if not os.path.isdir(path):
        raise UserError(f"{path} is not a directory; give the run directory that `memdiag run` wrote")
    run = Run(path, read_manifest(path), {})
    for file in sorted(glob.glob(os.path.join(path, RANK_GLOB))):
        match = RANK_FILE.search(file)
        if not match:
            continue
        rank = int(match.group(1))
        records = read_rank_file(file, rank)
        run.ranks[rank] = records
        if records.bad_lines:
            run.warnings.append(f"rank {rank}: {records.bad_lines} unreadable line(s) in {os.path.basename(file)} skipped")
        run.warnings.extend(bookkeeping_warnings(records))
        if records.collectives.unknown_calls:
            run.warnings.append(f"rank {rank}: {records.collectives.unknown_calls} collective call(s) in "
                                f"{os.path.basename(file)} name a kind whose first record is unreadable; skipped")
    log = os.path.join(path, MPIRUN_LOG)
    if os.path.exists(log):
        with open(log, encoding="utf-8", errors="replace") as f:
            run.log = f.read()
    expected = run.manifest.get("world_size")
    if isinstance(expected, int):
        missing = [r for r in range(expected) if r not in run.ranks]
        if missing:
            run.warnings.append(f"no records from rank(s) {', '.join(map(str, missing))}")
    return run
