"""What glibc's heaps hold freed and keep (memdiag.agent.heap): read at each step's record, carried to the
steady figures, the summary and a comparison, and named in the growth verdict beside the model's buffers.

A comparison of one averaged embedding table at N = 2, 4, 8, written as rank records with memdiag's own
writer (tests/unit/test_live_bounds.py), whose peaks grow by the model's buffers and a further amount per
added rank; the heaps' freed bytes written into its step records grow by all or part of that amount.
"""

from __future__ import annotations

import ctypes
import json
from pathlib import Path

import pytest

from memdiag.agent import heap
from memdiag.analyze import compare as compare_analysis
from memdiag.analyze.steady import steady_figures
from memdiag.analyze.summary import summarize
from memdiag.format.reader import load_run
from tests.unit.test_live_bounds import BASE, KERNEL_BYTES, RANK_COUNTS, STEPS, one_at_a_time, words, write_run

MiB = 2**20


def test_the_heaps_freed_bytes_rise_when_chunks_between_live_ones_are_freed():
    # GIVEN glibc's malloc (this platform's): 200 chunks of 64 KiB, below its mmap threshold, from its heaps
    if heap.free_bytes() is None:
        pytest.skip("the C library has no mallinfo2")
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    chunks = [libc.malloc(64 * 1024) for _ in range(200)]
    for chunk in chunks:
        ctypes.memset(chunk, 1, 64 * 1024)
    before = heap.free_bytes()
    # WHEN every other one is freed: they sit between live chunks, so the heap keeps them
    for chunk in chunks[::2]:
        libc.free(chunk)
    after = heap.free_bytes()
    for chunk in chunks[1::2]:
        libc.free(chunk)
    # THEN the heaps hold about 100 x 64 KiB more freed bytes
    assert before is not None and after is not None
    assert after - before >= 90 * 64 * 1024


def test_a_step_record_carries_the_heaps_freed_bytes(tmp_path):
    from memdiag.agent.sampler import MemorySampler
    from memdiag.agent.tracer import Tracer
    from memdiag.format.writer import RecordWriter
    from tests.helpers import read_records

    if heap.free_bytes() is None:
        pytest.skip("the C library has no mallinfo2")
    writer = RecordWriter(str(tmp_path / "r.jsonl"), 0)
    tracer = Tracer(writer, MemorySampler(0.005), rank=0, auto_steps=False)
    for step in range(2):
        tracer.begin_step(step)
        tracer.end_step(step)
    writer.close()
    steps = [r for r in read_records(tmp_path / "r.jsonl") if r["type"] == "step"]
    # the first step is always read; the second, of no time, is beyond the reads' share of the steps' time
    assert len(steps) == 2 and isinstance(steps[0]["heap_free_bytes"], int) and steps[0]["heap_free_bytes"] >= 0
    assert "heap_free_bytes" not in steps[1]


def test_the_steady_figure_is_the_heaps_freed_bytes_at_the_steady_peaks_step():
    steps = [{"step": s, "peak_rss_bytes": peak, "heap_free_bytes": free}
             for s, (peak, free) in enumerate([(900, 1), (1000, 2), (1000, 3), (1010, 7), (1005, 5)])]
    assert steady_figures(steps)["heap_free_bytes"] == 7  # type: ignore[arg-type]
    # where the peak's step was not read (the reads' budget), the last read before it
    del steps[3]["heap_free_bytes"]
    assert steady_figures(steps)["heap_free_bytes"] == 3  # type: ignore[arg-type]
    assert steady_figures([{k: v for k, v in s.items() if k != "heap_free_bytes"} for s in steps])["heap_free_bytes"] is None  # type: ignore[arg-type,misc]


