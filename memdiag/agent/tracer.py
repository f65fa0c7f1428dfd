"""Step bookkeeping and collective records for one rank.

Built-in workloads mark steps explicitly (:meth:`Tracer.begin_step` / :meth:`Tracer.end_step`).
Each step is split by phase: the collective window runs from the first gradient reduction to start until
the last one completes (a built-in workload's window runs on to the step's end, through the optimizer's
apply that consumes the reduced gradients); the rest of the step is compute. The step record says how
much RSS rose in each. The bytes of
collective outputs received in a step (with Horovod's averaged copy of gathered values) are summed: all
of them are alive until the step's update has consumed them.

A step's memory figures are measured from its beginning to its end: what runs between two steps (the
parameter digest, rank 0's parameter save, the warm-up vote) is in no step, and memdiag's own work
inside a step (:meth:`Tracer.own_work`) is cut out of it; each such span is written as an ``own_work``
record with its own peak.

A user's script is not changed, so its steps are found from the collectives themselves: the first
gradient reduction to start is the anchor (a script that reduces no gradient through Horovod's gradient
functions is stepped by its first collective that is not a broadcast). Called eagerly, collectives start
in the script's order, and a new step begins each time the anchor starts again. Inside a graph they
start as their inputs are ready, in no fixed order (memdiag.graphcalls): there a new step begins when a
collective of the anchor's kind starts that has started already in the current step, whichever it is
(a graph names each collective once: memdiag.agent.naming numbers unnamed ones from one call site). What
comes before the first anchor (initial broadcasts, model building) is the set-up step, -1.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from time import perf_counter
from typing import Any, TypedDict, cast

from memdiag.agent import heap
from memdiag.agent.sampler import HighWaterMark, MemorySampler
from memdiag.format.layout import SeriesPolicy, mem_record
from memdiag.format.records import SETUP_STEP, CollectiveRecord, InFlight, OwnWorkRecord, Received, StepRecord, WaitingRecord
from memdiag.format.writer import CollectiveRecords, RecordWriter

# Collective record fields that only some engines' hooks give (memdiag.agent.hooks_tf).
OPTIONAL_FIELDS = ("engine", "stage", "padded", "pack_members")


@dataclass
class _Span:
    """Part of a step's memory figures: its sampled peak, the high-water mark's exact peak (None:
    unknown), and its samples."""

    sampled: int
    exact: int | None
    times: list[float]
    rss: list[int]


# The most collective metas whose kind key the tracer remembers (memdiag.format.writer.CollectiveRecords).
KIND_KEYS_KEPT = 4096
# The share of the steps' time that reading glibc's heaps' freed bytes may take (Tracer._heap_free): a read
# takes microseconds in most jobs and up to 18 ms in one with tens of thousands of free chunks (docs/notes)
HEAP_BUDGET = 0.002


class Tracer:
    def __init__(
        self,
        writer: RecordWriter,
        sampler: MemorySampler,
        rank: int,
        auto_steps: bool,
        max_steps: int | None = None,
        hwm: HighWaterMark | None = None,
        read_heap: bool = True,
    ) -> None:
        self.writer = writer
        self.sampler = sampler
        self.rank = rank
        self.auto_steps = auto_steps
        self.max_steps = max_steps
        self.step = SETUP_STEP
        self._step_start = time.time()
        # glibc's heaps' freed bytes (memdiag.agent.heap): a read walks every free chunk, from microseconds
        # to tens of milliseconds in a job with tens of thousands, so the reads keep within HEAP_BUDGET of
        # the steps' time: the seconds they took, the last one's, and the steps' seconds so far
        self._heap_spent = 0.0
        self._heap_last = 0.0
        self._read_heap = read_heap  # False: a replay's, in another process than the rank's
        self._steps_s = 0.0
        # The set-up step runs from the tracer's creation (the sampler's series began before it); a
        # later step's figures begin with the step.
        self._in_step = True
        self._spans: list[_Span] = []  # the current step's figures before memdiag's own work cut them
        self.hwm = HighWaterMark() if hwm is None else hwm  # another: a replay's (memdiag.agent.replay)
        self._lock = threading.RLock()
        self._anchor: tuple[Any, ...] | None = None
        self._anchor_is_gradient = False
        self._started: set[tuple[Any, ...]] = set()  # collectives of the anchor's kind started this step
        self._pending: dict[tuple[Any, ...], dict[str, Any]] = {}  # collectives started, not yet completed
        self._received: list[Received] = []  # collectives completed in the current step
        self._reported_waits: set[tuple[Any, ...]] = set()
        self._window: list[float | None] = [None, None]  # the step's collective window (start, end)
        self._live_bytes = 0  # outputs of the step's collectives other than allgathers
        self._gathered: dict[str, int] = {}  # per tensor: its allgather outputs (values and indices)
        self._quotient_bytes = 0
        self.on_step_end: list[Callable[[int], dict[str, Any] | None]] = []
        self.step_peaks: list[int] = []  # peak RSS of each training step (step >= 0), in order
        self._collective_records = CollectiveRecords(writer)  # compact after the first steps
        # per collective's meta (by identity, the meta held here so that its id is not reused: in a graph the
        # hooks keep one per call site; eager calls make a new one each, so this is emptied when full), its
        # records' kind key
        self._kind_keys: dict[int, tuple[dict[str, Any], Any]] = {}
        self._series = SeriesPolicy()  # which steps' mem records keep their samples
        # Marks written by the native op (memdiag.nativemarks) reach the tracer when something drains
        # them: the sampler thread, and each entry point below before it takes the lock.
        self.drain: Callable[[], None] | None = None

    # -- steps -------------------------------------------------------------------------------
    def _drained(self) -> None:
        """Hand the tracer the native marks read since the last drain, unless this thread holds the
        tracer's lock: the drain takes its own lock and then the tracer's (from the sampler thread
        too), so draining with the tracer's lock held could wait on a drain that waits on it (a step
        ended inside a collective's begin, memdiag's own work at a step's end)."""
        if self.drain is not None and not cast(Any, self._lock)._is_owned():  # CPython RLock: held by this thread
            self.drain()

    def begin_step(self, step: int, at: float | None = None) -> None:
        """A step begins now, or at ``at`` (a time already past: a native mark read late, right after
        the step before ended at the same time, whose samples since then belong to this step)."""
        self._drained()
        with self._lock:
            self.step = step
            self._step_start = time.time() if at is None else at
            if not self._in_step and at is None:  # what ran since the last step ended belongs to no step
                self.sampler.restart_peak()
            self._in_step = True
            self._spans = []
            self.hwm.start()
            self._received = []
            self._window = [None, None]
            self._live_bytes = 0
            self._gathered = {}
            self._quotient_bytes = 0

    def _heap_free(self, step_time_s: float) -> int | None:
        """glibc's heaps' freed bytes for this step's record, where a read now keeps the reads' seconds
        within HEAP_BUDGET of the steps' seconds so far (the first step's is always read); else None."""
        self._steps_s += max(0.0, step_time_s)
        if not self._read_heap:
            return None
        if self._heap_spent + self._heap_last > HEAP_BUDGET * self._steps_s and self._heap_spent > 0:
            return None
        started = perf_counter()
        found = heap.free_bytes()
        self._heap_last = perf_counter() - started
        self._heap_spent += self._heap_last
        return found

    def end_step(self, step: int | None = None, at: float | None = None, **extra: Any) -> None:
        """Write the step's memory record and everything buffered during it, then flush. ``at``: the
        step ended at that time, already past (a native mark read late): the samples after it are
        the next step's. The kernel's high-water mark, read now, holds everything since the step began:
        read within two sampling intervals of the step's end (a drain at every wake, whose wake can run
        late) it is the step's exact peak; read later (marks drained in a batch, ``--record-every``), it
        holds later steps too, so the step keeps its sampled peak (``exact_peak`` false) and the mark
        counts only in the run's peak (``hwm_bytes``)."""
        self._drained()
        with self._lock:
            step = self.step if step is None else step
            now = time.time() if at is None else at
            exact_now = self.hwm.peak()
            late = at is not None and time.time() - at > 2 * self.sampler.interval_s
            spans = [*self._spans, self._take_span(None if late else exact_now, until=at)]
            self._spans = []
            self._in_step = False
            sampled = max(span.sampled for span in spans)
            times = [t for span in spans for t in span.times]
            rss = [r for span in spans for r in span.rss]
            # The high-water mark since the step began (or since memdiag's own work in it ended): the
            # exact peak, which catches allocations shorter than the sampling interval.
            exact = [span.exact for span in spans if span.exact is not None]
            peak = max([sampled, *exact])
            start, end = self._window
            if start is not None and not self.auto_steps:
                end = now
            rises = phase_rises(times, rss, start, end)
            record = StepRecord(
                type="step",
                step=step,
                t_start=self._step_start,
                t_end=now,
                step_time_s=now - self._step_start,
                peak_rss_bytes=peak,
                sampled_peak_rss_bytes=sampled,
                hwm_bytes=self.hwm.run_peak(read=False),  # read by hwm.peak() above
                exact_peak=len(exact) == len(spans),
                window_start=rises["window_start"],
                window_end=rises["window_end"],
                compute_rise_bytes=rises["compute_rise_bytes"],
                collective_rise_bytes=rises["collective_rise_bytes"],
                peak_phase=rises["peak_phase"],
                collective_live_peak_bytes=self._live_collective_bytes(),
            )
            heap_free = self._heap_free(record["step_time_s"])
            if heap_free is not None:
                record["heap_free_bytes"] = heap_free
            # The fields the step's hooks and its caller add, by name (loss, items, param_digest, tail,
            # warmup): declared in StepRecord, checked on real runs' records (undeclared_fields).
            fields = cast("dict[str, Any]", record)
            if self.on_step_end:
                # After the step's figures are taken: what the hooks allocate belongs to no step.
                with self.own_work("on_step_end"):
                    for hook in self.on_step_end:
                        fields.update(hook(step) or {})
            fields.update({k: _finite(v) for k, v in extra.items()})
            if step >= 0:
                self.step_peaks.append(peak)
            if times:
                self.writer.add(mem_record(step, times, rss, start, end, self._series.keep(step, start)))
            self.writer.add(record)
            self.writer.flush()

    def _take_span(self, exact: int | None, until: float | None = None) -> _Span:
        """The sampler's peak and samples since the step began or memdiag's own work in it ended
        (``until``: up to that time only)."""
        sampled, times, rss = self.sampler.take_step(until)
        return _Span(sampled, exact, times, rss)

    @contextmanager
    def own_work(self, what: str) -> Iterator[None]:
        """memdiag's own work (saving or digesting parameters, verification copies): in a step, it is
        cut out of the step's figures (its samples dropped, the peak and the high-water mark taken
        before it and again after it); between steps, it is in none. Either way an ``own_work`` record
        gives its span, the RSS before and after it, and its peak."""
        self._drained()
        with self._lock:
            before = self._take_span(self.hwm.peak())
            if self._in_step:
                self._spans.append(before)
            self.hwm.start()
            t_start = time.time()
        try:
            yield
        finally:
            with self._lock:
                sampled, times, rss = self.sampler.take_step()  # the span's samples belong to no step
                exact = self.hwm.peak()
                self.hwm.start()
                self.writer.add(OwnWorkRecord(
                    type="own_work", what=what, step=self.step, within_step=self._in_step,
                    # the span ends with take_step's last sample: every sample the step keeps is later
                    t_start=t_start, t_end=times[-1] if times else time.time(), rss_before_bytes=before.rss[-1],
                    peak_rss_bytes=sampled if exact is None else max(sampled, exact), rss_after_bytes=rss[-1],
                ))

    def finish(self) -> None:
        """End the step in progress of an auto-stepped script: its tail, which holds what the script
        did after its last step (saving, evaluating), marked so that the steady state can leave it out."""
        if self.auto_steps:
            self.end_step(tail=True)

    # -- collectives -------------------------------------------------------------------------
    def collective(self, meta: dict[str, Any], shape_in: list[int], shape_out: list[int],
                   extra: dict[str, Any] | None = None, t: float | None = None) -> None:
        """Record one collective that has completed, with its runtime shapes; ``extra``: fields known
        at run time only (the padding of a tf-distribute gather); ``t``: when it completed, where that
        is past (a native mark read late; otherwise RSS is sampled now, see :meth:`begin_collective`)."""
        if t is None:
            self.sampler.mark_now()
        with self._lock:
            itemsize = meta["itemsize"]
            known = self._kind_keys.get(id(meta)) if not extra else None
            if known is not None:
                # a call of a kind already written, in a step written compactly: no full record made
                done = self._collective_records.add_call(known[1], self.step, t, shape_in, shape_out)
                if done is not None:
                    self._completed(meta, done, math.prod(shape_out) * itemsize)
                    return
            record = CollectiveRecord(
                type="collective",
                step=self.step,
                op=meta["op"],
                name=meta["name"],
                part=meta.get("part"),
                dtype=meta["dtype"],
                itemsize=itemsize,
                shape_in=shape_in,
                shape_out=shape_out,
                bytes_in=math.prod(shape_in) * itemsize,
                bytes_out=math.prod(shape_out) * itemsize,
                sparse=meta["sparse"],
                densified=meta["densified"],
                merged=meta.get("merged", False),
                grouped=meta.get("grouped", False),
                gradient=meta.get("gradient", False),
                reduce_op=meta.get("reduce_op"),
                process_set_size=meta.get("process_set_size"),
            )
            # Fields of the tf-distribute engine, absent from Horovod's records, and those the caller
            # knows (``extra``), by name: declared in CollectiveRecord, checked on real runs' records.
            fields = cast("dict[str, Any]", record)
            fields.update({k: meta[k] for k in OPTIONAL_FIELDS if k in meta})
            if extra:
                fields.update(extra)
            if t is not None:
                record["t"] = t
            if known is not None:
                self._collective_records.add(record, known[1])
            else:
                key = self._collective_records.add(record)
                if not extra:
                    if len(self._kind_keys) >= KIND_KEYS_KEPT:
                        self._kind_keys.clear()
                    self._kind_keys[id(meta)] = (meta, key)
            self._completed(meta, record["t"], record["bytes_out"])

    def _completed(self, meta: dict[str, Any], t: float, bytes_out: int) -> None:
        """The step's figures after a collective completed at ``t`` with ``bytes_out`` (lock held)."""
        if meta.get("gradient"):
            self._window[1] = t
        if meta["op"] == "allgather":
            self._gathered[meta["name"]] = self._gathered.get(meta["name"], 0) + bytes_out
        else:
            self._live_bytes += bytes_out
        self._quotient_bytes = max(self._quotient_bytes, quotient_bytes(meta, bytes_out))
        key = (meta["op"], meta["name"], meta.get("part"))
        self._pending.pop(key, None)
        self._reported_waits.discard(key)
        self._received.append({"op": meta["op"], "name": meta["name"], "part": meta.get("part"),
                               "bytes_out": bytes_out})

    def _live_collective_bytes(self) -> int:
        """The step's collective outputs alive at once: every output other than an allgather's, one
        tensor's gathered outputs (the largest) and one quotient (the largest): Horovod completes the
        allgathers one after another, and each gathered output is freed once its quotient is made
        (memdiag.analyze.model.MemoryModel.held_bytes)."""
        return self._live_bytes + max(self._gathered.values(), default=0) + self._quotient_bytes

    def begin_collective(self, meta: dict[str, Any], expected_bytes_out: int, in_graph: bool = False,
                         t: float | None = None) -> None:
        """A collective starts (``in_graph``: marked from inside a graph, where collectives start in no
        fixed order; ``t``: it started then, already past: a native mark read late, whose RSS the
        drain hands the sampler; otherwise RSS is sampled now, at the edge of the phases)."""
        if t is None:
            self.sampler.mark_now()
        with self._lock:
            now = time.time() if t is None else t
            if self.auto_steps:
                self._advance_auto_step(meta, in_graph, t)
            if meta.get("gradient") and self._window[0] is None:
                self._window[0] = now
            key = (meta["op"], meta["name"], meta.get("part"))
            self._pending[key] = {"op": meta["op"], "name": meta["name"], "part": meta.get("part"),
                                  "bytes_out": expected_bytes_out, "since": now}

    def abandon_collective(self, op: str, name: str) -> None:
        """Collectives marked as started that never ran (Horovod refused their arguments)."""
        with self._lock:
            for key in [k for k in self._pending if k[:2] == (op, name)]:
                del self._pending[key]
                self._reported_waits.discard(key)

    def report_long_wait(self, after_s: float = 2.0) -> None:
        """Record a collective not completed after ``after_s`` (a hang in the making): the one receiving
        the most bytes of those overdue, and nothing more while it is still pending; once it completes,
        the next overdue. A hang's report reads a rank's last such record (memdiag.analyze.failure).
        Collectives marked as one group complete together (a function graph's all-reduces in Horovod's
        conds end with the graph's last), so a step whose reduction spans longer than ``after_s``
        leaves one record, not one per collective."""
        self._drained()
        with self._lock:
            if any(key in self._pending for key in self._reported_waits):
                return
            now = time.time()
            overdue = [(key, pending) for key, pending in self._pending.items()
                       if key not in self._reported_waits and now - pending["since"] >= after_s]
            if not overdue:
                return
            key, pending = max(overdue, key=lambda item: item[1]["bytes_out"])
            self._reported_waits.add(key)
            self.writer.add(WaitingRecord(type="waiting", step=self.step, op=pending["op"], name=pending["name"],
                                          part=pending["part"], bytes_out=pending["bytes_out"], since=pending["since"]))

    def in_flight(self) -> InFlight | None:
        """The collective this rank is inside now: of those started and not completed, the one
        receiving the most bytes (None if none)."""
        self._drained()
        with self._lock:
            if not self._pending:
                return None
            largest = max(self._pending.values(), key=lambda p: p["bytes_out"])
            return {"op": largest["op"], "name": largest["name"], "part": largest["part"],
                    "bytes_out": largest["bytes_out"], "others_in_flight": len(self._pending) - 1}

    def freeze(self) -> tuple[int, InFlight | None]:
        """Stop the tracer where it is, for good (the process exits next): hand it the native marks
        not yet read, then take its lock and keep it, so that no step ends after this; return the step
        in progress (between two steps, the next one: every step before it has its record) and the
        collective in flight."""
        in_flight = self.in_flight()  # drains the marks first
        self._lock.acquire()
        step = self.step if self._in_step or self.step < 0 else self.step + 1
        return step, in_flight

    def largest_received(self, count: int = 3) -> list[Received]:
        """The largest collective outputs of the current step: buffers that may still be alive."""
        with self._lock:
            return sorted(self._received, key=lambda r: -r["bytes_out"])[:count]

    def _advance_auto_step(self, meta: dict[str, Any], in_graph: bool, at: float | None = None) -> None:
        if meta["op"] == "broadcast":
            return  # the initial broadcast is set-up, never a step
        key = (meta["op"], meta["name"], meta.get("part"))
        gradient = bool(meta.get("gradient"))
        if self._anchor is not None and gradient and not self._anchor_is_gradient:
            # A script whose first collective was its own (a metric, SyncBatchNorm's statistics):
            # the first gradient reduction takes over as the anchor, within the current step.
            self._anchor, self._anchor_is_gradient = key, True
            self._started = {key}
            return
        if self._anchor is None:
            self._anchor, self._anchor_is_gradient = key, gradient
        elif self._anchor_is_gradient and not gradient:
            return  # not of the anchor's kind
        elif (key not in self._started) if in_graph else (key != self._anchor):
            self._started.add(key)
            return
        self.end_step(at=at)
        self.begin_step(self.step + 1, at=at)
        self._started = {key}


