"""The live collective model, from the records: grouped allgathers alive together, unnamed allgathers from
one line of code told apart by their occurrence in the step. Figures worked out by hand.

Per step and rank, N=2, float32 values and int32 indices:
- IndexedSlices A: 1000 rows of 8 floats per rank: gathered values 2000 x 32 = 64,000 B, indices 2000 x 4
  = 8,000 B; B: 500 rows: 32,000 B and 4,000 B. op=Average (Horovod's default): each values output gets
  a quotient as large.
- an unnamed allgather from one line of a script, called twice per step: [100, 4] float32 in, [200, 4]
  out, 3,200 B each.
- a dense kernel allreduced: 8 x 8 x 4 = 256 B.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memdiag.agent.sampler import MemorySampler
from memdiag.agent.tracer import Tracer
from memdiag.analyze.model import build_model
from memdiag.analyze.summary import summarize
from memdiag.format.reader import load_run
from memdiag.format.writer import RecordWriter
from memdiag.formula import SparseGradientShape
from memdiag.policy import decide
from tests.unit.fake_run import meta

UNNAMED = "allgather@train.py:12[?x4]"
ROWS = {"m/a:0": 1000, "m/b:0": 500}


def run(path: Path, grouped: bool) -> dict:
    path.mkdir()
    (path / "run.json").write_text(json.dumps({"script": "train.py", "mode": "sparse", "world_size": 2,
                                               "steps": 3, "status": "ok"}))
    for rank in range(2):
        writer = RecordWriter(str(path / f"rank-{rank}.jsonl"), rank)
        tracer = Tracer(writer, MemorySampler(), rank, auto_steps=False)
        writer.write_now({"type": "start", "size": 2, "host": "h", "versions": {}})
        for name, rows in ROWS.items():
            writer.add({**decide("sparse", name, 2, SparseGradientShape(rows, 32, 4, 10_000, 8), local_rows=rows)
                        .as_record(), "step": -1})
        for step in range(3):
            tracer.begin_step(step)
            for part, width in (("values", [8]), ("indices", [])):  # a grouped call: every values, then every indices
                for name, rows in ROWS.items():
                    record = {**meta("allgather", name, part, sparse=True, dtype="float32" if width else "int32"),
                              "grouped": grouped}
                    tracer.collective(record, [rows, *width], [2 * rows, *width])
            for _ in range(2):
                tracer.collective(meta("allgather", UNNAMED), [100, 4], [200, 4])
            tracer.collective(meta("allreduce", "m/kernel:0"), [8, 8], [8, 8])
            tracer.end_step(step, loss=1.0, items=1, param_digest="d")
        writer.write_now({"type": "end", "status": "ok", "error": None, "hwm_bytes": 1})
        writer.close()
    return summarize(load_run(str(path)))


def test_the_allgathers_of_one_grouped_call_are_alive_together(tmp_path):
    summary = run(tmp_path / "grouped", grouped=True)
    # A and B together: 64,000 + 8,000 + 32,000 + 4,000 = 108,000 gathered, quotients 96,000; the kernel 256
    assert [r["collective_live_peak_bytes"] for r in summary["ranks"]] == [204_256, 204_256]
    assert summary["allgather_groups"] == [["m/a:0", "m/b:0"]]
    # the model holds them together too: A's and B's outputs and both quotients at N=2
    summary["steady_peak_rss_bytes_max"] = summary["peak_rss_bytes_max"] = 10**9
    assert build_model([summary]).held_bytes("sparse", 2) == 108_000 + 96_000


def test_allgathers_of_separate_calls_are_alive_one_at_a_time(tmp_path):
    summary = run(tmp_path / "apart", grouped=False)
    # the largest, A's 72,000, beside the largest quotient, A's 64,000
    assert [r["collective_live_peak_bytes"] for r in summary["ranks"]] == [136_256, 136_256]
    assert summary["allgather_groups"] == []
    summary["steady_peak_rss_bytes_max"] = summary["peak_rss_bytes_max"] = 10**9
    assert build_model([summary]).held_bytes("sparse", 2) == 72_000 + 64_000


@pytest.mark.parametrize("grouped", [True, False])
def test_an_unnamed_allgather_called_twice_in_a_step_is_two_tensors_not_one(tmp_path, grouped):
    # GIVEN the gradients left out: a step of the two unnamed allgathers and the kernel alone
    path = tmp_path / "unnamed"
    path.mkdir()
    (path / "run.json").write_text(json.dumps({"script": "train.py", "mode": "sparse", "world_size": 2,
                                               "steps": 1, "status": "ok"}))
    writer = RecordWriter(str(path / "rank-0.jsonl"), 0)
    tracer = Tracer(writer, MemorySampler(), 0, auto_steps=False)
    tracer.begin_step(0)
    for _ in range(2):
        tracer.collective({**meta("allgather", UNNAMED), "grouped": grouped}, [100, 4], [200, 4])
    tracer.collective(meta("allreduce", "m/kernel:0"), [8, 8], [8, 8])
    tracer.end_step(0, loss=1.0, items=1)
    writer.close()
    [rank] = summarize(load_run(str(path)))["ranks"]
    # one at a time: 3,200 + 256, not 6,400 + 256 as one tensor; a grouped call holds both: 6,400 + 256
    assert rank["collective_live_peak_bytes"] == (6_400 if grouped else 3_200) + 256
