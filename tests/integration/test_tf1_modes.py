"""Real mpirun, real Horovod, 2 ranks: a TF1 script (tests/tf1_v1_script.py: TF1 behaviour, placeholders of
unknown batch size, a random batch on every rank and step) under every mode.

For each mode: the job's exit status and, as written, its printed losses and final digest as under plain
mpirun; no bookkeeping warning; every gradient collective named after its variable (TF1's ``Variable``,
``Variable_1`` ..., not a call site); and the mode the report names is the mode the records show: under
dense no IndexedSlices allgather is left, under sparse every one is gathered, dedup merges, auto follows
its decision per tensor.
"""

from __future__ import annotations

import json
import re

import pytest

from tests.helpers import ROOT, memdiag, read_json
from tests.integration.test_as_written import plain_mpirun

pytestmark = pytest.mark.mpi

SCRIPT = ROOT / "tests" / "tf1_v1_script.py"
# Rank 0's printed results; not anchored to a line's start, since mpirun.log holds the ranks' stderr too,
# and TensorFlow's warnings can land on the same line
OUTPUT_LINE = re.compile(r"(step \d+ loss -?[0-9.]+|final [0-9a-f]+)")
SESSION = ["--style", "session", "--steps", "4"]
MONITORED = ["--style", "monitored", "--steps", "3"]
SESSION_TABLES = ["Variable:0", "Variable_1:0", "Variable_2:0"]  # embeddings, NCE weights, NCE biases
MONITORED_TABLES = ["model/side:0", "model/table:0"]  # side: the script's own hvd.allreduce in the graph
# What each mode's records show per IndexedSlices gradient (auto: its own decision, checked separately)
SHOWN = {"sparse": {"allgather"}, "dense": {"densified"}, "dedup": {"merged allgather"}}


def shown(summary: dict) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for c in summary["collectives"]:
        if c["sparse"]:
            kind = "densified" if c["densified"] else ("merged allgather" if c["merged"] else "allgather")
            out.setdefault(c["name"], set()).add(kind)
    return out


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    done = plain_mpirun(SCRIPT, SESSION, tmp_path_factory.mktemp("plain") / "timeline.json")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return OUTPUT_LINE.findall(done.stdout)


@pytest.mark.parametrize("mode", ["as-written", "sparse", "dense", "dedup", "auto"])
def test_every_mode_on_a_tf1_session_script_is_applied_as_the_report_names_it(runs_root, plain, mode):
    out = runs_root / f"tf1-session-{mode}"
    done = memdiag("run", str(SCRIPT), "-n", "2", "--out", str(out),
                   *([] if mode == "as-written" else ["--mode", mode]), "--", *SESSION)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = read_json(out / "summary.json")
    text = " ".join(done.stdout.split())
    assert summary["warnings"] == [] and "could not" not in text, text[-3000:]
    # every collective named after what it reduces: no call-site names
    assert not [c["name"] for c in summary["collectives"] if "@" in c["name"]]
    kinds = shown(summary)
    assert sorted(kinds) == SESSION_TABLES
    if mode == "as-written":
        assert OUTPUT_LINE.findall((out / "mpirun.log").read_text()) == plain and len(plain) == 5
        assert all(k == {"allgather"} for k in kinds.values())
        assert "measured as written: memdiag changed nothing in the job" in text
        return
    applied = summary["mode_applied"]
    assert applied["not_applied"] == [] and applied["applied"] == SESSION_TABLES
    if mode == "auto":
        decisions = {p["name"]: p["decision"] for p in summary["policy"]}
        words = {"sparse": "allgather", "dense": "densified", "dedup": "merged allgather"}
        assert all(kinds[n] == {words[decisions[n]]} for n in SESSION_TABLES), (kinds, decisions)
        assert "3 IndexedSlices gradient(s) reduced as its decisions chose" in text
    else:
        assert all(k == SHOWN[mode] for k in kinds.values()), kinds
        assert f"--mode {mode}: 3 IndexedSlices gradient(s) reduced as {mode} says (their records show it)" in text
    if mode != "sparse":
        return
    # the rows each rank's gradient holds, counted by a record the session would never run unless what it
    # fetches waits for it: one per table and step
    counted = [json.loads(line) for line in (out / "rank-0.jsonl").read_text().splitlines()]
    counted = [r for r in counted if r["type"] == "distinct_rows"]
    assert sorted({r["name"] for r in counted}) == SESSION_TABLES and len(counted) >= 3 * len(plain) - 3
    assert all(0 < r["distinct_rows"] <= r["rows"] for r in counted)
    # rows that change every step (the allgathers show them): their range, and the formula from the most
    [embeddings] = [p for p in summary["policy"] if p["name"] == "Variable:0"]
    least, median, most = embeddings["own_rows_range"]
    assert 32 <= least < most <= 96 and least <= median <= most
    assert max(int(r) for r in embeddings["own_rows_by_rank"].values()) == most


