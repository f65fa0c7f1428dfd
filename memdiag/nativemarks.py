"""memdiag's marks of collectives inside a graph as a native TensorFlow op (the default; ``MEMDIAG_MARKS=python``
marks through Python instead).

A mark through Python is a call made from the graph (:func:`memdiag.graphcalls.host_call`): 40-70
us each, two per collective. The op of ``memdiag/native/mark_op.cc`` writes the same facts (which
mark, when, the shapes it was given) into a ring buffer in about a microsecond
(probes/native_mark/README.md), and the rank's tracer reads the ring from its sampler thread and
from each of its entry points (memdiag.agent.hooks.CollectiveHooks.drain), handing every record the
time the graph reached the op.

The library is built for one TensorFlow version (``python -m memdiag.nativemarks build``, run by
scripts/setup.sh) and loaded only under that version: another version's headers could load and crash
rather than fail. Where it is not built, does not load or ``MEMDIAG_MARKS=python`` is set, memdiag marks
through Python, and the rank's start record says which, and why (``marks``).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

ENV = "MEMDIAG_MARKS"  # "native" (the default): the op when it loads; "python": Python calls
HERE = Path(__file__).resolve().parent / "native"
SOURCE = HERE / "mark_op.cc"
LIBRARY = HERE / "_memdiag_mark.so"
BUILT_FOR = HERE / "_memdiag_mark.json"  # {"tensorflow": version built against, and calibrate()'s figures}
BEGIN, END = 0, 1
MAX_INPUTS, MAX_VALUES = 4, 8  # as mark_op.cc stores them
HEADER = 7  # index, key, kind, n_inputs, t_ns, tid, rss_pages
BUILD = "python -m memdiag.nativemarks build"
RSS = 6  # the word of a record that holds the resident pages when the mark ran (-1: not read)
RECORD_WORDS = HEADER + MAX_INPUTS * (1 + MAX_VALUES)  # as mark_op.cc lays a record out
TIMER_READ = 8192  # the timer's samples one read returns at most (as many as mark_op.cc holds)


def build(library: Path = LIBRARY) -> str | None:
    """Compile the op against the running TensorFlow; None when built, else why not (one line)."""
    try:
        import tensorflow as tf

        flags = [*tf.sysconfig.get_compile_flags(), *tf.sysconfig.get_link_flags()]
    except Exception as exc:  # noqa: BLE001 - no TensorFlow: nothing to build against
        return f"TensorFlow is not importable ({type(exc).__name__})"
    command = ["g++", "-std=c++17", "-O2", "-fPIC", "-shared", str(SOURCE), "-o", str(library), *flags]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"g++ could not run ({exc})"
    if done.returncode != 0:
        return f"g++ failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}"
    library.with_suffix(".json").write_text(json.dumps({"tensorflow": tf.__version__}))
    return None


class Marks:
    """The loaded op and its ring: :meth:`mark` puts a mark into the graph being built, :meth:`read`
    returns the records written since the last read."""

    def __init__(self, library: Path, ring_file: str | None = None) -> None:
        import tensorflow as tf

        self._ops = tf.load_op_library(str(library))
        c = ctypes.CDLL(str(library))  # the same handle: the ring TensorFlow's copy writes
        # The ring and the timer's samples in a file mapped shared (before the first mark), so that they
        # outlive a rank killed outright: memdiag.agent.replay makes them into records afterwards.
        self.ring_file: str | None = None
        if ring_file is not None and self._map(c, ring_file):
            self.ring_file = ring_file
        for name in ("memdiag_ring_capacity", "memdiag_ring_record_words", "memdiag_ring_head",
                     "memdiag_ring_prefault"):
            getattr(c, name).restype = ctypes.c_int64
        c.memdiag_ring_read.restype = ctypes.c_int64
        c.memdiag_ring_read.argtypes = [ctypes.POINTER(ctypes.c_int64), ctypes.c_int64, ctypes.c_int64]
        self._c = c
        self.ops_made = 0  # mark ops added to graphs (each a node every call of its graph runs)
        self.op_heap_bytes: int | None = None  # the C heap a mark op takes, as calibrate() measured it at the build
        self.op_resident_bytes: int | None = None  # and the resident memory (RSS) it takes, likewise
        self.words = int(c.memdiag_ring_record_words())
        self.capacity = int(c.memdiag_ring_capacity())
        self._next = int(c.memdiag_ring_head())  # records before this process's first read are not its
        # The ring and the reader's buffer are memdiag's own memory in the rank's RSS: both are made
        # resident now, before the script's first step, so that neither grows inside a measured step.
        self.resident_bytes = int(c.memdiag_ring_prefault())
        self._buffer = np.empty((self.capacity, self.words), dtype=np.int64)
        self._buffer.fill(0)
        self.resident_bytes += self._buffer.nbytes
        # the buffer never moves: its pointer made once (numpy's ctypes view costs more than the read)
        self._pointer = self._buffer.ctypes.data_as(ctypes.POINTER(ctypes.c_int64))
        self.lost = 0
        self._timer = self._timer_functions(c)
        self._timer_next = 0
        # resident now, as the marks' buffer is (np.zeros would leave its pages to the first reads)
        self._timer_t = np.empty(TIMER_READ, dtype=np.int64)
        self._timer_pages = np.empty(TIMER_READ, dtype=np.int64)
        self._timer_t.fill(0)
        self._timer_pages.fill(0)
        self._t_pointer = self._timer_t.ctypes.data_as(ctypes.POINTER(ctypes.c_int64))
        self._pages_pointer = self._timer_pages.ctypes.data_as(ctypes.POINTER(ctypes.c_int64))
        self._timer_first = ctypes.c_int64(0)
        self.resident_bytes += self._timer_t.nbytes + self._timer_pages.nbytes
        self.timer_lost = 0  # samples the timer wrote over before they were read

    @staticmethod
    def _map(c: Any, path: str) -> bool:
        """Move the library's ring into the file at ``path``; False where it could not (a library built
        before it could, a file that could not be made or mapped, marks written already)."""
        try:
            c.memdiag_ring_map.restype = ctypes.c_int64
            c.memdiag_ring_map.argtypes = [ctypes.c_char_p]
        except AttributeError:
            return False
        return int(c.memdiag_ring_map(os.fsencode(path))) == 0

    @staticmethod
    def _timer_functions(c: Any) -> Any:
        """The library's sampling timer, or None in a library built before it had one."""
        try:
            for name in ("memdiag_timer_start", "memdiag_timer_stop", "memdiag_timer_head"):
                getattr(c, name).restype = ctypes.c_int64
            c.memdiag_timer_start.argtypes = [ctypes.c_int64]
            c.memdiag_timer_read.restype = ctypes.c_int64
            c.memdiag_timer_read.argtypes = [ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_int64),
                                             ctypes.c_int64, ctypes.c_int64, ctypes.POINTER(ctypes.c_int64)]
        except AttributeError:
            return None
        return c

    def timer_start(self, interval_s: float) -> bool:
        """Read the resident pages every ``interval_s`` on a thread of the library's own (no Python, no
        GIL); False where the library has no timer or the thread did not start."""
        if self._timer is None:
            return False
        self._timer_next = int(self._timer.memdiag_timer_head())
        return int(self._timer.memdiag_timer_start(round(interval_s * 1e9))) == 0

    def timer_stop(self) -> float | None:
        """Stop the timer; its thread's CPU seconds (None: it was not running)."""
        if self._timer is None:
            return None
        cpu_ns = int(self._timer.memdiag_timer_stop())
        return cpu_ns / 1e9 if cpu_ns >= 0 else None

    def timer_read(self) -> tuple[list[float], list[int]]:
        """The timer's samples since the last read, oldest first: their times (seconds, the clock of
        ``time.time()``) and the resident pages then."""
        n = int(self._timer.memdiag_timer_read(self._t_pointer, self._pages_pointer, TIMER_READ,
                                              self._timer_next, ctypes.byref(self._timer_first)))
        first = self._timer_first.value
        self.timer_lost += max(0, first - self._timer_next)
        self._timer_next = max(self._timer_next, first + n)
        if n == 0:
            return [], []
        return (self._timer_t[:n] / 1e9).tolist(), self._timer_pages[:n].tolist()

    def mark(self, key: int, kind: int, shapes: list[Any]) -> Any:
        """The op marking ``key`` (``kind`` BEGIN or END) with ``shapes`` (1-D integer tensors, at most
        :data:`MAX_INPUTS` of at most :data:`MAX_VALUES` values each), marked as memdiag's own."""
        from memdiag.graphcalls import _mark

        op = self._ops.memdiag_mark(shapes=list(shapes), key=key, kind=kind)
        op = getattr(op, "op", op)
        _mark(op)
        self.ops_made += 1
        return op

    @property
    def through(self) -> bool:
        """Whether the library has the mark that hands tensors on (:meth:`mark_through`); one built from an
        earlier mark_op.cc has not."""
        return hasattr(self._ops, "memdiag_mark_through")

    def mark_through(self, key: int, kind: int, through: list[Any], shapes: list[Any],
                     record: list[int]) -> list[Any]:
        """The op marking ``key`` with ``shapes`` (as :meth:`mark`) and then the run-time shapes of the
        tensors of ``through`` listed in ``record``; its outputs, returned, are ``through`` handed on (the
        same buffers). For a graph that runs only what is fetched (a TF1 graph): fetching an output runs
        the mark, with no Identity and no Shape op beside it. A gradient passes through unchanged."""
        _register_through_gradient()
        outputs = self._ops.memdiag_mark_through(through=list(through), shapes=list(shapes), key=key, kind=kind,
                                                 record=list(record))
        self.ops_made += 1
        return list(outputs)

    def pending(self) -> int:
        """How many records were written since the last read (those a lapped ring lost included)."""
        return int(self._c.memdiag_ring_head()) - self._next

    def read(self) -> npt.NDArray[np.int64]:
        """The records written since the last read, in the order they were written (rows of
        ``words`` int64: index, key, kind, n_inputs, t_ns, tid, rss_pages, counts, values)."""
        n = self._c.memdiag_ring_read(self._pointer, self.capacity, self._next)
        if n == 0:
            return self._buffer[:0]
        records = self._buffer[:n].copy()
        first, last = int(records[0, 0]), int(records[-1, 0])
        self.lost += (first - self._next) + (last - first + 1 - n)  # overwritten before they were read
        self._next = last + 1
        return records


