"""A script's rank killed outright: the native marks it left in its file (memdiag.agent.replay) become the
steps they complete, and nothing the rank wrote itself is written twice."""

from __future__ import annotations

import json
import os
import resource
import signal
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from memdiag import nativemarks
from memdiag.agent import replay
from memdiag.format import rundir
from tests.helpers import read_records, undeclared_record_fields

# The file's layout as memdiag/native/mark_op.cc declares it (its header comment), written here by hand.
WORDS, CAPACITY, SAMPLE_CAPACITY, SLOT = 43, 4096, 8192, 384
PAGE = resource.getpagesize()
META = {"op": "allreduce", "part": None, "dtype": "float32", "itemsize": 4, "sparse": False, "densified": False,
        "merged": False, "grouped": False, "gradient": True, "reduce_op": "average", "process_set_size": None}
T0 = 1_800_000_000.0


def write_marks_file(path: Path, marks: list[tuple[int, int, float, int, list[list[int]]]],
                     samples: list[tuple[float, int]]) -> None:
    """A marks file holding ``marks`` (key, kind, time s, resident pages, shapes) and timer ``samples``."""
    data = bytearray(256 + CAPACITY * SLOT + 16 * SAMPLE_CAPACITY)
    struct.pack_into("<8sqqqq", data, 0, b"MDMARKS1", WORDS, CAPACITY, SAMPLE_CAPACITY, SLOT)
    struct.pack_into("<Q", data, 64, len(marks))
    struct.pack_into("<Q", data, 128, len(samples))
    for i, (key, kind, t, pages, shapes) in enumerate(marks):
        counts = [len(s) for s in shapes] + [0] * (4 - len(shapes))
        values = [v for s in shapes for v in s + [0] * (8 - len(s))] + [0] * (8 * (4 - len(shapes)))
        at = 256 + i * SLOT
        struct.pack_into("<Q", data, at, 2 * i + 2)  # published
        struct.pack_into(f"<{WORDS}q", data, at + 8, i, key, kind, len(shapes), round(t * 1e9), 77, pages,
                         *counts, *values)
    times = 256 + CAPACITY * SLOT
    for j, (t, pages) in enumerate(samples):
        struct.pack_into("<q", data, times + 8 * j, round(t * 1e9))
        struct.pack_into("<q", data, times + 8 * SAMPLE_CAPACITY + 8 * j, pages)
    path.write_bytes(bytes(data))


def keys_lines() -> str:
    """Keys 0/1: begin and end of gradient "a"; 2/3: of gradient "b" (as the hooks make them)."""
    lines = []
    for key, name, extra in ((0, "a", 2), (1, "a", 0), (2, "b", 2), (3, "b", 0)):
        static = [None] if extra else [None, None]  # every shape an input of the mark, as for a dynamic shape
        lines.append(json.dumps({"key": key, "op": "allreduce", "meta": {**META, "name": name}, "extra": extra,
                                 "static": static}))
    return "\n".join(lines) + "\n"


def step_marks(step: int) -> list[tuple[int, int, float, int, list[list[int]]]]:
    """A step's marks: a begins at T0 + step/10, ends 10 ms later; b 20 and 30 ms after the start; the
    RSS 1000 + step pages at each."""
    base = T0 + step / 10
    return [(0, 0, base, 1000 + step, [[4, 8]]), (1, 1, base + 0.01, 1000 + step, [[4, 8], [4, 8]]),
            (2, 0, base + 0.02, 1000 + step, [[16]]), (3, 1, base + 0.03, 1000 + step, [[16], [16]])]