@pytest.mark.parametrize("mode", ["as-written", "dense", "auto"])
def test_a_monitored_session_with_compute_and_apply_gradients_and_a_graph_allreduce(runs_root, mode):
    out = runs_root / f"tf1-monitored-{mode}"
    done = memdiag("run", str(SCRIPT), "-n", "2", "--out", str(out),
                   *([] if mode == "as-written" else ["--mode", mode]), "--", *MONITORED)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = read_json(out / "summary.json")
    assert summary["warnings"] == [], summary["warnings"]
    assert len(OUTPUT_LINE.findall((out / "mpirun.log").read_text())) == 3
    kinds = shown(summary)
    assert sorted(kinds) == MONITORED_TABLES
    assert {c["name"] for c in summary["collectives"] if not c["sparse"] and c["op"] == "allreduce"} == {"model/kernel:0"}
    if mode == "as-written":
        assert all(k == {"allgather"} for k in kinds.values())
    elif mode == "dense":
        assert all(k == {"densified"} for k in kinds.values())
        assert summary["mode_applied"]["applied"] == MONITORED_TABLES
    else:
        assert summary["mode_applied"]["not_applied"] == []


def test_a_tf1_script_that_draws_unseeded_batches_is_not_verifiable_by_its_parameters_yet_its_reduction_is(runs_root):
    # GIVEN the session script with the graph's seed but batches from an unseeded generator
    out = runs_root / "tf1-unseeded-compare"
    # WHEN sparse and dense are compared
    done = memdiag("compare", "sparse-vs-dense", str(SCRIPT), "-n", "2", "--modes", "sparse,dense",
                   "--out", str(out), "--", *SESSION, "--unseeded", "data")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = read_json(out / "compare.json")["correctness"]
    # THEN the final parameters decide nothing, and the report says what varied before any reduction
    [check] = result["checks"]
    assert check["passed"] is None, check
    assert check["note"].startswith("not verifiable from the final parameters")
    assert "the rows the first step looked up (the data)" in check["note"]
    assert all(name in check["note"] for name in SESSION_TABLES)
    # AND the reduction check, run inside the TF1 graph, reduced the three gradients both ways and decides
    assert sorted(result["reduction"]["tensors"]) == SESSION_TABLES
    assert result["reduction"]["passed"] is True and result["passed"] is True
    text = " ".join(done.stdout.split())
    assert "Correctness PASSED: final parameters not compared" in text and "FAILED" not in text


ESTIMATOR = ROOT / "tests" / "estimator_script.py"
FINAL = re.compile(r"final ([0-9a-f]{16})")


# The extended tier (about 35 s for the three runs on 2 cores): the core tier's session and monitored-session
# scripts take the same TF1 path through Horovod's DistributedOptimizer.
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["as-written", "dense", "auto"])
def test_an_estimator_with_an_embedding_under_every_mode_is_reduced_as_the_report_names_it(runs_root, tmp_path, mode):
    # GIVEN a tf.estimator job (model_fn, DistributedOptimizer over TF1 Adam, BroadcastGlobalVariablesHook)
    out = runs_root / f"estimator-{mode}"
    done = memdiag("run", str(ESTIMATOR), "-n", "2", "--out", str(out), *([] if mode == "as-written" else ["--mode", mode]),
                   "--", "--steps", "4", "--model-dir", str(tmp_path / "model"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = read_json(out / "summary.json")
    assert summary["warnings"] == [], summary["warnings"]
    # THEN its four steps are recorded on both ranks, the table's gradient and the head's are named
    assert [r["steps_completed"] for r in summary["ranks"]] == [4, 4]
    assert {c["name"] for c in summary["collectives"] if c["op"] == "allreduce" and not c["sparse"]} == \
        {"dense/kernel:0", "dense/bias:0"}
    kinds = shown(summary)
    assert sorted(kinds) == ["table:0"]
    if mode == "as-written":
        # AND as written it trains exactly as under plain mpirun
        plain = plain_mpirun(ESTIMATOR, ["--steps", "4", "--model-dir", str(tmp_path / "plain-model")],
                             tmp_path / "timeline.json")
        assert plain.returncode == 0, plain.stderr[-3000:]
        assert FINAL.findall((out / "mpirun.log").read_text()) == FINAL.findall(plain.stdout) != []
        assert kinds["table:0"] == {"allgather"}
        return
    applied = summary["mode_applied"]
    assert applied["applied"] == ["table:0"] and applied["not_applied"] == [] and applied["unlabelled"] == []
    if mode == "dense":
        assert kinds["table:0"] == {"densified"}
    else:
        [policy] = summary["policy"]
        # 2 ranks x 512 ids x (32 floats + an int64 index) gathered, against the 4000 x 32 float table
        assert policy["decision"] == "sparse" and kinds["table:0"] == {"allgather"}
        assert policy["gathered_bytes"] == 2 * 64 * 8 * (32 * 4 + 8) < 4000 * 32 * 4
