"""Native marks made into records: while the rank runs (its drain), and after it was killed outright.

A mark (memdiag.nativemarks) is a fixed-size record in a ring: which key, begin or end, when, the
shapes, the resident pages. The key stands for a collective's op and fields, known when the graph was
traced. :func:`dispatch` hands a batch of marks to the rank's tracer in time order; the tracer ends
steps and writes their records.

Drained in batches (``memdiag run --record-every S``, by default once a second), the steps since the
last drain exist only as marks when a rank is killed outright (the kernel's OOM killer, ``kill -9``):
no handler runs. So a script's rank keeps its ring and the timer's samples in a file mapped shared
(``rank-K.marks.bin``, which outlives the process in the page cache) and writes each key as it is
made (``rank-K.marks.keys``, a JSON object a line). A rank that ends, however it ends while it still
runs (success, an error, SIGTERM), drains and deletes both. Where they are still there when the run
ends, :func:`recover` replays the marks after the rank's last written step through a tracer of its
own and appends the steps they complete to the rank's records. The step the rank was in is not
complete and stays unwritten: a killed rank loses at most that step, as when every step was drained.

What a replayed step lacks: the kernel's high-water mark of its window (its peak is the sampled one,
``exact_peak`` false) and what the rank's own hooks add at a step's end. Collective records that the
rank's once-a-second flush wrote already are not written twice.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import threading
from typing import Any

import numpy as np
from typing_extensions import TypeAlias

from memdiag.agent.sampler import HighWaterMark, MemorySampler
from memdiag.format import rundir
from memdiag.format.reader import read_rank_file
from memdiag.format.records import CollectiveRecord, ReplayedRecord
from memdiag.nativemarks import BEGIN, RSS, read_ring_file, shape


def expected_bytes(op: str, meta: dict[str, Any], shape: list[int], world_size: int) -> int:
    """What a collective starting on a tensor of ``shape`` will receive: an allgather every rank's of
    its process set (or of the job), any other op its own size."""
    ranks = meta["process_set_size"] or world_size
    return int(math.prod(shape) * meta["itemsize"] * (ranks if op == "allgather" else 1))


# Per shape a mark stands for (a begin's tensor; an end's tensor and output): the shape itself where it
# was known when the graph was built, None where the mark's next input holds it.
StaticShapes: TypeAlias = "list[list[int] | None]"
Marked: TypeAlias = "tuple[str, dict[str, Any], int, StaticShapes | None]"


def mark_shapes(record: Any, static: StaticShapes) -> list[list[int]]:
    """The shapes a mark stands for: those kept with its key, the others from its inputs in order."""
    shapes, i = [], 0
    for known in static:
        if known is not None:
            shapes.append(known)
        else:
            shapes.append(shape(record, i) or [])
            i += 1
    return shapes


GROUP = "group"  # a key standing for several collectives: ``{"members": [their keys]}``, all marked at once


def group_members(marked: list[Marked], key: int) -> list[int]:
    """The keys a group key stands for (a key that is no group stands for itself)."""
    op, meta, _, _ = marked[key]
    return list(meta["members"]) if op == GROUP else [key]


def dispatch(tracer: Any, marked: list[Marked], records: Any) -> None:
    """Hand ``tracer`` the marks ``records`` (rows of memdiag.nativemarks.Marks.read) in the order of their
    times, each with its time; ``marked``: what each key stands for (op, fields, the world size for a
    begin, the shapes known when the graph was built). A group's mark stands for each of its members,
    with its time (their shapes are all known when the graph was built)."""
    records = records[np.argsort(records[:, 4], kind="stable")]
    # The RSS each mark read where the graph reached it: samples at the phases' edges, put among
    # the sampler's before any record can end a step (a step's samples are cut by time).
    read = records[:, RSS] >= 0
    tracer.sampler.add_marks((records[read, 4] / 1e9).tolist(), records[read, RSS].tolist())
    # as Python ints, converted at once (reading numpy scalars one by one costs more than the rest)
    for record in records.tolist():
        t = record[4] / 1e9
        for key in group_members(marked, record[1]):
            op, meta, extra, static = marked[key]
            if record[2] == BEGIN:
                [shape_in] = mark_shapes(record, static or [None])
                tracer.begin_collective(meta, expected_bytes(op, meta, shape_in, extra), in_graph=True, t=t)
            else:
                shape_in, shape_out = mark_shapes(record, static or [None, None])
                tracer.collective(meta, shape_in, shape_out, t=t)


class KeysFile:
    """``rank-K.marks.keys``: what each native mark's key stands for, a line per key, written when the
    key is made."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._file = open(path, "w", encoding="utf-8")  # noqa: SIM115 - open for the rank's life

    def add(self, key: int, op: str, meta: dict[str, Any], extra: int, static: StaticShapes | None) -> None:
        line = json.dumps({"key": key, "op": op, "meta": meta, "extra": extra, "static": static},
                          separators=(",", ":"), default=str)
        with self._lock:
            self._file.write(line + "\n")
            self._file.flush()

    def add_member(self, group: int, member: int) -> None:
        """A member joins group key ``group`` after the group's own line (a group that grows as the graph
        is built: memdiag.agent.collective_records)."""
        with self._lock:
            self._file.write(json.dumps({"group": group, "member": member}) + "\n")
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            self._file.close()


