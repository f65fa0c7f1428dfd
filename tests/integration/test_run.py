"""Real mpirun, real Horovod, 2 ranks, tiny Transformer: what `memdiag run` writes and records."""

from __future__ import annotations

import glob
import os
import tempfile

import pytest

from memdiag.workloads.configs import PRESETS
from tests.helpers import memdiag, read_json, read_records, undeclared_record_fields
from tests.tensorboard_reader import read_back

pytestmark = pytest.mark.mpi
TINY = PRESETS["transformer"]["tiny"]


# sparse_run: tests/conftest.py (shared with test_faults.py)


@pytest.fixture(scope="module")
def dense_run(runs_root):
    out = runs_root / "dense-n2"
    result = memdiag("run", "transformer", "-n", "2", "--steps", "3", "--mode", "dense", "--out", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    return out, result


def test_run_writes_the_run_directory(sparse_run):
    out, _ = sparse_run
    for name in ("run.json", "rank-0.jsonl", "rank-1.jsonl", "summary.json", "params.npz", "mpirun.log"):
        assert (out / name).exists(), name
    manifest = read_json(out / "run.json")
    assert manifest["status"] == "ok" and manifest["rank_status"] == {"0": "ok", "1": "ok"}
    assert manifest["versions"]["tensorflow"] == "2.15.1" and manifest["versions"]["horovod"] == "0.28.1"
    summary = read_json(out / "summary.json")
    assert {"workload", "mode", "world_size", "ranks", "collectives"} <= set(summary)
    assert summary["world_size"] == 2 and [r["rank"] for r in summary["ranks"]] == [0, 1]
    for r in summary["ranks"]:
        assert r["peak_rss_bytes"] > 100 * 2**20 and r["hwm_bytes"] >= r["peak_rss_bytes"] * 0.99
        assert r["step_time_s"] > 0
    # every field the ranks wrote is declared in memdiag.format.records, the readers' types
    assert undeclared_record_fields(out) == {}


def test_sparse_embedding_gradient_is_an_allgather_of_n_times_the_batch_rows(sparse_run):
    out, _ = sparse_run
    # rows come from the real batch: one row per source token looked up on the rank
    rows = TINY.batch_size * TINY.seq_len
    records = [r for r in read_records(out / "rank-0.jsonl")
               if r["type"] == "collective" and r["step"] >= 0 and "source_embedding" in r["name"]]
    assert len(records) == 2 * 3  # values and indices, every step
    values = [r for r in records if r["part"] == "values"]
    assert all(r["op"] == "allgather" and r["sparse"] and not r["densified"] for r in values)
    assert all(r["shape_in"] == [rows, TINY.d_model] and r["shape_out"] == [2 * rows, TINY.d_model] for r in values)
    summary = read_json(out / "summary.json")
    entry = next(c for c in summary["collectives"] if "source_embedding" in c["name"] and c["part"] == "values")
    assert entry["bytes_out_per_rank"] == 2 * rows * TINY.d_model * 4
    indices = next(c for c in summary["collectives"] if "source_embedding" in c["name"] and c["part"] == "indices")
    assert indices["bytes_out_per_rank"] == 2 * rows * {"int32": 4, "int64": 8}[indices["dtype"]]
    # the tied target embedding's gradient is dense (lookup + softmax matmul summed by TF)
    target = next(c for c in summary["collectives"] if "target_embedding" in c["name"])
    assert target["op"] == "allreduce" and not target["sparse"]


def test_dense_mode_allreduces_the_whole_table(dense_run):
    out, _ = dense_run
    summary = read_json(out / "summary.json")
    entry = next(c for c in summary["collectives"] if "source_embedding" in c["name"])
    assert entry["op"] == "allreduce" and entry["sparse"] and entry["densified"]
    assert entry["bytes_out_per_rank"] == TINY.vocab_size * TINY.d_model * 4
    assert all(r["allgather_bytes_per_step"] == 0 for r in summary["ranks"])
    assert summary["policy"][0]["decision"] == "dense"
    # U is recorded whatever the reduction, every step, so a report can compare it with T
    [distinct] = summary["distinct_rows"]
    assert distinct["steps"] == 3 and distinct["rows_max"] == TINY.batch_size * TINY.seq_len
    assert 0 < distinct["distinct_rows_max"] < distinct["rows_max"] and distinct["merge_s_median"] is None


def test_dedup_gathers_the_distinct_rows_of_every_rank(runs_root):
    out = runs_root / "dedup-n2"
    result = memdiag("run", "transformer", "-n", "2", "--steps", "3", "--mode", "dedup", "--out", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    rows = TINY.batch_size * TINY.seq_len
    records = {rank: read_records(out / f"rank-{rank}.jsonl") for rank in (0, 1)}
    distinct = {(r["rank"], r["step"]): r["distinct_rows"] for recs in records.values() for r in recs
                if r["type"] == "distinct_rows" and r["step"] >= 0 and "source_embedding" in r["name"]}
    assert len(distinct) == 2 * 3 and all(0 < u < rows for u in distinct.values())  # Zipf ids repeat
    for rank, recs in records.items():
        gathered = [r for r in recs if r["type"] == "collective" and r["step"] >= 0 and "source_embedding" in r["name"]]
        assert len(gathered) == 2 * 3 and all(r["op"] == "allgather" and r["merged"] for r in gathered)
        for step in range(3):
            # each rank sends its own U rows: the output holds the sum of every rank's U
            u_all = distinct[(0, step)] + distinct[(1, step)]
            mine = {r["part"]: r for r in gathered if r["step"] == step}
            index_bytes = {"int32": 4, "int64": 8}[mine["indices"]["dtype"]]
            assert mine["values"]["bytes_out"] + mine["indices"]["bytes_out"] == u_all * (TINY.d_model * 4 + index_bytes)
            assert mine["values"]["shape_in"][0] == distinct[(rank, step)]
    summary = read_json(out / "summary.json")
    assert summary["policy"][0]["decision"] == "dedup" and "merge + allgather" in result.stdout


def test_every_step_is_flushed_with_memory_and_identical_parameters(sparse_run):
    out, _ = sparse_run
    for rank in (0, 1):
        steps = [r for r in read_records(out / f"rank-{rank}.jsonl") if r["type"] == "step"]
        assert [s["step"] for s in steps] == [-1, 0, 1, 2]
        assert all(s["peak_rss_bytes"] > 0 and s["hwm_bytes"] > 0 for s in steps)
    summary = read_json(out / "summary.json")
    assert summary["consistency"]["ranks_identical"] is True and summary["consistency"]["checked_steps"] == 3


def test_terminal_report_after_the_run_and_from_the_directory(sparse_run):
    out, result = sparse_run
    assert "Per rank" in result.stdout and "source_embedding/embeddings [values]" in result.stdout
    again = memdiag("report", str(out))
    assert again.returncode == 0 and "Per rank" in again.stdout and "allgather" in again.stdout
    as_json = memdiag("report", str(out), "--format", "json")
    assert as_json.returncode == 0 and '"world_size": 2' in as_json.stdout


def test_each_rank_measures_what_memdiag_itself_added_before_step_0(sparse_run):
    out, result = sparse_run
    for rank in (0, 1):
        records = read_records(out / f"rank-{rank}.jsonl")
        [start] = [r for r in records if r["type"] == "start"]
        [end] = [r for r in records if r["type"] == "end"]
        # the native marks' ring is resident from the set-up on, and inside what the set-up grew RSS by
        assert start["marks"] == "native" and 0 < start["marks_ring_bytes"] <= start["own_setup_rss_bytes"] < 64 * 2**20
        # the workload's step, traced once: a begin mark per all-reduce of 64 KiB or more (each in a Horovod
        # cond of its own), one shared by the smaller ones, and one end mark for all of the graph's conds; a
        # begin and an end per allgather; its set-up graph's broadcasts: one begin and one end for them all
        collectives = {(r["name"], r["op"], r.get("part"), r["bytes_in"]) for r in records
                       if r["type"] == "collective" and r["step"] >= 0}
        reduced = [size for _, op, _, size in collectives if op == "allreduce"]
        large = sum(1 for size in reduced if size >= 64 * 1024)
        gathered = sum(1 for _, op, _, _ in collectives if op == "allgather")
        broadcast = {r["name"] for r in records if r["type"] == "collective" and r["op"] == "broadcast"}
        assert large and len(reduced) > large and gathered and len(broadcast) > 1
        assert len(reduced) + gathered == len(collectives)
        assert end["mark_ops"] == large + 1 + 1 + 2 * gathered + 2, (end["mark_ops"], reduced, gathered)
        assert end["begins_shared"] == len(reduced) - large
    assert "memdiag's own set-up grew RSS by" in " ".join(result.stdout.split())


def test_tensorboard_shows_each_step_s_gathered_embedding_rows_of_every_rank(sparse_run, tmp_path):
    out, _ = sparse_run
    result = memdiag("report", str(out), "--format", "tensorboard", "--output", str(tmp_path / "logs"))
    assert result.returncode == 0, result.stderr
    series = read_back(tmp_path / "logs" / out.name)
    rows = TINY.batch_size * TINY.seq_len  # a rank's source tokens: rows of its embedding gradient
    for rank in (0, 1):
        [values] = [t for t in series if t.startswith(f"gathered_MiB_by_tensor/rank-{rank}/")
                    and "source_embedding" in t and t.endswith("/values")]
        assert series[values] == pytest.approx({s: 2 * rows * TINY.d_model * 4 / 2**20 for s in range(3)})
        assert sorted(series[f"peak_rss_MiB/rank-{rank}"]) == [0, 1, 2]
        assert all(v > 100 for v in series[f"peak_rss_MiB/rank-{rank}"].values())


def test_without_a_shared_file_system_ranks_send_their_records_to_rank_0(runs_root):
    out = runs_root / "local-spool"
    result = memdiag("run", "transformer", "-n", "2", "--steps", "2", "--spool", "local", "--out", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    run_id = read_json(out / "run.json")["run_id"]
    # the ranks wrote to node-local folders, and those were emptied once delivered
    assert not glob.glob(os.path.join(tempfile.gettempdir(), f"memdiag-{run_id}-rank*"))
    for rank in (0, 1):
        steps = [r for r in read_records(out / f"rank-{rank}.jsonl") if r["type"] == "step"]
        assert len(steps) == 3
    assert read_json(out / "summary.json")["ranks"][1]["allgather_bytes_per_step"] > 0
