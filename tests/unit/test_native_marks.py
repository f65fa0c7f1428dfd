"""Native marks (memdiag.nativemarks, the default): the op's records reach the tracer as the Python calls'
do, with the time the graph reached the op, and a step found from them late splits the samples there."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from memdiag import nativemarks
from memdiag.agent.sampler import MemorySampler
from memdiag.agent.tracer import Tracer
from memdiag.format.writer import RecordWriter
from tests.helpers import native_marks, read_records

tf = pytest.importorskip("tensorflow")


@pytest.fixture(scope="module")
def marks(tmp_path_factory) -> nativemarks.Marks:
    return native_marks(tmp_path_factory)


def _hooks(tracer: Tracer):
    from memdiag.agent.hooks import CollectiveHooks

    return CollectiveHooks(tracer, "as-written", 1.0, lambda: 2, lambda d: None)


def _step(hooks, collectives: int, dynamic: bool = False):
    """A tf.function holding ``collectives`` stand-ins for gradient all-reduces (an identity each, with
    memdiag's begin and end marks around it, as the hooks put them around Horovod's op); with
    ``dynamic``, the tensors' first dimension is known only when the step runs."""
    from memdiag.agent.naming import Origin

    # autograph off, as memdiag's wrappers run its hooks (unconverted) inside a script's tf.function
    @tf.function(input_signature=[tf.TensorSpec([None] if dynamic else [32])], autograph=False)
    def step(x):
        outputs = []
        for i in range(collectives):
            rows = -1 if dynamic else 4
            tensor = tf.concat([tf.reshape(x, [rows, 8]) + float(i)] * (1 + i), axis=1)  # [4, 8 (1 + i)]
            origin = Origin(f"grad_{i}", gradient=True, reduce_op="average")
            marks = hooks._begin("allreduce", [(origin, tensor)])
            with tf.control_dependencies(marks):
                output = tf.identity(tensor)
            outputs.append(tf.reduce_sum(hooks._record("allreduce", origin, tensor, output, grouped=False)))
        return tf.add_n(outputs)

    return step


def _trace(tmp_path: Path, name: str, native: nativemarks.Marks | None, steps: int = 4,
           dynamic: bool = False) -> list[dict]:
    writer = RecordWriter(str(tmp_path / f"{name}.jsonl"), 0)
    sampler = MemorySampler(0.005)
    tracer = Tracer(writer, sampler, rank=0, auto_steps=True)
    hooks = _hooks(tracer)
    if native is not None:
        hooks.use_native(native)
    step = _step(hooks, 3, dynamic)
    first = native._next if native is not None else 0
    for i in range(steps):
        step(tf.fill([4 * 8], float(i)))
    tracer.finish()
    if native is not None:  # every mark went through the op: a begin and an end per collective and step
        assert native._next - first == steps * 3 * 2
    writer.close()
    assert hooks.failures.counts() == {}
    return read_records(tmp_path / f"{name}.jsonl")


def test_native_marks_record_what_the_python_calls_record(marks, tmp_path):
    # GIVEN the same graph step marked through Python and through the native op
    python = _trace(tmp_path, "python", None)
    native = _trace(tmp_path, "native", marks)
    # THEN both record the same collectives with the same run-time shapes, step by step
    def collectives(records):
        return sorted((r["step"], r["name"], tuple(r["shape_in"]), tuple(r["shape_out"]), r["bytes_out"])
                      for r in records if r["type"] == "collective")

    assert collectives(native) == collectives(python)
    assert {r["step"] for r in native if r["type"] == "collective"} == {0, 1, 2, 3}
    assert [r["step"] for r in native if r["type"] == "step"] == [s["step"] for s in python if s["type"] == "step"]
    # AND the native records carry the times the graph reached the marks: in order, inside each step
    steps = {r["step"]: r for r in native if r["type"] == "step"}
    for r in native:
        if r["type"] == "collective":
            assert steps[r["step"]]["t_start"] <= r["t"] <= steps[r["step"]]["t_end"] + 1e-6
    assert marks.lost == 0