@functools.cache
def _register_through_gradient() -> None:
    """The gradient of MemdiagMarkThrough, once in a process: each output's gradient goes to the input it
    hands on unchanged, as an Identity's does; the shapes it records have none."""
    import tensorflow as tf

    def gradient(op: Any, *grads: Any) -> list[Any]:
        return [*grads, *([None] * (len(op.inputs) - len(grads)))]

    with contextlib.suppress(KeyError):  # registered already (a second Marks in one process)
        tf.RegisterGradient("MemdiagMarkThrough")(gradient)


def shape(record: npt.NDArray[np.int64] | list[int], i: int) -> list[int] | None:
    """Input ``i`` of a record (a row of :meth:`Marks.read`, or that row as a list) as a list (a shape),
    or None where it was not stored whole."""
    if i >= min(int(record[3]), MAX_INPUTS):
        return None
    count = int(record[HEADER + i])
    if count > MAX_VALUES:
        return None
    start = HEADER + MAX_INPUTS + i * MAX_VALUES
    return [int(v) for v in record[start:start + count]]


def load(environ: Any = None, ring_file: str | None = None) -> tuple[Marks | None, str]:
    """The native marks, unless ``MEMDIAG_MARKS=python`` asks for Python calls, when built for the running
    TensorFlow; else None. And a word on which marks the rank uses, and why, for its start record.
    ``ring_file``: keep the ring and the timer's samples in that file (:attr:`Marks.ring_file` says
    whether they are)."""
    environ = os.environ if environ is None else environ
    asked = environ.get(ENV, "native")
    if asked == "python":
        return None, "python"
    if asked != "native":
        return None, f"python ({ENV}={asked!r} is neither native nor python)"
    import tensorflow as tf

    try:
        built_for = json.loads(BUILT_FOR.read_text())
        built = built_for.get("tensorflow")
    except (OSError, ValueError, AttributeError):
        return None, f"python (native marks not built: {BUILD})"
    if built != tf.__version__:
        return None, f"python (native marks built for TensorFlow {built}, running {tf.__version__})"
    try:
        marks = Marks(LIBRARY, ring_file)
    except Exception as exc:  # noqa: BLE001 - any failure to load: Python marks
        return None, f"python (native marks did not load: {type(exc).__name__})"
    if marks.words != RECORD_WORDS:  # built from another version of mark_op.cc, whose records differ
        return None, f"python (native marks built from another mark_op.cc: {BUILD})"
    heap, resident = built_for.get(HEAP_KEY), built_for.get(RESIDENT_KEY)
    marks.op_heap_bytes = heap if isinstance(heap, int) and heap > 0 else None
    marks.op_resident_bytes = resident if isinstance(resident, int) and resident > 0 else None
    return marks, "native"