def run_dir(tmp_path: Path, written_steps: int, marked_steps: int, ended: bool = False) -> Path:
    """A run directory of one rank that wrote its records up to step ``written_steps - 1`` itself (and
    rank 0's collective "a" of the next step, at its once-a-second flush) and left the marks of steps 0
    to ``marked_steps - 1`` (the last in progress), and a timer sample of 5000 pages in step 3."""
    out = tmp_path / "run"
    out.mkdir()
    records = [{"type": "start", "rank": 0, "t": T0 - 5}]
    for step in range(-1, written_steps):
        records.append({"type": "step", "rank": 0, "step": step, "t_start": T0 + step / 10,
                        "t_end": T0 + (step + 1) / 10, "hwm_bytes": 900 * PAGE, "peak_rss_bytes": 900 * PAGE})
    flushed = T0 + written_steps / 10 + 0.01
    records.append({"type": "collective", "rank": 0, "step": written_steps, "op": "allreduce", "name": "a",
                    "t": flushed, "gradient": True, "shape_in": [4, 8], "shape_out": [4, 8], "bytes_in": 128,
                    "bytes_out": 128, "itemsize": 4, "dtype": "float32", "sparse": False, "densified": False})
    if ended:
        records.append({"type": "end", "rank": 0, "status": "ok"})
    (out / rundir.rank_file(0)).write_text("".join(json.dumps(r) + "\n" for r in records))
    marks = [m for step in range(marked_steps) for m in step_marks(step)]
    write_marks_file(out / rundir.marks_file(0), marks, [(T0 + 0.315, 5000)])
    (out / rundir.keys_file(0)).write_text(keys_lines())
    return out


def test_the_steps_the_marks_complete_after_the_last_written_one_become_records(tmp_path):
    # GIVEN a rank that wrote steps up to 1 itself and was killed in step 5, its marks of steps 0-5 in its file
    out = run_dir(tmp_path, written_steps=2, marked_steps=6)
    # WHEN the run's marks files are replayed
    done = replay.recover(str(out), range(2))
    # THEN steps 2-4 are written, once each after the rank's own, and step 5 (in progress) is not
    records = read_records(out / rundir.rank_file(0))
    assert [r["step"] for r in records if r["type"] == "step"] == [-1, 0, 1, 2, 3, 4]
    assert done[0]["steps"] == [2, 4]
    [made] = [r for r in records if r["type"] == "replayed"]
    assert made["steps"] == [2, 4] and made["source"] == "rank-0.marks.bin" and made["from_t"] == T0 + 0.2
    # AND each replayed step spans from its first mark to the next step's, its collectives in it
    steps = {r["step"]: r for r in records if r["type"] == "step"}
    for step in (2, 3, 4):
        assert steps[step]["t_start"] == pytest.approx(T0 + step / 10, abs=1e-6)
        assert steps[step]["t_end"] == pytest.approx(T0 + (step + 1) / 10, abs=1e-6)
        assert steps[step]["exact_peak"] is False
        assert "heap_free_bytes" not in steps[step]  # the replaying process's heaps are not the rank's
    calls = [(r["step"], r["name"], r["shape_out"]) for r in records if r["type"] == "collective"]
    # step 2's "a" was written by the rank itself: not again
    assert calls == [(2, "a", [4, 8]), (2, "b", [16]), (3, "a", [4, 8]), (3, "b", [16]), (4, "a", [4, 8]),
                     (4, "b", [16])]
    # AND a step's peak is its largest sample: the marks' RSS up to the next step's first mark, which ends
    # it (as the rank cuts a step's samples), and the timer's 5000 pages in step 3
    assert steps[2]["peak_rss_bytes"] == 1003 * PAGE
    assert steps[3]["peak_rss_bytes"] == 5000 * PAGE
    assert steps[4]["peak_rss_bytes"] == 1005 * PAGE
    assert steps[4]["hwm_bytes"] == 5000 * PAGE  # the run's peak: the largest known
    assert undeclared_record_fields(out) == {}
    # AND the files are gone
    assert not (out / rundir.marks_file(0)).exists() and not (out / rundir.keys_file(0)).exists()


def test_a_rank_that_wrote_no_step_gets_its_set_up_and_steps_from_the_marks(tmp_path):
    out = run_dir(tmp_path, written_steps=-1, marked_steps=3)
    replay.recover(str(out), range(1))
    records = read_records(out / rundir.rank_file(0))
    assert [r["step"] for r in records if r["type"] == "step"] == [-1, 0, 1]


def test_a_rank_that_ended_is_not_replayed_and_its_files_are_deleted(tmp_path):
    out = run_dir(tmp_path, written_steps=2, marked_steps=6, ended=True)
    before = (out / rundir.rank_file(0)).read_text()
    assert replay.recover(str(out), range(1)) == {}
    assert (out / rundir.rank_file(0)).read_text() == before
    assert not (out / rundir.marks_file(0)).exists() and not (out / rundir.keys_file(0)).exists()