def test_shapes_known_when_traced_stay_with_the_key_and_the_others_are_read_when_the_step_runs(marks, tmp_path):
    # GIVEN the same step with shapes known when it is traced and with a first dimension known only when it runs
    for dynamic in (False, True):
        python = _trace(tmp_path, f"python-{dynamic}", None, dynamic=dynamic)
        native = _trace(tmp_path, f"native-{dynamic}", marks, dynamic=dynamic)
        # THEN the native records hold the same shapes as the Python calls' (which always read them at run time)
        def collectives(records):
            return sorted((r["step"], r["name"], tuple(r["shape_in"]), tuple(r["shape_out"]), r["bytes_out"])
                          for r in records if r["type"] == "collective")

        assert collectives(native) == collectives(python)
        assert ("grad_2", (4, 24), (4, 24)) in {(name, i, o) for _, name, i, o, _ in collectives(native)}
    # AND a mark takes as inputs only the shapes not known when the graph was built
    writer = RecordWriter(str(tmp_path / "graph.jsonl"), 0)
    hooks = _hooks(Tracer(writer, MemorySampler(0.005), rank=0, auto_steps=True))
    hooks.use_native(marks)
    for dynamic, inputs in ((False, {0}), (True, {1, 2})):
        graph = _step(hooks, 3, dynamic).get_concrete_function().graph
        assert {len(op.inputs) for op in graph.get_operations() if op.type == "MemdiagMark"} == inputs
    writer.close()


def test_each_native_mark_reads_the_resident_memory_where_the_graph_reaches_it(marks):
    from memdiag.agent.sampler import read_rss

    @tf.function
    def f(x):
        marks.mark(9001, nativemarks.END, [tf.shape(x, out_type=tf.int64)])
        return x + 1

    f(tf.ones([2]))  # traced
    before = read_rss()
    f(tf.ones([2]))
    after = read_rss()
    [record] = [r for r in marks.read() if r[1] == 9001][-1:]
    pages = int(record[nativemarks.RSS])
    assert pages > 0
    assert min(before, after) - 16 * 2**20 <= pages * os.sysconf("SC_PAGE_SIZE") <= max(before, after) + 16 * 2**20


def test_the_native_op_is_marked_as_memdiags_own(marks):
    from memdiag import graphcalls

    @tf.function
    def f(x):
        marks.mark(0, nativemarks.BEGIN, [tf.shape(x, out_type=tf.int64)])
        return x + 1

    graph = f.get_concrete_function(tf.ones([2])).graph
    [op] = [op for op in graph.get_operations() if op.type == "MemdiagMark"]
    assert graphcalls._marked(op)


def test_a_step_found_late_splits_the_samples_at_the_marks_time(tmp_path):
    # GIVEN a tracer whose step 0 has samples before and after the time a native mark says step 1 began
    writer = RecordWriter(str(tmp_path / "r.jsonl"), 0)
    sampler = MemorySampler(0.005)
    tracer = Tracer(writer, sampler, rank=0, auto_steps=True)
    meta = {"op": "allreduce", "name": "g", "part": None, "dtype": "float32", "itemsize": 4, "sparse": False,
            "densified": False, "gradient": True, "process_set_size": None}
    tracer.begin_collective(meta, 16, in_graph=True)  # step 0 begins
    tracer.collective(meta, [4], [4])
    for _ in range(3):
        sampler.sample()
        time.sleep(0.002)
    boundary = time.time()
    for _ in range(3):
        time.sleep(0.002)
        sampler.sample()
    # WHEN the mark of step 1's first collective, at `boundary`, is read now
    tracer.begin_collective(meta, 16, in_graph=True, t=boundary)
    tracer.finish()
    writer.close()
    # THEN step 0 ends and step 1 begins at the mark's time, and each keeps its own samples
    records = read_records(tmp_path / "r.jsonl")
    steps = {r["step"]: r for r in records if r["type"] == "step"}
    step0, step1 = steps[0], steps[1]
    assert step0["t_end"] == boundary == step1["t_start"]
    mem = {r["step"]: r for r in records if r["type"] == "mem" and "times" in r}
    assert max(mem[0]["times"]) <= boundary < min(mem[1]["times"])
    assert len([t for t in mem[1]["times"] if t > boundary]) >= 3