CALIBRATION_CONDS = 64  # conds in each of the calibration's two functions
HEAP_KEY = "mark_op_heap_bytes"  # calibrate()'s figures in BUILT_FOR, beside the TensorFlow version
RESIDENT_KEY = "mark_op_resident_bytes"


def needs_build() -> bool:
    """Whether set-up is to build the library (again): never built, built from an older mark_op.cc, or
    built before the build measured a mark op's heap and resident memory (scripts/setup.sh asks)."""
    try:
        if BUILT_FOR.stat().st_mtime < SOURCE.stat().st_mtime:
            return True
        recorded = json.loads(BUILT_FOR.read_text())
        return HEAP_KEY not in recorded or RESIDENT_KEY not in recorded
    except (OSError, ValueError, TypeError):
        return True


@dataclass(frozen=True)
class Calibration:
    """What one mark op takes in a graph, per op (:func:`calibrate`)."""

    heap_bytes: int  # the C heap's in-use bytes (mallinfo2)
    resident_bytes: int | None  # the process's resident memory (RSS; None: not readable here)


def resident_bytes() -> int | None:
    """The process's resident set size from /proc/self/statm (None where there is none). The sampler's reader
    (memdiag.agent.sampler.read_rss) keeps its file open for every sample; this module sits below the agent
    and reads it a few times, at the build."""
    try:
        with open("/proc/self/statm", encoding="ascii") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def calibrate(conds: int = CALIBRATION_CONDS, library: Path = LIBRARY) -> Calibration | None:
    """The C heap and the resident memory a mark op takes in a graph, in bytes: two ``tf.function`` of
    ``conds`` conds each, one with a begin and an end mark around every cond (as memdiag marks Horovod's
    conds) and one without, each traced and called once; the heap's in-use bytes (``mallinfo2()``:
    TensorFlow's graph, function library and kernels) and the process's RSS (the heap's bytes with the
    allocator's slack, and Python's own small objects, under a KiB a mark) grown by the one beyond the
    other, per mark. None where the library does not load or there is no ``mallinfo2``."""
    import gc

    import tensorflow as tf

    from memdiag.mallinfo import mallinfo2

    info = mallinfo2()
    if info is None:
        return None
    try:
        marks = Marks(library)
    except Exception:  # noqa: BLE001 - no library: nothing to measure
        return None
    value = tf.Variable(tf.ones([4]))
    kept = []  # every function stays alive: one freed while another is measured would hide its bytes

    def in_use() -> int:
        now = info()
        return int(now.uordblks + now.hblkhd)

    def grown(marked: bool) -> tuple[int, int | None]:
        def body() -> Any:
            outputs = []
            for i in range(conds):
                x = tf.identity(value)
                if marked:
                    with tf.control_dependencies([x]):
                        begin = marks.mark(i, BEGIN, [])
                y = tf.cond(tf.constant(True), lambda x=x: x * 2.0, lambda x=x: tf.identity(x))
                if marked:
                    with tf.control_dependencies([y, begin]):
                        marks.mark(i, END, [])
                outputs.append(y)
            return tf.add_n(outputs)

        step = tf.function(body, autograph=False)
        gc.collect()  # what earlier objects left to free is freed before, not during, the reading
        before, rss_before = in_use(), resident_bytes()
        step()
        gc.collect()
        kept.append(step)
        rss_after = resident_bytes()
        return in_use() - before, None if rss_before is None or rss_after is None else rss_after - rss_before

    grown(False)  # the first function traced in a process sets up what every later one shares
    marks.mark(0, BEGIN, [])  # and the first mark op made in it, what every later one shares
    plain, plain_rss = grown(False)
    made = marks.ops_made
    marked, marked_rss = grown(True)
    ops = max(1, marks.ops_made - made)
    resident = None if plain_rss is None or marked_rss is None else max(0, round((marked_rss - plain_rss) / ops))
    return Calibration(max(0, round((marked - plain) / ops)), resident)