def read_keys(path: str) -> list[Marked]:
    """The keys of ``path`` in key order (a line cut short by the kill ends the list)."""
    marked: list[Marked] = []
    with open(path, encoding="utf-8") as file:
        for line in file:
            try:
                entry = json.loads(line)
            except ValueError:
                break
            if "group" in entry:  # a member added to a group key written earlier
                group, member = entry["group"], entry.get("member")
                if not (isinstance(group, int) and 0 <= group < len(marked) and marked[group][0] == GROUP
                        and isinstance(member, int) and 0 <= member < len(marked)):
                    break
                marked[group][1]["members"].append(member)
                continue
            if entry.get("key") != len(marked):
                break
            marked.append((entry["op"], entry["meta"], int(entry["extra"]), entry.get("static")))  # None: every shape an input
    return marked


def remove_files(spool: str, rank: int) -> None:
    for name in (rundir.marks_file(rank), rundir.keys_file(rank)):
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(spool, name))


def recover(run_dir: str, ranks: range) -> dict[int, ReplayedRecord]:
    """Replay the marks files the ranks of ``ranks`` left in ``run_dir`` (ranks killed outright) into
    their records, and delete the files. Returns each replayed rank's ``replayed`` record."""
    done: dict[int, ReplayedRecord] = {}
    for rank in ranks:
        marks = os.path.join(run_dir, rundir.marks_file(rank))
        if not os.path.exists(marks):
            continue
        try:
            record = _replay(run_dir, rank, marks)
        except (OSError, ValueError, KeyError, IndexError, TypeError) as exc:
            record = _write_replayed(run_dir, rank, ReplayedRecord(type="replayed", error=f"{type(exc).__name__}: {exc}"))
        if record is not None:
            done[rank] = record
        remove_files(run_dir, rank)
    return done


def _write_replayed(run_dir: str, rank: int, record: ReplayedRecord) -> ReplayedRecord:
    """Write ``record`` to the rank's records, with the marks file it was replayed from as its ``source``."""
    from memdiag.format.writer import RecordWriter

    record["source"] = rundir.marks_file(rank)
    writer = RecordWriter(os.path.join(run_dir, rundir.rank_file(rank)), rank)
    writer.write_now(record)
    writer.close()
    return record


class _Known:
    """What the rank's records say of where it was (read as memdiag.format.reader reads them): its last step and
    that step's end, whether it ended, its run peak, whether its steps are stepped by gradient reductions,
    the latest collective written."""

    def __init__(self, path: str, rank: int) -> None:
        records = read_rank_file(path, rank)
        self.start = records.start
        self.ended = records.end is not None
        last = max(records.steps, key=lambda s: s["step"], default=None)
        self.last_step: int | None = last["step"] if last is not None else None
        self.last_end: float | None = float(last["t_end"]) if last is not None else None
        self.hwm = max((int(s.get("hwm_bytes") or 0) for s in records.steps), default=0)
        calls = list(records.collectives)
        self.gradient = any(c.get("gradient") for c in calls)
        self.written_until = max((float(c["t"]) for c in calls if "t" in c), default=-math.inf)


