"""memdiag probe: a native TensorFlow op (MemdiagMark, memdiag/native/mark_op.cc) against a stateful tf.numpy_function
as the per-collective mark inside a tf.function.

One process, no MPI. A tf.function holds K small ops (tf.reduce_sum of a [32, 8] tensor, standing for
collectives), each bracketed the way memdiag brackets a collective: a begin mark that the op waits
for (control dependency), taking tf.shape(input), and an end mark that waits for the op's output,
taking the input's and the output's shapes. Variants:

  none    no marks
  numpy   two stateful tf.numpy_function marks per op; the Python function appends
          (time.time(), shape tuple(s)) to a list
  native  two MemdiagMark ops per op (one ring record each)
  native+drain  as native, with a Python thread draining the ring through ctypes every 5 ms
          (the sampler thread's part, concurrently)
  stamp   two tf.timestamp() per op (the floor: a stateful op with no Python)

Each variant's function is called --calls times (default 2000) after warm-up, interleaved in rounds;
the median per-call time and the per-mark cost (variant - none) / (2K) are printed.

--mode plain:    TensorFlow's automatic control dependencies order every stateful op (marks run one
                 after another, in the order built).
--mode memdiag:  memdiag.graphcalls.install() is in force and every mark carries the
                 _memdiag_host_call attr (set with op._set_attr), so marks run independently, as
                 memdiag runs its host calls.
--threads one|default: inter/intra-op pools of 1 thread, or TensorFlow's defaults.

Then the checks (asserted): record count, increasing timestamps, shapes, the _memdiag_host_call attr,
a tf.cond branch, N = 0 inputs, truncation past 8 values, int32 inputs, more than 4 inputs; and the
drain cost of 10,000 records through ctypes into numpy.

Usage: .venv/bin/python probes/native_mark/bench.py [--mode plain|memdiag] [--threads one|default]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import sys
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow.core.framework import attr_value_pb2  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SO = os.path.join(HERE, "memdiag_mark.so")
MARK_ATTR = "_memdiag_host_call"

MAX_INPUTS, MAX_VALUES = 4, 8
RECORD = np.dtype([("index", "<i8"), ("key", "<i8"), ("kind", "<i8"), ("n_inputs", "<i8"), ("t_ns", "<i8"),
                   ("tid", "<i8"), ("rss_pages", "<i8"), ("count", "<i8", (MAX_INPUTS,)),
                   ("values", "<i8", (MAX_INPUTS, MAX_VALUES))])


# -- the library ----------------------------------------------------------------------------------
class Ring:
    """The ring buffer's reader (ctypes over the same .so TensorFlow loaded)."""

    def __init__(self, path: str) -> None:
        self.lib = ctypes.CDLL(path)  # same path: dlopen hands back the handle TensorFlow loaded
        self.lib.memdiag_ring_capacity.restype = ctypes.c_int64
        self.lib.memdiag_ring_head.restype = ctypes.c_int64
        self.lib.memdiag_ring_record_words.restype = ctypes.c_int64
        self.lib.memdiag_ring_read.restype = ctypes.c_int64
        self.lib.memdiag_ring_read.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64]
        assert self.lib.memdiag_ring_record_words() * 8 == RECORD.itemsize, "record layout differs"
        self.capacity = self.lib.memdiag_ring_capacity()

    def head(self) -> int:
        return self.lib.memdiag_ring_head()

    def read_into(self, out: np.ndarray, since: int) -> int:
        """Records since ``since`` into a preallocated RECORD array; returns how many."""
        return self.lib.memdiag_ring_read(out.ctypes.data, len(out), since)

    def read(self, since: int, max_records: int | None = None) -> np.ndarray:
        """Records since ``since`` through a ctypes array and np.frombuffer (a copy of the result)."""
        n_max = max_records or self.capacity
        buf = (ctypes.c_int64 * (n_max * RECORD.itemsize // 8))()
        n = self.lib.memdiag_ring_read(buf, n_max, since)
        return np.frombuffer(buf, dtype=RECORD, count=n)


ops = tf.load_op_library(SO)
ring = Ring(SO)


# -- marks --------------------------------------------------------------------------------------------
class Marks:
    """How a variant brackets an op: begin(key, x) -> control deps for the op; end(key, x, y)."""

    def __init__(self, attr: bool) -> None:
        self.attr = attr  # set _memdiag_host_call on each mark (memdiag mode)

    def _tag(self, op: tf.Operation) -> None:
        if self.attr:
            op._set_attr(MARK_ATTR, attr_value_pb2.AttrValue(b=True))

    def begin(self, key: int, x: tf.Tensor) -> list:
        return []

    def end(self, key: int, x: tf.Tensor, y: tf.Tensor) -> None:
        pass


class NumpyMarks(Marks):
    def __init__(self, attr: bool) -> None:
        super().__init__(attr)
        self.log: list = []

    def _call(self, fn, inputs, name):
        g = tf.compat.v1.get_default_graph()
        tf.numpy_function(fn, inputs, Tout=[], stateful=True, name=name)
        op = g.get_operations()[-1]
        assert op.type == "PyFunc", op.type
        self._tag(op)
        return op

    def begin(self, key, x):
        log = self.log

        def begin(shape):
            log.append((time.time(), tuple(int(d) for d in shape)))
            return []

        return [self._call(begin, [tf.shape(x, out_type=tf.int64)], "memdiag_begin")]

    def end(self, key, x, y):
        log = self.log

        def end(shape_in, shape_out):
            log.append((time.time(), tuple(int(d) for d in shape_in), tuple(int(d) for d in shape_out)))
            return []

        with tf.control_dependencies([y]):
            self._call(end, [tf.shape(x, out_type=tf.int64), tf.shape(y, out_type=tf.int64)], "memdiag_record")


class NativeMarks(Marks):
    def begin(self, key, x):
        op = ops.memdiag_mark(shapes=[tf.shape(x, out_type=tf.int64)], key=key, kind=0, name="memdiag_begin")
        self._tag(op)
        return [op]

    def end(self, key, x, y):
        with tf.control_dependencies([y]):
            op = ops.memdiag_mark(shapes=[tf.shape(x, out_type=tf.int64), tf.shape(y, out_type=tf.int64)],
                                  key=key, kind=1, name="memdiag_record")
        self._tag(op)


class StampMarks(Marks):
    def begin(self, key, x):
        t = tf.timestamp()
        self._tag(t.op)
        return [t]

    def end(self, key, x, y):
        with tf.control_dependencies([y]):
            t = tf.timestamp()
        self._tag(t.op)


def make_function(marks: Marks):
    @tf.function
    def step(xs):
        outs = []
        for i, x in enumerate(xs):
            with tf.control_dependencies(marks.begin(i, x)):
                y = tf.reduce_sum(x, axis=0)  # stands for a collective
            marks.end(i, x, y)
            outs.append(y)
        return tf.add_n(outs)

    return step


class Drainer(threading.Thread):
    """The sampler thread's part: drain the ring every ``period`` s into a preallocated array."""

    def __init__(self, period: float) -> None:
        super().__init__(daemon=True)
        self.period = period
        self.buf = np.zeros(ring.capacity, dtype=RECORD)
        self.since = ring.head()
        self.records = 0
        self.polls = 0
        self.gaps = 0
        self.active = threading.Event()
        self.resync = threading.Event()  # start from the ring's head (records written while idle are not ours)
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            if self.active.wait(0.05):
                if self.resync.is_set():
                    self.resync.clear()
                    self.since = ring.head()
                n = ring.read_into(self.buf, self.since)
                self.polls += 1
                if n:
                    got = self.buf[:n]
                    if got["index"][0] != self.since:
                        self.gaps += 1
                    self.since = int(got["index"][-1]) + 1
                    self.records += n
                time.sleep(self.period)


# -- timing -----------------------------------------------------------------------------------------------
def bench(args) -> None:
    K = args.k
    attr = args.mode == "memdiag"
    xs = [tf.random.normal([32, 8], seed=i) for i in range(K)]
    numpy_marks = NumpyMarks(attr)
    variants = {
        "none": make_function(Marks(attr)),
        "numpy": make_function(numpy_marks),
        "native": make_function(NativeMarks(attr)),
        "native+drain": make_function(NativeMarks(attr)),
        "stamp": make_function(StampMarks(attr)),
    }
    for fn in variants.values():  # trace, then warm up
        for _ in range(args.warmup):
            fn(xs)
    drainer = Drainer(0.005)
    drainer.start()

    # how many marks each variant's graph really holds (after tracing)
    for name, fn in variants.items():
        g = fn.get_concrete_function(xs).graph
        kinds = {"PyFunc", "MemdiagMark", "Timestamp"}
        n = sum(1 for o in g.get_operations() if o.type in kinds)
        print(f"  {name:13s} graph: {len(g.get_operations())} ops, {n} marks")

    times: dict[str, list[float]] = {name: [] for name in variants}
    rounds = args.rounds
    per_round = args.calls // rounds
    order = list(variants)
    load0 = os.getloadavg()[0]
    cpu0 = time.process_time()
    head0 = ring.head()
    numpy_marks.log.clear()
    for r in range(rounds):
        for name in order[r % len(order):] + order[:r % len(order)]:  # rotate the order each round
            fn = variants[name]
            if name == "native+drain":
                drainer.resync.set()
                drainer.active.set()
            t = times[name]
            for _ in range(per_round):
                t0 = time.perf_counter_ns()
                fn(xs)
                t.append(time.perf_counter_ns() - t0)
            if name == "native+drain":
                drainer.active.clear()
            numpy_marks.log.clear()
    drainer.stop.set()
    drainer.join()
    cpu = time.process_time() - cpu0
    written = ring.head() - head0
    assert written == 2 * 2 * K * rounds * per_round, (written, 2 * 2 * K * rounds * per_round)

    none = statistics.median(times["none"])
    ref = (statistics.median(times["numpy"]) - none) / (2 * K)
    print(f"\nmode={args.mode} threads={args.threads} K={K} calls={rounds * per_round} per variant "
          f"({rounds} interleaved rounds); bench CPU {cpu:.1f} s; load average {load0:.1f} -> {os.getloadavg()[0]:.1f}")
    none10 = np.percentile(times["none"], 10)
    ref10 = (np.percentile(times["numpy"], 10) - none10) / (2 * K)
    print(f"{'variant':14s} {'median us/call':>15s} {'p10':>8s} {'p90':>8s} {'per mark us':>12s} {'vs numpy':>9s}"
          f" {'per mark us (p10)':>18s} {'vs numpy':>9s}")
    for name, t in times.items():
        med = statistics.median(t)
        q = np.percentile(t, [10, 90])
        per_mark = (med - none) / (2 * K)
        per_mark10 = (q[0] - none10) / (2 * K)
        ratio = "" if name == "none" else f"{per_mark / ref:8.3f}x" if ref > 0 else ""
        ratio10 = "" if name == "none" else f"{per_mark10 / ref10:8.3f}x" if ref10 > 0 else ""
        print(f"{name:14s} {med / 1e3:15.1f} {q[0] / 1e3:8.1f} {q[1] / 1e3:8.1f} "
              f"{'' if name == 'none' else f'{per_mark / 1e3:12.2f}':>12s} {ratio:>9s}"
              f" {'' if name == 'none' else f'{per_mark10 / 1e3:18.2f}':>18s} {ratio10:>9s}")
    print(f"drainer: {drainer.polls} polls, {drainer.records} records, gaps {drainer.gaps} (records lost to overwriting) "
          f"(ring capacity {ring.capacity})")


# -- checks --------------------------------------------------------------------------------------------
def records_since(since: int) -> np.ndarray:
    got = ring.read(since).copy()
    if len(got):
        assert got["index"][0] == since and np.all(np.diff(got["index"]) == 1), "records missing"
    return got


def checks(args) -> None:
    K = args.k
    attr = args.mode == "memdiag"
    xs = [tf.random.normal([32, 8], seed=i) for i in range(K)]
    fn = make_function(NativeMarks(attr))
    fn(xs)
    calls = 50
    since = ring.head()
    bounds = []
    for _ in range(calls):
        t0 = time.time_ns()
        fn(xs)
        bounds.append((t0, time.time_ns()))
    got = records_since(since)
    assert len(got) == calls * 2 * K, (len(got), calls * 2 * K)
    per_call = got.reshape(calls, 2 * K)
    for c, (lo, hi) in enumerate(bounds):
        rec = per_call[c]
        t = rec["t_ns"]
        assert lo <= t.min() and t.max() <= hi, "a record's time lies outside its call (time.time clock)"
        if args.mode == "plain":  # marks are ordered: index order is time order
            assert np.all(np.diff(t) >= 0), "timestamps not increasing in index order"
        for key in range(K):
            b = rec[(rec["key"] == key) & (rec["kind"] == 0)]
            e = rec[(rec["key"] == key) & (rec["kind"] == 1)]
            assert len(b) == 1 and len(e) == 1, (key, len(b), len(e))
            b, e = b[0], e[0]
            assert b["t_ns"] <= e["t_ns"], "end before begin"
            assert b["n_inputs"] == 1 and b["count"][0] == 2 and list(b["values"][0][:2]) == [32, 8]
            assert e["n_inputs"] == 2 and list(e["count"][:2]) == [2, 1]
            assert list(e["values"][0][:2]) == [32, 8] and e["values"][1][0] == 8
            assert not e["values"][1][1:].any() and not e["count"][2:].any()
    assert np.all(np.diff(got["t_ns"][:: 2 * K]) > 0), "calls' records not increasing"
    print(f"check: {calls} calls x {2 * K} marks = {len(got)} records, times inside each call, "
          f"begin <= end per key, shapes [32, 8] -> [8]; index order is time order: {args.mode == 'plain'}; "
          f"threads seen: {len(set(got['tid']))}")

    # _memdiag_host_call attr, tf.cond branches, and unusual inputs
    @tf.function
    def branchy(x, pred):
        op = ops.memdiag_mark(shapes=[tf.shape(x, out_type=tf.int64)], key=100, kind=0)
        op._set_attr(MARK_ATTR, attr_value_pb2.AttrValue(b=True))
        assert op.get_attr(MARK_ATTR) is True

        def yes():
            o = ops.memdiag_mark(shapes=[tf.shape(x, out_type=tf.int64)], key=101, kind=0)
            o._set_attr(MARK_ATTR, attr_value_pb2.AttrValue(b=True))
            with tf.control_dependencies([o]):
                return tf.reduce_sum(x)

        def no():
            o = ops.memdiag_mark(shapes=[], key=102, kind=1)  # N = 0
            o._set_attr(MARK_ATTR, attr_value_pb2.AttrValue(b=True))
            return tf.reduce_sum(x) * 2

        s = tf.cond(pred, yes, no)
        ops.memdiag_mark(shapes=[tf.range(12, dtype=tf.int64)], key=103, kind=0)  # truncated to 8
        ops.memdiag_mark(shapes=[tf.shape(x)], key=104, kind=0)  # int32 shape
        ops.memdiag_mark(shapes=[tf.constant([i], tf.int64) for i in range(6)], key=105, kind=0)  # 6 inputs
        ops.memdiag_mark(shapes=[tf.constant(7, tf.int64)], key=106, kind=0)  # scalar
        return s

    x = tf.ones([3, 5])
    since = ring.head()
    branchy(x, tf.constant(True))
    branchy(x, tf.constant(False))
    got = records_since(since)
    keys = sorted(got["key"].tolist())
    assert keys == sorted([100, 101, 103, 104, 105, 106, 100, 102, 103, 104, 105, 106]), keys
    by = {int(k): got[got["key"] == k] for k in set(keys)}
    g = branchy.get_concrete_function(x, tf.constant(True)).graph
    marks = [o for o in g.get_operations() if o.type == "MemdiagMark"]
    assert all(o.get_attr(MARK_ATTR) for o in marks if o.get_attr("key") == 100)
    ifs = [o for o in g.get_operations() if o.type in ("If", "StatelessIf")]
    assert ifs and ifs[0].type == "If", [o.type for o in ifs]  # the branch mark makes the cond stateful
    assert list(by[101][0]["values"][0][:2]) == [3, 5] and by[101][0]["n_inputs"] == 1
    assert by[102][0]["n_inputs"] == 0 and by[102][0]["kind"] == 1 and not by[102][0]["count"].any()
    r = by[103][0]
    assert r["count"][0] == 12 and list(r["values"][0]) == list(range(8)), r
    assert list(by[104][0]["values"][0][:2]) == [3, 5]
    r = by[105][0]
    assert r["n_inputs"] == 6 and list(r["count"]) == [1, 1, 1, 1] and list(r["values"][:, 0]) == [0, 1, 2, 3]
    assert by[106][0]["count"][0] == 1 and by[106][0]["values"][0][0] == 7
    print("check: _memdiag_host_call attr accepted and kept; marks run in a tf.cond branch (taken branch only, "
          "cond becomes a stateful If); N=0, int32, scalar, 12 values (8 kept, count 12), 6 inputs (4 kept)")

    # eager (outside any function): the op runs at once
    since = ring.head()
    t = time.perf_counter_ns()
    n = 2000
    s = tf.constant([4, 4], tf.int64)
    for _ in range(n):
        ops.memdiag_mark(shapes=[s], key=200, kind=0)
    eager_us = (time.perf_counter_ns() - t) / n / 1e3
    assert ring.head() - since == n
    print(f"eager: one MemdiagMark call from Python {eager_us:.1f} us")


def drain(args) -> None:
    """Python-side drain cost: 10,000 records through ctypes into numpy."""
    n = 10_000

    @tf.function
    def fill(s):
        for i in range(100):
            ops.memdiag_mark(shapes=[s, s], key=i, kind=i % 2)
        return s

    s = tf.constant([128, 1024], tf.int64)
    since = ring.head()
    for _ in range(n // 100):
        fill(s)
    assert ring.head() - since == n

    def timed(f, reps):
        out = []
        for _ in range(reps):
            t0 = time.perf_counter_ns()
            f()
            out.append(time.perf_counter_ns() - t0)
        return statistics.median(out) / 1e3

    pre = np.zeros(n, dtype=RECORD)
    cbuf = (ctypes.c_int64 * (n * RECORD.itemsize // 8))()
    fn = ring.lib.memdiag_ring_read
    got = ring.read(since, n)
    assert len(got) == n and got["index"][0] == since and got["count"][0][0] == 2 and got["values"][0][1][1] == 1024
    assert ring.read_into(pre, since) == n and np.array_equal(pre, got)
    head = ring.head()
    small = np.zeros(64, dtype=RECORD)
    rows = [
        ("ctypes array alloc + read + np.frombuffer (10k)", timed(lambda: ring.read(since, n), 50)),
        ("reused ctypes array, read + np.frombuffer (10k)",
         timed(lambda: np.frombuffer(cbuf, dtype=RECORD, count=fn(cbuf, n, since)), 50)),
        ("preallocated numpy array, read_into (10k)", timed(lambda: ring.read_into(pre, since), 50)),
        ("  + .tolist() of key,kind,t_ns (10k)",
         timed(lambda: (ring.read_into(pre, since), pre[["key", "kind", "t_ns"]].tolist()), 20)),
        ("  + full .tolist() (10k, nested shapes)", timed(lambda: (ring.read_into(pre, since), pre.tolist()), 20)),
        ("poll of 20 records (one step, 10 collectives)", timed(lambda: ring.read_into(small, head - 20), 2000)),
        ("empty poll (nothing new)", timed(lambda: ring.read_into(small, head), 2000)),
        ("memdiag_ring_head()", timed(ring.head, 2000)),
    ]
    print(f"\ndrain (record {RECORD.itemsize} B):")
    for what, us in rows:
        per = f"{us * 1e3 / n:7.1f} ns/record" if "10k" in what else ""
        print(f"  {what:50s} {us:9.1f} us  {per}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["plain", "memdiag"], default="plain")
    p.add_argument("--threads", choices=["one", "default"], default="one")
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--skip", default="", help="comma-separated: bench,checks,drain")
    args = p.parse_args()
    if args.threads == "one":
        tf.config.threading.set_inter_op_parallelism_threads(1)
        tf.config.threading.set_intra_op_parallelism_threads(1)
    if args.mode == "memdiag":
        sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
        from memdiag import graphcalls

        graphcalls.install()  # marks carrying _memdiag_host_call run independently
    print(f"TensorFlow {tf.__version__}, {os.cpu_count()} cores, mode={args.mode}, threads={args.threads} "
          f"(inter {tf.config.threading.get_inter_op_parallelism_threads()}, "
          f"intra {tf.config.threading.get_intra_op_parallelism_threads()}; 0 = default)")
    skip = set(args.skip.split(","))
    if "bench" not in skip:
        bench(args)
    if "checks" not in skip:
        checks(args)
    if "drain" not in skip:
        drain(args)
    print(f"process CPU {time.process_time():.1f} s")


if __name__ == "__main__":
    main()