def test_the_op_is_the_default_where_built_for_the_running_tensorflow(tmp_path, monkeypatch):
    built = tmp_path / "built.json"
    built.write_text(json.dumps({"tensorflow": tf.__version__}))
    monkeypatch.setattr(nativemarks, "BUILT_FOR", built)
    loaded = []

    class TheOp:
        words = 7 + 4 * (1 + 8)  # mark_op.cc's record: a header of 7 words, 4 inputs' counts and 8 values

        def __init__(self, library, ring_file=None):
            loaded.append(library)

    monkeypatch.setattr(nativemarks, "Marks", TheOp)
    for environ in ({}, {nativemarks.ENV: "native"}):
        marks, how = nativemarks.load(environ)
        assert isinstance(marks, TheOp) and how == "native"
    assert loaded == [nativemarks.LIBRARY] * 2
    # a library built from an earlier mark_op.cc, whose records are laid out otherwise (42 words, no RSS)
    monkeypatch.setattr(TheOp, "words", 42)
    assert nativemarks.load({}) == (None, "python (native marks built from another mark_op.cc: "
                                          "python -m memdiag.nativemarks build)")
    # the user's choice of Python calls, and a value that is neither
    assert nativemarks.load({nativemarks.ENV: "python"}) == (None, "python")
    marks, how = nativemarks.load({nativemarks.ENV: "nativ"})
    assert marks is None and how == "python (MEMDIAG_MARKS='nativ' is neither native nor python)"
    # built for another TensorFlow, not built, or not loading: Python calls, and why
    built.write_text('{"tensorflow": "0.0.0"}')
    marks, how = nativemarks.load({})
    assert marks is None and "built for TensorFlow 0.0.0" in how and tf.__version__ in how
    monkeypatch.setattr(nativemarks, "BUILT_FOR", tmp_path / "absent.json")
    assert nativemarks.load({})[1] == "python (native marks not built: python -m memdiag.nativemarks build)"
    monkeypatch.setattr(nativemarks, "BUILT_FOR", built)
    built.write_text(json.dumps({"tensorflow": tf.__version__}))

    def broken(library, ring_file=None):
        raise OSError("undefined symbol")

    monkeypatch.setattr(nativemarks, "Marks", broken)
    assert nativemarks.load({}) == (None, "python (native marks did not load: OSError)")