def _replay(run_dir: str, rank: int, marks_path: str) -> ReplayedRecord | None:
    from memdiag.agent.tracer import Tracer
    from memdiag.format.writer import RecordWriter

    rank_path = os.path.join(run_dir, rundir.rank_file(rank))
    keys_path = os.path.join(run_dir, rundir.keys_file(rank))
    if not os.path.exists(rank_path) or not os.path.exists(keys_path):
        return None
    known = _Known(rank_path, rank)
    if known.ended or known.start is None:
        return None  # it ended, and drained everything first; or it never started measuring
    ring = read_ring_file(marks_path)
    marked = read_keys(keys_path)
    # after the last written step; or, where none was, everything the file holds (the set-up step began
    # before the start record, when the rank's tracer was made)
    since = known.last_end if known.last_end is not None else 0.0
    times = ring.records[:, 4] / 1e9
    records_at = (times >= since) & (ring.records[:, 1] < len(marked))
    records = ring.records[records_at]
    overwritten = ring.head - len(ring.records)
    if not len(records):
        return None
    if overwritten and (not len(ring.records) or ring.records[0, 4] / 1e9 > since):
        # marks after the last written step were written over (more than the ring holds): the steps they
        # began cannot be told apart
        return _write_replayed(run_dir, rank, ReplayedRecord(
            type="replayed", from_t=since, steps=None, marks=0,
            error="the ring was written over past the last written step"))

    writer = RecordWriter(rank_path, rank)
    sampler = _ReplaySampler(since)
    # the heaps read now would be this process's, not the rank's: not read
    tracer = Tracer(writer, sampler, rank, auto_steps=True, hwm=_NoHighWaterMark(known.hwm, sampler), read_heap=False)
    tracer._collective_records = _FullRecords(writer, known.written_until)  # type: ignore[assignment]
    samples = [(t, p) for t, p in zip(ring.sample_times, ring.sample_pages) if t > since]
    if known.last_step is not None:
        # as the rank left it when it wrote that step: the next one begun at its end, stepped by the
        # collectives of the anchor's kind (the mark that began it comes first, at that very time)
        tracer.step = known.last_step + 1
        tracer._step_start = since
        tracer._anchor, tracer._anchor_is_gradient = ("replayed",), known.gradient
        tracer._started = set()
    else:  # the set-up step, from the first mark or sample the file holds
        tracer._step_start = min([float(times[records_at].min()), *(t for t, _ in samples[:1])])
    sampler.add_samples([t for t, _ in samples], [p for _, p in samples])
    first = tracer.step
    dispatch(tracer, marked, records)
    writer.discard()  # the step the rank was in: not complete, not written (as the rank would not have)
    writer.close()
    last = tracer.step - 1
    if last < first:
        return None  # no step ended after the last one written: the rank lost only the step it was in
    return _write_replayed(run_dir, rank, ReplayedRecord(type="replayed", from_t=since, steps=[first, last],
                                                         marks=len(records), samples=len(samples)))


class _ReplaySampler(MemorySampler):
    """The series a replay's tracer reads: the timer's samples and the marks' RSS from the file, never
    this process's memory. Its thread is never started."""

    def __init__(self, since: float) -> None:
        super().__init__()
        self._since = since
        self.highest = 0  # the largest sample replayed

    def sample(self) -> int:
        return self._rss[-1] if self._rss else 0

    def _insert(self, t: float, value: int, at: int | None = None) -> None:
        self.highest = max(self.highest, value)
        super()._insert(t, value, at)

    def add_samples(self, times: list[float], pages: list[int]) -> None:
        self._add_late(times, pages, self._insert)

    def pull_timer(self) -> None:
        pass

    def restart_peak(self) -> None:  # the tracer begins a replayed step only at a mark's time
        pass

    def mark_now(self) -> None:  # every replayed mark has its time
        pass


class _NoHighWaterMark(HighWaterMark):
    """No window's exact peak (the rank's kernel mark died with it); the run peak as the records and the
    replayed steps' sampled peaks give it. Reads and resets nothing of this process."""

    def __init__(self, known: int, sampler: _ReplaySampler) -> None:
        self.resettable = False
        self._known = known
        self._sampler = sampler

    def start(self) -> None:
        pass

    def peak(self) -> None:
        return None

    def run_peak(self, read: bool = True) -> int:
        return max(self._known, self._sampler.highest)


class _FullRecords:
    """Every replayed collective as a full record, with no kind number (the rank's numbers are its own),
    and none the rank's records hold already (written at its once-a-second flush)."""

    def __init__(self, writer: Any, written_until: float) -> None:
        self.writer = writer
        self.written_until = written_until

    def add(self, record: CollectiveRecord, key: Any = None) -> Any:
        if record.get("t", math.inf) > self.written_until + 1e-6:
            self.writer.add(record)
        return key if key is not None else object()

    def add_call(self, key: Any, step: int, t: float | None, shape_in: Any, shape_out: Any) -> None:
        return None
