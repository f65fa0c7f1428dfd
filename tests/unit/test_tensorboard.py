"""`memdiag report DIR --format tensorboard`: the event files read back with TensorBoard's own reader
hold, per rank and per step, what the run's records say: peak RSS, step time, the bytes gathered and
reduced, and each tensor's gathered bytes; a comparison writes one TensorBoard run per run directory
under the same series names; nothing already written is written over."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memdiag.format import rundir
from tests.helpers import memdiag, read_records
from tests.unit.fake_run import make_run

pytest.importorskip("tensorboard")
from tests.tensorboard_reader import read_back  # noqa: E402

MIB = 2**20
ROWS, WIDTH, VOCAB = 256, 32, 512  # make_run's embedding: rows a rank looks up, row width, table rows


def step_records(run_dir: Path, rank: int) -> dict[int, dict]:
    return {r["step"]: r for r in read_records(run_dir / f"rank-{rank}.jsonl")
            if r["type"] == "step" and r["step"] >= 0}


def test_a_sparse_run_holds_each_rank_s_steps_with_the_bytes_the_allgathers_received(tmp_path):
    # GIVEN a run of 3 ranks, 3 steps: each rank gathers 3 x 256 rows of 32 float32 and their int32
    # indices, and allreduces one 32 x 32 float32 kernel
    run = make_run(tmp_path / "sparse-run", world_size=3, steps=3, rows=ROWS, width=WIDTH)
    # WHEN it is written for TensorBoard (default log directory) and read back
    result = memdiag("report", str(run), "--format", "tensorboard")
    assert result.returncode == 0, result.stderr
    logdir = run / "tensorboard"
    assert f"tensorboard --logdir {logdir}" in result.stdout
    assert [p.name for p in logdir.iterdir()] == ["sparse-run"]
    series = read_back(logdir / "sparse-run")
    # THEN every rank has every step's figures, named the same way
    values, indices = 3 * ROWS * WIDTH * 4, 3 * ROWS * 4
    expected_tags = set()
    for rank in range(3):
        who = f"rank-{rank}"
        expected_tags |= {f"peak_rss_MiB/{who}", f"rss_at_step_end_MiB/{who}", f"step_time_s/{who}",
                          f"gathered_MiB/{who}", f"reduced_MiB/{who}",
                          f"gathered_MiB_by_tensor/{who}/m/emb:0/values", f"gathered_MiB_by_tensor/{who}/m/emb:0/indices"}
        records = step_records(run, rank)
        assert series[f"gathered_MiB/{who}"] == pytest.approx({s: (values + indices) / MIB for s in range(3)})
        assert series[f"gathered_MiB_by_tensor/{who}/m/emb:0/values"] == pytest.approx({s: values / MIB for s in range(3)})
        assert series[f"gathered_MiB_by_tensor/{who}/m/emb:0/indices"] == pytest.approx({s: indices / MIB for s in range(3)})
        assert series[f"reduced_MiB/{who}"] == pytest.approx({s: WIDTH * WIDTH * 4 / MIB for s in range(3)})
        assert series[f"peak_rss_MiB/{who}"] == pytest.approx(
            {s: r["peak_rss_bytes"] / MIB for s, r in records.items()}, rel=1e-6)
        assert series[f"step_time_s/{who}"] == pytest.approx({s: r["step_time_s"] for s, r in records.items()}, rel=1e-6)
    assert set(series) == expected_tags


def test_a_dense_run_reduces_the_whole_table_and_gathers_nothing(tmp_path):
    run = make_run(tmp_path / "dense-run", world_size=2, steps=2, rows=ROWS, width=WIDTH, vocab=VOCAB, mode="dense")
    out = tmp_path / "logs"
    assert memdiag("report", str(run), "--format", "tensorboard", "--out", str(out)).returncode == 0
    series = read_back(out / "dense-run")
    for rank in range(2):
        assert series[f"gathered_MiB/rank-{rank}"] == {0: 0.0, 1: 0.0}
        assert series[f"reduced_MiB/rank-{rank}"] == pytest.approx({s: (VOCAB + WIDTH) * WIDTH * 4 / MIB for s in range(2)})
        assert not [t for t in series if t.startswith("gathered_MiB_by_tensor/")]


def test_a_rank_killed_after_its_first_step_has_only_the_steps_it_finished(tmp_path):
    run = make_run(tmp_path / "killed", world_size=2, steps=4, kill_rank_after=0)
    series = read_back(_written(run, tmp_path / "logs") / "killed")
    assert sorted(series["peak_rss_MiB/rank-0"]) == [0, 1, 2, 3]
    assert sorted(series["peak_rss_MiB/rank-1"]) == sorted(step_records(run, 1)) == [0]


def _written(run: Path, logdir: Path) -> Path:
    result = memdiag("report", str(run), "--format", "tensorboard", "--output", str(logdir))
    assert result.returncode == 0, result.stderr
    return logdir


def test_a_comparison_writes_one_tensorboard_run_per_measured_run_with_the_same_series(tmp_path):
    # GIVEN a comparison directory: sparse and dense at N=2, and a verification run
    study = tmp_path / "cmp"
    for name, mode in (("n2-sparse", "sparse"), ("n2-dense", "dense"), ("verify-n2", "dense")):
        make_run(study / name, world_size=2, steps=2, mode=mode)
    (study / rundir.COMPARE_FILE).write_text(json.dumps({"format": rundir.COMPARE_FORMAT, "rows": []}))
    # WHEN it is written for TensorBoard
    result = memdiag("report", str(study), "--format", "tensorboard")
    assert result.returncode == 0, result.stderr
    # THEN the measured runs are TensorBoard runs (the verification run is not), and the sparse and dense
    # series of a rank share their names, so TensorBoard draws them in one chart
    logdir = study / "tensorboard"
    assert sorted(p.name for p in logdir.iterdir()) == ["n2-dense", "n2-sparse"]
    sparse, dense = read_back(logdir / "n2-sparse"), read_back(logdir / "n2-dense")
    shared = {"peak_rss_MiB/rank-1", "gathered_MiB/rank-1", "reduced_MiB/rank-1", "step_time_s/rank-1"}
    assert shared <= set(sparse) & set(dense)
    assert sparse["gathered_MiB/rank-1"][1] > 0 == dense["gathered_MiB/rank-1"][1]


def test_a_log_directory_already_written_is_refused_and_left_as_it_was(tmp_path):
    run = make_run(tmp_path / "run", world_size=2, steps=2)
    logdir = _written(run, tmp_path / "logs")
    before = {p: p.read_bytes() for p in logdir.rglob("*") if p.is_file()}
    again = memdiag("report", str(run), "--format", "tensorboard", "--output", str(logdir))
    assert again.returncode == 2
    assert again.stderr.strip().count("\n") == 0 and "already holds TensorBoard event files" in again.stderr
    assert "Traceback" not in again.stderr
    assert {p: p.read_bytes() for p in logdir.rglob("*") if p.is_file()} == before


@pytest.mark.parametrize("fmt", ["text", "json", "markdown"])
def test_output_given_to_a_format_that_prints_is_a_one_line_error(tmp_path, fmt):
    run = make_run(tmp_path / "run", world_size=2, steps=1)
    result = memdiag("report", str(run), "--format", fmt, "--output", str(tmp_path / "x"))
    assert result.returncode == 2 and "drop --output" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "x").exists()