def test_the_ring_and_its_reader_are_resident_before_the_first_mark(marks):
    # memdiag's own memory in the rank, made resident when the op is loaded: it never grows in a step.
    # Untouched, the ring (4096 slots of 384 B) and the reader's buffer would add 2.8 MiB as marks came.
    import psutil

    @tf.function
    def marked():
        for key in range(64):
            marks.mark(key, nativemarks.BEGIN, [tf.constant([key, 2], tf.int64)])
        return tf.constant(0)

    marked()
    marks.read()
    process = psutil.Process()
    before = process.memory_info().rss
    for _ in range(2 * marks.capacity // 64):  # every slot written twice, every record read
        marked()
        assert len(marks.read()) == 64
    assert process.memory_info().rss - before < 2**20
    assert marks.lost == 0 and marks.resident_bytes >= marks.capacity * marks.words * 8 * 2


def test_shapes_longer_than_a_record_holds_are_unknown_not_cut():
    import numpy as np

    record = np.zeros(nativemarks.RECORD_WORDS, dtype=np.int64)
    record[3] = 2  # two inputs
    record[nativemarks.HEADER] = 3  # the first: 3 values
    record[nativemarks.HEADER + nativemarks.MAX_INPUTS:][:3] = [5, 6, 7]
    record[nativemarks.HEADER + 1] = nativemarks.MAX_VALUES + 1  # the second: too long to be stored whole
    assert nativemarks.shape(record, 0) == [5, 6, 7]
    assert nativemarks.shape(record, 1) is None and nativemarks.shape(record, 2) is None


def test_marks_lost_to_an_overwritten_ring_are_a_warning_not_silence(tmp_path):
    import numpy as np

    class Overwritten:
        lost = 0

        def read(self):
            self.lost += 5  # five records were overwritten before this read
            return np.zeros((0, 42), dtype=np.int64)

    writer = RecordWriter(str(tmp_path / "r.jsonl"), 0)
    hooks = _hooks(Tracer(writer, MemorySampler(), rank=0, auto_steps=True))
    hooks.native = Overwritten()
    hooks.drain()
    writer.close()
    assert hooks.failures.counts() == {"read every native mark": 1}
    [record] = [r for r in read_records(tmp_path / "r.jsonl") if r["type"] == "bookkeeping"]
    assert "5 overwritten" in record["error"]


def test_the_tracer_never_drains_with_its_lock_held(tmp_path):
    # GIVEN a tracer whose drain checks that no thread calls it holding the tracer's lock (the sampler
    # thread's drain takes the drain's lock, then the tracer's: the other order would deadlock)
    writer = RecordWriter(str(tmp_path / "r.jsonl"), 0)
    tracer = Tracer(writer, MemorySampler(), rank=0, auto_steps=True)
    calls = []

    def drain():
        assert not tracer._lock._is_owned()
        calls.append(1)

    tracer.drain = drain
    tracer.on_step_end.append(lambda step: {"extra": step})  # memdiag's own work inside end_step
    meta = {"op": "allreduce", "name": "g", "part": None, "dtype": "float32", "itemsize": 4, "sparse": False,
            "densified": False, "gradient": True, "process_set_size": None}
    # WHEN a collective's begin ends a step (a Python mark: end_step called with the lock held) and the
    # script ends
    for _ in range(3):
        tracer.begin_collective(meta, 16, in_graph=True)
        tracer.collective(meta, [4], [4])
    tracer.finish()
    writer.close()
    # THEN it drained only where it held no lock (finish), and the steps were still ended
    assert calls and [r["step"] for r in read_records(tmp_path / "r.jsonl") if r["type"] == "step"] == [-1, 0, 1, 2]


def test_the_rss_each_mark_read_is_a_sample_of_its_step_at_the_marks_time(tmp_path, monkeypatch):
    # GIVEN a tracer whose sampler never wakes in the test (1 s) and reads 2000 pages itself, and a step of
    # two gradient all-reduces whose marks read 1000 pages (the first begins the step), 1100 (its end),
    # 1100 and 2000 pages (the second's output allocated)
    import memdiag.agent.sampler as sampler_module

    page = os.sysconf("SC_PAGE_SIZE")
    monkeypatch.setattr(sampler_module, "read_rss", lambda: 2000 * page)
    writer = RecordWriter(str(tmp_path / "r.jsonl"), 0)
    tracer = Tracer(writer, sampler_module.MemorySampler(1.0), rank=0, auto_steps=True)
    hooks = _hooks(tracer)
    for name in ("g1", "g2"):
        meta = {"op": "allreduce", "name": name, "part": None, "dtype": "float32", "itemsize": 4, "sparse": False,
                "densified": False, "gradient": True, "reduce_op": "average", "process_set_size": 2}
        hooks._marked += [("allreduce", meta, 2, [None]), ("allreduce", meta, 0, [None, None])]  # keys 2i: begin, 2i + 1: end
    t0 = time.time_ns() + 1_000_000
    records = np.zeros((4, nativemarks.RECORD_WORDS), dtype=np.int64)
    for i, pages in enumerate((1000, 1100, 1100, 2000)):
        kind = nativemarks.BEGIN if i % 2 == 0 else nativemarks.END
        records[i, :nativemarks.HEADER] = [i, i, kind, 1, t0 + i * 1_000_000, 1, pages]
        records[i, nativemarks.HEADER] = 1
        records[i, nativemarks.HEADER + nativemarks.MAX_INPUTS] = 16
    time.sleep(0.005)
    # WHEN the ring's records are handed over, and the step ends
    hooks._dispatch(records)
    tracer.finish()
    writer.close()
    # THEN step 0 holds the readings after its first mark at the marks' times (the third, equal to the
    # one before it, left out), and the rise they show inside the collective window is the collectives'
    out = read_records(tmp_path / "r.jsonl")
    [mem] = [r for r in out if r["type"] == "mem" and r["step"] == 0]
    marked = [(t, rss) for t, rss in zip(mem["times"], mem["rss"]) if t <= (t0 + 3_000_000) / 1e9]
    assert marked == [((t0 + 1_000_000) / 1e9, 1100 * page), ((t0 + 3_000_000) / 1e9, 2000 * page)]
    [step] = [r for r in out if r["type"] == "step" and r["step"] == 0]
    assert step["collective_rise_bytes"] == 900 * page and step["compute_rise_bytes"] == 0
    assert step["peak_phase"] == "collectives"


def test_the_native_timer_samples_the_resident_memory_without_python(marks):
    from memdiag.agent.sampler import read_rss

    page = os.sysconf("SC_PAGE_SIZE")
    # GIVEN the library's timer, every 5 ms
    assert marks.timer_start(0.005)
    try:
        assert not marks.timer_start(0.005)  # one timer a process
        time.sleep(0.2)
        # WHEN its samples are read, twice
        first_times, first_pages = marks.timer_read()
        time.sleep(0.05)
        times, pages = marks.timer_read()
    finally:
        cpu = marks.timer_stop()
    # THEN it sampled on its own, in time order, each sample the process's resident memory then, and a
    # second read gives only what came after the first
    assert len(first_times) >= 5 and times
    assert first_times == sorted(first_times) and times[0] > first_times[-1]
    assert all(abs(p * page - read_rss()) < 64 * 2**20 for p in first_pages + pages)
    assert first_times[0] > time.time() - 5 and marks.timer_lost == 0
    # AND stopped, it says what CPU it used, and samples no more
    assert cpu is not None and 0 <= cpu < 1
    time.sleep(0.03)
    assert marks.timer_read() == ([], []) and marks.timer_stop() is None


def test_a_sampler_on_the_native_timer_has_its_samples_without_waking_for_them(marks, monkeypatch):
    import memdiag.agent.sampler as sampler_module

    reads = []
    real = sampler_module.read_rss
    monkeypatch.setattr(sampler_module, "read_rss", lambda: reads.append(1) or real())
    # GIVEN a sampler every 5 ms whose thread, on the native timer, wakes only every 0.2 s
    sampler = sampler_module.MemorySampler(0.005)
    assert sampler.use_native_timer(marks, 0.2)
    sampler.start()
    time.sleep(0.3)
    # WHEN a step is taken
    peak, times, rss = sampler.take_step()
    sampler.stop()
    # THEN its samples are the timer's, every 5 ms or so, not one per wake of the thread (which read RSS
    # itself only when started and when the step was taken)
    assert len(times) >= 20 and len(reads) <= 3
    assert times == sorted(times) and peak == max(rss)
    # AND the thread's CPU includes the timer's
    assert sampler.cpu_s is not None and sampler.cpu_s > 0


def test_a_memory_limits_watchdog_keeps_the_python_sampler(marks):
    sampler = MemorySampler(0.005)
    sampler.on_sample = lambda rss: None
    assert not sampler.use_native_timer(marks, 1.0)
    assert sampler.wake_s == 0.005


def test_record_every_drains_the_marks_at_most_that_often_and_early_when_the_ring_fills(tmp_path, monkeypatch):
    import memdiag.agent.collective_records as records_module

    class Ring:
        capacity = 100
        lost = 0
        waiting = 0
        reads = 0

        def pending(self):
            return self.waiting

        def read(self):
            self.reads += 1
            self.waiting = 0
            return np.zeros((0, nativemarks.RECORD_WORDS), dtype=np.int64)

    now = [1000.0]
    monkeypatch.setattr(records_module.time, "monotonic", lambda: now[0])
    writer = RecordWriter(str(tmp_path / "r.jsonl"), 0)
    ring = Ring()
    # GIVEN the default: a drain at every wake of the sampler
    hooks = _hooks(Tracer(writer, MemorySampler(), rank=0, auto_steps=True))
    hooks.use_native(ring)
    for _ in range(3):
        ring.waiting = 4
        hooks.tracer.sampler.before_sample()
    assert ring.reads == 3
    # WHEN records are asked every 1 s
    hooks.use_native(ring, record_every_s=1.0)
    hooks.drain()
    ring.reads = 0
    for _ in range(9):  # 0.9 s of wakes, 4 marks each
        now[0] += 0.1
        ring.waiting += 4
        hooks.tracer.sampler.before_sample()
    # THEN nothing was drained before the second, however many marks waited below half the ring
    assert ring.reads == 0
    now[0] += 0.15
    hooks.tracer.sampler.before_sample()
    assert ring.reads == 1
    # AND a ring half full is drained at once
    ring.waiting = 50
    now[0] += 0.01
    hooks.tracer.sampler.before_sample()
    assert ring.reads == 2
    writer.close()


def test_the_build_measures_the_heap_a_mark_op_takes_and_the_ranks_carry_it(marks, tmp_path, monkeypatch):
    # GIVEN the library the tests load, measured by the calibration twice at one size and once at twice it
    library = Path(marks._c._name)
    measured = [nativemarks.calibrate(conds, library) for conds in (64, 64, 128)]
    # THEN a mark op takes some KiB of heap (a graph node, its function's copy and its kernel), the same
    # figure again at the same size, and about the same per op in a function twice the size: a marginal
    # cost per op, not a fixed cost spread over them
    assert all(m is not None for m in measured)
    first, again, larger = (m.heap_bytes for m in measured if m is not None)
    assert 1024 < first < 256 * 1024
    assert abs(again - first) <= 0.1 * first
    assert abs(larger - first) <= 0.35 * first
    # AND a resident figure beside it, read from the process's RSS (on Linux), some KiB too
    resident = [m.resident_bytes for m in measured if m is not None]
    # (in this long-lived process a later function can reuse pages an earlier one freed: the build measures
    # it in a fresh process of its own, below)
    assert all(r is not None and 0 <= r < 512 * 1024 for r in resident)
    # AND load() hands the build's figure to the marks it loads, which a rank puts in its end record
    built = tmp_path / "built.json"
    monkeypatch.setattr(nativemarks, "BUILT_FOR", built)

    class TheOp:
        words = nativemarks.RECORD_WORDS

        def __init__(self, library, ring_file=None):
            self.op_heap_bytes = self.op_resident_bytes = None

    monkeypatch.setattr(nativemarks, "Marks", TheOp)
    built.write_text(json.dumps({"tensorflow": tf.__version__, nativemarks.HEAP_KEY: first,
                                 nativemarks.RESIDENT_KEY: 27_000}))
    loaded, _ = nativemarks.load({})
    assert loaded is not None and loaded.op_heap_bytes == first and loaded.op_resident_bytes == 27_000
    assert not nativemarks.needs_build()  # written after the source: built, both figures measured
    built.write_text(json.dumps({"tensorflow": tf.__version__}))  # built before the figures were measured
    loaded, _ = nativemarks.load({})
    assert loaded is not None and loaded.op_heap_bytes is None and loaded.op_resident_bytes is None
    assert nativemarks.needs_build()
    # a library built when only the heap was measured is built again, to measure the resident figure too
    built.write_text(json.dumps({"tensorflow": tf.__version__, nativemarks.HEAP_KEY: first}))
    assert nativemarks.needs_build()


def test_the_build_keeps_both_figures_the_calibrating_process_prints(tmp_path, monkeypatch):
    # GIVEN the calibration's process printing "HEAP RESIDENT" ("-" where RSS cannot be read)
    built = tmp_path / "built.json"
    monkeypatch.setattr(nativemarks, "BUILT_FOR", built)
    printed = {"out": "13700 28000\n"}

    def fake_run(cmd, **kwargs):
        assert cmd[1:] == ["-m", "memdiag.nativemarks", "calibrate"]
        return subprocess.CompletedProcess(cmd, 0, stdout=printed["out"], stderr="")

    monkeypatch.setattr(nativemarks.subprocess, "run", fake_run)
    built.write_text(json.dumps({"tensorflow": "2.15.1"}))
    # THEN both are kept beside the TensorFlow version, and returned
    assert nativemarks.record_calibration() == nativemarks.Calibration(13700, 28000)
    assert json.loads(built.read_text()) == {"tensorflow": "2.15.1", nativemarks.HEAP_KEY: 13700,
                                             nativemarks.RESIDENT_KEY: 28000}
    # AND without a resident figure, the heap's alone, the other kept as null (tried: not built again for it)
    printed["out"] = "13700 -\n"
    assert nativemarks.record_calibration() == nativemarks.Calibration(13700, None)
    assert json.loads(built.read_text())[nativemarks.RESIDENT_KEY] is None
    # AND a process that printed nothing usable leaves both null
    printed["out"] = "oops\n"
    assert nativemarks.record_calibration() is None
    assert json.loads(built.read_text())[nativemarks.HEAP_KEY] is None