def quotient_bytes(meta: dict[str, Any], bytes_out: int) -> int:
    """The second buffer a gathered output needs: Horovod divides gathered values by N (op=Average) into
    a tensor as large, alive until the tensor's update, and frees the dividend when the quotient is
    made. A step's live collective bytes count the largest such quotient once
    (memdiag.analyze.model.MemoryModel.held_bytes)."""
    averaged = meta.get("reduce_op") in (None, "average")
    return bytes_out if meta["op"] == "allgather" and meta.get("part") == "values" and averaged else 0


class PhaseRises(TypedDict):
    """What RSS rose by in a step's compute and in its collective window (fields of its step record)."""

    window_start: float | None
    window_end: float | None
    compute_rise_bytes: int
    collective_rise_bytes: int
    peak_phase: str


def phase_rises(times: list[float], rss: list[int], start: float | None, end: float | None) -> PhaseRises:
    """How much RSS rose during the step's compute and during its collective window.

    Allocators keep what they have been given (RSS hardly falls within a run), so a step's peak is
    mostly what earlier steps left; what a phase adds is where the memory goes. A step's
    ``peak_phase`` is the phase that raised RSS most, or ``held`` when neither raised it by 1 MiB.
    """
    rises = {"compute": 0, "collectives": 0}
    for i in range(1, len(rss)):
        if rss[i] > rss[i - 1]:
            t = times[i]
            inside = start is not None and t >= start and (end is None or t <= end)
            rises["collectives" if inside else "compute"] += rss[i] - rss[i - 1]
    phase = max(rises, key=lambda k: rises[k]) if max(rises.values()) >= 2**20 else "held"
    return PhaseRises(window_start=start, window_end=end, compute_rise_bytes=rises["compute"],
                      collective_rise_bytes=rises["collectives"], peak_phase=phase)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
