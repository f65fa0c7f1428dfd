"""The mode a run names is the mode its records show; rows that change from step to step.

Runs are written by memdiag's own record writer and tracer, as a rank writes them. A 5000 x 32 float32
table with int32 ids gathers 32 x 4 + 4 = 132 B a row; its dense allreduce is 5000 x 128 = 640,000 B.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

from rich.console import Console

from memdiag.agent.sampler import MemorySampler
from memdiag.agent.tracer import Tracer
from memdiag.analyze.mode_applied import mode_applied, recorded_reductions
from memdiag.analyze.summary import summarize
from memdiag.format.reader import load_run
from memdiag.format.writer import RecordWriter
from memdiag.report.terminal import script_text
from tests.unit.fake_run import meta

TABLE, OTHER, WIDTH, VOCAB = "Variable:0", "Variable_1:0", 32, 5000


def run_with(path: Path, mode: str, gathered: dict[str, bool], rows_by_step: list[list[int]] | None = None,
             not_applied: dict[str, str] | None = None, labelling_error: str | None = None) -> dict:
    """Two ranks; per table in ``gathered``: True its rows allgathered, False densified; ``rows_by_step[s][r]``:
    rank r's rows at step s (default 50)."""
    path.mkdir(parents=True, exist_ok=True)
    rows_by_step = rows_by_step or [[50, 50]] * 3
    (path / "run.json").write_text(json.dumps({"script": "s.py", "mode": mode, "world_size": 2, "status": "ok",
                                               "steps": len(rows_by_step),
                                               "changes_to_job": [f"--mode {mode}: IndexedSlices gradients reduced "
                                                                  f"as mode {mode} says"]}))
    for rank in range(2):
        writer = RecordWriter(str(path / f"rank-{rank}.jsonl"), rank)
        tracer = Tracer(writer, MemorySampler(), rank, auto_steps=False)
        writer.write_now({"type": "start", "size": 2, "host": "h", "versions": {}})
        for name, why in (not_applied or {}).items():
            writer.add({"type": "not_applied", "step": -1, "name": name, "mode": mode, "error": why})
        if labelling_error:
            writer.add({"type": "bookkeeping", "step": -1, "what": "label the gradients", "error": labelling_error})
        for step, rows in enumerate(rows_by_step):
            tracer.begin_step(step)
            for name, gather in gathered.items():
                if gather:
                    tracer.collective(meta("allgather", name, "values", sparse=True), [rows[rank], WIDTH],
                                      [sum(rows), WIDTH])
                    tracer.collective(meta("allgather", name, "indices", sparse=True, dtype="int32"), [rows[rank]],
                                      [sum(rows)])
                else:
                    tracer.collective(meta("allreduce", name, sparse=True, densified=True), [VOCAB, WIDTH],
                                      [VOCAB, WIDTH])
            if labelling_error:  # an IndexedSlices memdiag could not label: named by its call site
                tracer.collective(meta("allgather", "allgather@s.py:17[?x32]"), [rows[rank], WIDTH],
                                  [sum(rows), WIDTH])
            tracer.end_step(step, loss=1.0)
        writer.write_now({"type": "end", "status": "ok", "error": None, "hwm_bytes": 1})
        writer.close()
    return summarize(load_run(str(path)))


def header(summary: dict) -> str:
    console = Console(width=200, file=io.StringIO(), force_terminal=True, color_system=None)
    console.print(script_text(summary))
    return console.file.getvalue()


def test_dense_applied_to_every_gradient_says_so_from_the_records(tmp_path):
    summary = run_with(tmp_path / "r", "dense", {TABLE: False, OTHER: False})
    assert summary["mode_applied"]["applied"] == [TABLE, OTHER] and summary["mode_applied"]["not_applied"] == []
    assert "--mode dense: 2 IndexedSlices gradient(s) reduced as dense says (their records show it)" in header(summary)
    assert "NOT applied" not in header(summary)


def test_dense_that_left_a_gradient_gathered_names_it_and_why_and_claims_only_what_it_did(tmp_path):
    # GIVEN --mode dense, one table densified, the other still allgathered because its decision raised
    summary = run_with(tmp_path / "r", "dense", {TABLE: False, OTHER: True},
                       not_applied={OTHER: "TypeError: __int__ returned non-int (type NoneType)"})
    [miss] = summary["mode_applied"]["not_applied"]
    assert miss == {"name": OTHER, "expected": "dense", "recorded": ["sparse"],
                    "why": "TypeError: __int__ returned non-int (type NoneType)"}
    text = header(summary)
    assert "--mode dense: applied to 1 of 2 IndexedSlices gradient(s)" in text
    assert (f"--mode dense NOT applied to {OTHER}: its records show an allgather, not a dense allreduce "
            "(TypeError: __int__ returned non-int (type NoneType))") in text
    assert "reduced as mode dense says" not in text  # the option's own words are not repeated as a fact


def test_sparse_is_applied_only_where_every_gradient_was_gathered(tmp_path):
    summary = run_with(tmp_path / "r", "sparse", {TABLE: True, OTHER: False})
    assert summary["mode_applied"]["applied"] == [TABLE]
    assert [m["name"] for m in summary["mode_applied"]["not_applied"]] == [OTHER]


