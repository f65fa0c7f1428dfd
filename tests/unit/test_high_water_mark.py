"""A step's peak RSS is exact: the kernel's high-water mark, reset when the step begins."""

import json

import numpy as np
import pytest

from memdiag.agent.sampler import MemorySampler, read_rss, reset_hwm
from memdiag.agent.tracer import Tracer
from memdiag.format.writer import RecordWriter

MiB = 1 << 20

pytestmark = pytest.mark.skipif(not reset_hwm(), reason="this kernel refuses to reset VmHWM (/proc/self/clear_refs)")


def steps(path):
    return {r["step"]: r for r in map(json.loads, path.read_text().splitlines()) if r["type"] == "step"}


def test_a_buffer_freed_between_two_samples_sets_its_steps_peak_and_not_the_next_steps(tmp_path):
    # GIVEN a tracer whose sampler never samples in the background (only when a step ends)
    writer = RecordWriter(str(tmp_path / "rank-0.jsonl"), 0)
    tracer = Tracer(writer, MemorySampler(), 0, auto_steps=False)
    # AND an earlier peak higher than any step's (as tracing a graph makes), so the process's mark
    # would not rise during the steps
    earlier = np.ones(128 * MiB, dtype=np.float32)
    del earlier
    base = read_rss()
    # WHEN step 0 touches 256 MiB and frees it before the step ends, and step 1 allocates nothing
    tracer.begin_step(0)
    buffer = np.ones(64 * MiB, dtype=np.float32)
    del buffer
    tracer.end_step(0)
    tracer.begin_step(1)
    tracer.end_step(1)
    writer.close()
    # THEN step 0's peak holds the buffer, which no sample saw, and step 1's does not
    records = steps(tmp_path / "rank-0.jsonl")
    assert records[0]["exact_peak"] and records[1]["exact_peak"]
    assert records[0]["peak_rss_bytes"] >= base + 250 * MiB  # the kernel counts pages in batches
    assert records[0]["sampled_peak_rss_bytes"] < base + 128 * MiB
    assert records[1]["peak_rss_bytes"] < base + 128 * MiB
    # AND the run's high-water mark keeps the buffer across the reset
    assert records[1]["hwm_bytes"] >= base + 250 * MiB


def test_a_mark_read_long_after_the_step_ended_is_not_that_step_s_peak(tmp_path):
    # GIVEN a tracer sampling every 5 ms, and steps ended from marks read in a batch, as --record-every
    # drains them: step 0 ended a second before the marks were read
    import time

    writer = RecordWriter(str(tmp_path / "rank-0.jsonl"), 0)
    tracer = Tracer(writer, MemorySampler(0.005), 0, auto_steps=False)
    earlier = np.ones(128 * MiB, dtype=np.float32)
    del earlier
    base = read_rss()
    tracer.begin_step(0)
    ended = time.time()
    # WHEN a buffer of 256 MiB lives and dies after step 0's end, in what is the next step's time
    buffer = np.ones(64 * MiB, dtype=np.float32)
    del buffer
    time.sleep(0.05)
    tracer.end_step(0, at=ended)
    tracer.begin_step(1, at=ended)
    tracer.end_step(1)
    writer.close()
    # THEN step 0 does not claim the buffer: its peak is its samples', and it says it is not exact
    records = steps(tmp_path / "rank-0.jsonl")
    assert records[0]["exact_peak"] is False
    assert records[0]["peak_rss_bytes"] == records[0]["sampled_peak_rss_bytes"] < base + 128 * MiB
    # AND the run's high-water mark still holds it
    assert records[1]["hwm_bytes"] >= base + 250 * MiB