def test_the_reads_keep_within_their_share_of_the_steps_time(monkeypatch):
    from memdiag.agent import tracer as tracer_module
    from memdiag.agent.sampler import MemorySampler
    from memdiag.agent.tracer import HEAP_BUDGET, Tracer
    from memdiag.format.writer import RecordWriter

    # GIVEN a read of the heaps that takes 1/128 s (7.8 ms), and 100 steps of 1 s each
    cost = 1 / 128
    clock = [0.0]  # the tracer's perf_counter, advanced by the reads alone

    def read() -> int:
        clock[0] += cost
        return 7

    monkeypatch.setattr(heap, "free_bytes", read)
    monkeypatch.setattr(tracer_module, "perf_counter", lambda: clock[0])
    assert HEAP_BUDGET == 0.002
    tracer = Tracer(RecordWriter("/dev/null", 0), MemorySampler(0.005), rank=0, auto_steps=False)
    got = [tracer._heap_free(1.0) for _ in range(100)]
    # THEN the first step is read, and after it a step only when the reads, that one's included, stay within
    # 0.2% of the steps' seconds: after k reads the next is at the first step i with (k + 1) x cost <= 0.002 i
    read_at = [i + 1 for i, value in enumerate(got) if value is not None]
    assert read_at == [1, 8, 12, 16, 20, 24, 28, 32, 36, 40, 43, 47, 51, 55, 59, 63, 67, 71, 75, 79, 83, 86, 90, 94, 98]
    assert all(value in (None, 7) for value in got)


def one_table_run(path: Path, n: int, peak: int, heap_free: int) -> str:
    """write_run's run of table A alone (B's records dropped), every step record with ``heap_free``."""
    run = write_run(path, n, peak)
    for rank_file in run.glob("rank-*.jsonl"):
        records = [json.loads(line) for line in rank_file.read_text().splitlines() if "model/b/" not in line]
        for record in records:
            if record.get("type") == "step":
                record["heap_free_bytes"] = heap_free
        rank_file.write_text("".join(json.dumps(r) + "\n" for r in records))
    (run / "summary.json").write_text(json.dumps(summarize(load_run(str(run))), default=str))
    return str(run)


def comparison(root: Path, extra: int, heap_per_rank: int, heap_offsets: tuple[int, ...] = (0, 0)) -> dict:
    """One table at N = 2, 4, 8, each measured once per entry of ``heap_offsets`` with the same peaks (run-to-run
    noise 0): the peak grows by the model's buffers and ``extra`` per added rank, the heaps' freed bytes by
    ``heap_per_rank``, each repeat's offset by its entry."""
    per_rank = one_at_a_time(1) - KERNEL_BYTES  # A's gathered values and indices and its quotient
    run_dirs = {}
    for n in RANK_COUNTS:
        run_dirs[(n, "sparse")] = [
            one_table_run(root / f"n{n}-sparse-{i}", n, BASE + n * (per_rank + extra), 100 * MiB + n * heap_per_rank + offset)
            for i, offset in enumerate(heap_offsets)]
    result = compare_analysis.build("synthetic", "one-table", run_dirs if len(heap_offsets) > 1
                                    else {key: paths[0] for key, paths in run_dirs.items()})
    result.update(rank_counts=list(RANK_COUNTS), modes=["sparse"], steps=STEPS, repeats=len(heap_offsets))
    return json.loads(json.dumps(result, default=str))


def test_a_gap_the_heaps_freed_bytes_cover_is_named_and_not_called_unexplained(tmp_path):
    # GIVEN a growth 30 MiB per added rank above the model's buffers, all of it in the heaps' freed bytes
    result = comparison(tmp_path, 30 * MiB, 30 * MiB)
    physics = result["physics"]
    # THEN the comparison carries the heaps' growth, by hand, for the whole fit and for each segment
    assert result["heap_free_growth_bytes_per_rank"]["sparse"] == pytest.approx(30 * MiB)
    assert physics["sparse_heap_free_growth_bytes_per_rank"] == pytest.approx(30 * MiB)
    segments = physics["sparse_segments"]
    assert [s["heap_free_bytes_per_rank"] for s in segments] == [pytest.approx(30 * MiB)] * 2
    assert all(s["beyond_noise"] is True and s["beyond_noise_after_heap"] is False for s in segments)
    # AND the verdict names it, and no segment is called unexplained
    text = words(result)
    assert "glibc's heaps kept +30 MiB per added rank of freed memory (resident, in no tensor" in text
    assert "unexplained" not in text
    assert text.count("and the rest of the gap is within two standard errors of the repeats (\u00b10 B per added rank each)") == 2
    # AND the whole growth, beyond two standard errors of the model, is within them with the heaps counted
    assert physics["sparse_growth_within_noise"] is False and physics["sparse_growth_within_after_named"] is True
    assert "within them with the +30 MiB per added rank that glibc's heaps kept freed counted" in text
    # AND the growth table has the heaps' column
    assert "heaps' freed" in text