def test_gradients_memdiag_could_not_label_are_named_by_call_site_and_the_mode_is_not_claimed(tmp_path):
    summary = run_with(tmp_path / "r", "dense", {}, labelling_error="TypeError: boom")
    assert summary["mode_applied"]["unlabelled"] == ["allgather@s.py:17[?x32]"]
    text = header(summary)
    assert "NOT applied to 1 allgather(s) memdiag could not tie to a variable: allgather@s.py:17[?x32]" in text


def test_a_mode_with_no_indexed_slices_says_it_changed_nothing(tmp_path):
    summary = run_with(tmp_path / "r", "dense", {})
    assert "the records show no IndexedSlices gradient, so it changed no reduction" in header(summary)


def test_auto_is_checked_against_its_own_decision_per_gradient():
    collectives = [{"name": TABLE, "op": "allgather", "part": "values", "sparse": True, "densified": False,
                    "merged": True},
                   {"name": OTHER, "op": "allreduce", "part": None, "sparse": True, "densified": True, "merged": False}]
    policies = [{"name": TABLE, "decision": "dedup"}, {"name": OTHER, "decision": "sparse"}]
    result = mode_applied("auto", collectives, policies, {}, None)
    assert result is not None and result["applied"] == [TABLE]
    assert result["not_applied"][0]["recorded"] == ["dense"] and result["not_applied"][0]["expected"] == "sparse"
    assert recorded_reductions(collectives) == {TABLE: {"dedup"}, OTHER: {"dense"}}
    assert mode_applied("as-written", collectives, policies, {}, None) is None


def test_a_collective_whose_rows_change_every_step_is_shown_by_its_largest_call(tmp_path):
    # GIVEN rank 0 with 40, 60, 50 rows and rank 1 with 70, 30, 55 rows on three steps
    summary = run_with(tmp_path / "r", "sparse", {TABLE: True}, rows_by_step=[[40, 70], [60, 30], [50, 55]])
    [collective] = [c for c in summary["collectives"] if c["part"] == "values"]
    # THEN the table shows the largest call (40 + 70 rows gathered at step 0), as the received bytes do
    assert collective["rows_out"] == 110 and collective["bytes_out_per_rank"] == 110 * WIDTH * 4


def test_the_policy_entry_gives_the_rows_range_least_median_most(tmp_path):
    path = tmp_path / "r"
    run_with(path, "sparse", {TABLE: True}, rows_by_step=[[40, 70], [60, 30], [50, 55]])
    # a policy record per rank, as the agent writes when the batch size is unknown at trace time
    for rank in range(2):
        with open(path / f"rank-{rank}.jsonl", "a") as f:
            f.write(json.dumps({"type": "policy", "rank": rank, "step": -1, "name": TABLE, "mode": "sparse",
                                "decision": "sparse", "reason": "r", "world_size": 2, "local_rows": None,
                                "row_bytes": 128, "index_bytes": 4, "dense_rows": VOCAB, "row_elements": WIDTH,
                                "dense_bytes": VOCAB * 128}) + "\n")
    [policy] = summarize(load_run(str(path)))["policy"]
    assert policy["own_rows_range"] == [30, 50, 70]  # six (rank, step) rows: 30 40 50 55 60 70, the lower middle 50
    assert policy["gathered_rows_range"] == [90, 105, 110]  # per step: 110, 90, 105
    assert policy["own_rows_by_rank"] == {"0": 60, "1": 70} and policy["rows_gathered"] == 110
    assert policy["formula_gathered_bytes"] == 110 * 132


def test_a_shape_of_unknown_rows_under_tf1_shape_behaviour_gives_its_sizes_without_rows():
    # TF1's shape behaviour (tf.compat.v1.disable_v2_behavior) indexes shapes as Dimension objects, whose
    # unknown size is not None: run in a process of its own, since the switch is global.
    code = """
import tensorflow.compat.v1 as tf
tf.disable_v2_behavior()
from memdiag.densify import row_shape, sparse_shape
g = tf.Graph()
with g.as_default():
    table = tf.Variable(tf.zeros([5000, 32]))
    ids = tf.placeholder(tf.int32, [None])
    [grad] = tf.gradients(tf.reduce_sum(tf.nn.embedding_lookup(table, ids)), [table])
    assert isinstance(grad, tf.IndexedSlices)
    print(sparse_shape(grad, table), row_shape(grad, table))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().endswith("None SparseGradientShape(rows_per_rank=0, row_bytes=128, index_bytes=4, "
                                        "dense_rows=5000, row_elements=32, distinct_rows=None)")


def test_ranks_with_different_but_steady_rows_have_no_range(tmp_path):
    path = tmp_path / "r"
    run_with(path, "sparse", {TABLE: True}, rows_by_step=[[40, 70]] * 3)
    for rank in range(2):
        with open(path / f"rank-{rank}.jsonl", "a") as f:
            f.write(json.dumps({"type": "policy", "rank": rank, "step": -1, "name": TABLE, "mode": "sparse",
                                "decision": "sparse", "reason": "r", "world_size": 2, "local_rows": None,
                                "row_bytes": 128, "index_bytes": 4, "dense_rows": VOCAB, "row_elements": WIDTH,
                                "dense_bytes": VOCAB * 128}) + "\n")
    [policy] = summarize(load_run(str(path)))["policy"]
    assert "own_rows_range" not in policy and policy["own_rows_by_rank"] == {"0": 40, "1": 70}