def test_a_killed_rank_whose_marks_hold_no_complete_step_writes_nothing(tmp_path):
    out = run_dir(tmp_path, written_steps=5, marked_steps=6)
    before = (out / rundir.rank_file(0)).read_text()
    assert replay.recover(str(out), range(1)) == {}
    assert (out / rundir.rank_file(0)).read_text() == before


def test_a_marks_file_that_cannot_be_read_is_named_in_a_replayed_record(tmp_path):
    out = run_dir(tmp_path, written_steps=2, marked_steps=6)
    (out / rundir.marks_file(0)).write_bytes(b"not a marks file")
    done = replay.recover(str(out), range(1))
    assert "not a memdiag marks file" in done[0]["error"]
    assert not (out / rundir.marks_file(0)).exists()


tf = pytest.importorskip("tensorflow")

KILLED = textwrap.dedent("""
    import os, signal, sys
    import tensorflow as tf
    from memdiag import nativemarks
    marks, used = nativemarks.load(ring_file=sys.argv[1])
    assert used == "native" and marks.ring_file == sys.argv[1], used

    @tf.function
    def step(x):
        marks.mark(5, nativemarks.BEGIN, [tf.shape(x, out_type=tf.int64)])
        y = x * 2.0
        with tf.control_dependencies([y]):
            marks.mark(6, nativemarks.END, [tf.shape(x, out_type=tf.int64), tf.shape(y, out_type=tf.int64)])
        return y

    assert marks.timer_start(0.002)
    for _ in range(7):
        step(tf.ones([3, 5]))
    import time
    time.sleep(0.1)
    print(marks.pending(), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
""")


def test_the_library_keeps_its_marks_and_samples_in_the_file_past_a_kill(tmp_path):
    if not nativemarks.LIBRARY.exists():
        pytest.skip("native marks not built (python -m memdiag.nativemarks build)")
    path = tmp_path / "rank-0.marks.bin"
    # GIVEN a process whose marks and timer are in a file, killed outright after 7 steps of 2 marks
    done = subprocess.run([sys.executable, "-c", KILLED, str(path)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert done.stdout.split() == ["14"]  # none had been read
    # WHEN the file is read
    ring = nativemarks.read_ring_file(str(path))
    # THEN every mark is there, in order, with its key, kind and shapes; and the timer's samples
    assert ring.head == 14 and len(ring.records) == 14
    assert ring.records[:, 0].tolist() == list(range(14))
    assert ring.records[:, 1].tolist() == [5, 6] * 7 and ring.records[:, 2].tolist() == [0, 1] * 7
    assert nativemarks.shape(ring.records[1], 1) == [3, 5]
    assert len(ring.sample_times) >= 5 and all(p > 0 for p in ring.sample_pages)
    assert ring.sample_times == sorted(ring.sample_times)


def test_a_key_keeps_the_shapes_known_when_traced_and_a_mark_supplies_the_others(tmp_path):
    # GIVEN keys written as the hooks write them: an end whose input shape was known when traced and
    # whose output's first dimension was not (an allgather's), and a key from before shapes were kept
    keys = replay.KeysFile(str(tmp_path / "k"))
    keys.add(0, "allgather", META, 0, [[4, 8], None])
    keys.close()
    with open(tmp_path / "k", "a", encoding="utf-8") as f:
        f.write(json.dumps({"key": 1, "op": "allreduce", "meta": META, "extra": 0}) + "\n")
    [(_, _, _, static), (_, _, _, unknown)] = replay.read_keys(str(tmp_path / "k"))
    # WHEN a mark's record holds one shape, [8, 8] (the output's, read when the step ran)
    record = [0] * nativemarks.RECORD_WORDS
    record[3] = 1
    record[nativemarks.HEADER] = 2
    record[nativemarks.HEADER + nativemarks.MAX_INPUTS] = 8
    record[nativemarks.HEADER + nativemarks.MAX_INPUTS + 1] = 8
    # THEN the shapes are the key's known one, then the record's; a key without them reads all from the record
    assert replay.mark_shapes(record, static) == [[4, 8], [8, 8]]
    assert replay.mark_shapes(record, unknown or [None, None]) == [[8, 8], []]