def test_a_gap_beyond_the_heaps_freed_bytes_is_unexplained_by_what_is_left(tmp_path):
    # GIVEN a growth 30 MiB per added rank above the model's buffers, 10 MiB of it in the heaps' freed bytes
    result = comparison(tmp_path, 30 * MiB, 10 * MiB)
    [first, second] = result["physics"]["sparse_segments"]
    assert first["beyond_noise_after_heap"] is True and second["beyond_noise_after_heap"] is True
    # THEN each segment's unexplained part is what the heaps leave: the gap less 10 MiB per added rank
    text = words(result)
    left = first["unexplained_bytes_per_rank"] - 10 * MiB
    assert left == pytest.approx(20 * MiB, abs=MiB)
    # each segment names them, and so does the verdict's weighing of the whole growth
    assert text.count("that glibc's heaps kept freed") == 3
    assert "and beyond them with the +10 MiB per added rank that glibc's heaps kept freed counted" in text
    assert "unexplained: +2" in text.split("N=2 to 4:")[1].split("; N=4 to 8")[0]


def test_without_the_figure_the_verdict_says_nothing_of_the_heaps(tmp_path):
    # GIVEN runs whose records carry no heap figure (another C library, or a run made before it was read)
    per_rank = one_at_a_time(1) - KERNEL_BYTES
    run_dirs = {(n, "sparse"): str(write_run(tmp_path / f"n{n}-sparse", n, BASE + n * per_rank)) for n in RANK_COUNTS}
    result = compare_analysis.build("synthetic", "two-tables", run_dirs)
    result.update(rank_counts=list(RANK_COUNTS), modes=["sparse"], steps=STEPS, repeats=1)
    result = json.loads(json.dumps(result, default=str))
    assert result["heap_free_growth_bytes_per_rank"] == {}
    text = words(result)
    assert "heaps" not in text


def test_a_heap_growth_within_its_own_spread_is_said_so_and_left_in_the_gap(tmp_path):
    # GIVEN the heaps' freed bytes growing 30 MiB a rank in the medians of two repeats that differ by 200 MiB
    # in every configuration, and the peaks alike in both (their noise 0), 30 MiB a rank above the model
    result = comparison(tmp_path, 30 * MiB, 30 * MiB, heap_offsets=(0, 200 * MiB))
    physics = result["physics"]
    assert result["heap_free_noise_bytes"] == 200 * MiB
    assert physics["sparse_heap_free_growth_bytes_per_rank"] == pytest.approx(30 * MiB)
    # THEN over N=2 to 8 (180 MiB) it is within its own spread, and so in each segment (60 and 120 MiB)
    assert physics["sparse_heap_free_within_noise"] is True
    assert [s["heap_free_beyond_noise"] for s in physics["sparse_segments"]] == [False, False]
    text = words(result)
    assert "glibc's heaps' freed memory moved by +30 MiB per added rank, within its run-to-run spread (200 MiB)" in text
    # AND the gaps stay unexplained in full: the heaps' growth is not counted against them
    assert text.count("unexplained: +30 MiB per added rank") == 2 and "that glibc's heaps kept freed" not in text


def test_from_one_run_the_heaps_figure_is_named_as_one_runs(tmp_path):
    result = comparison(tmp_path, 30 * MiB, 30 * MiB, heap_offsets=(0,))
    assert result["physics"]["sparse_heap_free_within_noise"] is None
    text = words(result)
    assert "glibc's heaps kept +30 MiB per added rank of freed memory (resident, in no tensor; measured at the " \
           "largest rank's peak step, one run)" in text