# The ring file's layout (memdiag/native/mark_op.cc, struct State): a header, the slots, the samples.
FILE_MAGIC = b"MDMARKS1"
FILE_HEAD, FILE_SAMPLE_HEAD, FILE_RING = 64, 128, 256


@dataclass
class RingFile:
    """What a ring file held when read: its published records in index order (rows as :meth:`Marks.read`
    returns them), how many were written in all (``head``), and the timer's samples still held, oldest
    first (times in seconds, the clock of ``time.time()``, and resident pages)."""

    records: npt.NDArray[np.int64]
    head: int
    sample_times: list[float]
    sample_pages: list[int]


def read_ring_file(path: str) -> RingFile:
    """The ring file at ``path`` as its writer left it (no writer may be running: a rank that ended).
    Needs no TensorFlow. ValueError where the file is not one (another layout, cut short)."""
    data = np.fromfile(path, dtype=np.uint8)
    if data.size < FILE_RING or bytes(data[:8]) != FILE_MAGIC:
        raise ValueError(f"{path}: not a memdiag marks file")
    words, capacity, sample_capacity, slot_bytes = (int(v) for v in data[8:40].view(np.int64))
    head = int(data[FILE_HEAD:FILE_HEAD + 8].view(np.uint64)[0])
    sample_head = int(data[FILE_SAMPLE_HEAD:FILE_SAMPLE_HEAD + 8].view(np.uint64)[0])
    ring_end = FILE_RING + capacity * slot_bytes
    if words != RECORD_WORDS or slot_bytes % 8 or slot_bytes < 8 * (words + 1) \
            or data.size < ring_end + 16 * sample_capacity:
        raise ValueError(f"{path}: a marks file of another layout")
    slots = data[FILE_RING:ring_end].view(np.int64).reshape(capacity, slot_bytes // 8)
    seq, rows = slots[:, 0], slots[:, 1:1 + words]
    published = (seq > 0) & (seq == 2 * rows[:, 0] + 2)  # written whole (mark_op.cc's sequence)
    records = rows[published]
    records = records[np.argsort(records[:, 0], kind="stable")].copy()
    samples = data[ring_end:ring_end + 16 * sample_capacity].view(np.int64)
    first = max(0, sample_head - sample_capacity)
    at = [i % sample_capacity for i in range(first, sample_head)]
    times, pages = samples[:sample_capacity][at], samples[sample_capacity:][at]
    return RingFile(records, head, (times / 1e9).tolist(), pages.tolist())


def record_calibration() -> Calibration | None:
    """Measure a mark op's heap and resident memory (:func:`calibrate`) in a process of its own, which loads
    the library afresh, and keep the figures in BUILT_FOR for the ranks to state (None where they could not
    be measured)."""
    figure: Calibration | None = None
    try:
        done = subprocess.run([sys.executable, "-m", "memdiag.nativemarks", "calibrate"], capture_output=True,
                              text=True, timeout=600, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
        if done.returncode == 0:
            heap, resident = done.stdout.strip().splitlines()[-1].split()
            figure = Calibration(int(heap), None if resident == "-" else int(resident))
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        figure = None
    try:
        recorded = json.loads(BUILT_FOR.read_text())
        # null where they could not be measured: tried, so that set-up does not build again for them
        figure = figure if figure and figure.heap_bytes > 0 else None
        recorded[HEAP_KEY] = figure.heap_bytes if figure else None
        recorded[RESIDENT_KEY] = figure.resident_bytes or None if figure else None
        BUILT_FOR.write_text(json.dumps(recorded))
    except (OSError, ValueError, TypeError):
        return None
    return figure


def main(argv: list[str]) -> int:
    if argv == ["calibrate"]:
        figure = calibrate()
        if figure is None:
            print("memdiag: a mark op's heap cannot be measured here (no library, or no mallinfo2)", file=sys.stderr)
            return 1
        print(figure.heap_bytes, "-" if figure.resident_bytes is None else figure.resident_bytes)
        return 0
    if argv != ["build"]:
        print("usage: python -m memdiag.nativemarks build | calibrate", file=sys.stderr)
        return 2
    start = time.monotonic()
    problem = build()
    if problem:
        print(f"memdiag: native marks not built: {problem}; memdiag marks through Python", file=sys.stderr)
        return 1
    print(f"built {LIBRARY.name} in {time.monotonic() - start:.1f} s")
    figure = record_calibration()
    print(f"a mark op takes {figure.heap_bytes} bytes of heap and {figure.resident_bytes} resident" if figure
          else "a mark op's heap not measured")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
