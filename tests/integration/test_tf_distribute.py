"""Real mpirun, real MultiWorkerMirroredStrategy, 2 workers: `memdiag run --engine tf-distribute` on a
user's script with uneven embedding lookups (examples/user_mwms_embedding.py).

Expected figures are worked out here by hand from the script's sizes, never by memdiag's code:
worker r looks up 1000 + 500 r rows of a 5000 x 256 float32 table (row 1024 B) with int32 ids
(4 B), so at N = 2 the rows are 1000 and 1500, max 1500, sum 2500. MWMS pads both gathers to the
longest worker's rows: every worker receives N x max rows of values and of indices.
"""

from __future__ import annotations

import os
import re
import subprocess

import numpy as np
import pytest

from tests.helpers import PYTHON, ROOT, keras_variable_name, memdiag, read_json, read_records, undeclared_record_fields

pytestmark = [pytest.mark.mpi, pytest.mark.tfdist]

SCRIPT = ROOT / "examples" / "user_mwms_embedding.py"
STEPS = 3
ARGS = ["--steps", str(STEPS)]
N = 2
ROWS = {0: 1000, 1: 1500}
ROW_BYTES = 256 * 4
INDEX_BYTES = 4
VALUES_OUT = 2 * 1500 * 1024  # N x max x row bytes = 3,072,000
INDICES_OUT = 2 * 1500 * 4  # N x max x index bytes = 12,000
VALUES_PAD_IN = {0: 500 * 1024, 1: 0}  # (max - own rows) x row bytes
INDICES_PAD_IN = {0: 500 * 4, 1: 0}
VALUES_PAD_OUT = (2 * 1500 - 2500) * 1024  # (N x max - sum) x row bytes = 512,000 on every worker
INDICES_PAD_OUT = (2 * 1500 - 2500) * 4
DENSE_TABLE_AND_HEAD = (5000 * 256 + 256 + 1) * 4  # the densified table packed with the head: 5,121,028
# Two float32 steps at the table's largest entry (0.05) per training step: what reducing the same
# numbers in another order may change in the parameters.
ROUNDING = 2 * STEPS * float(np.spacing(np.float32(0.05)))  # 2.2e-8
OUTPUT_LINE = re.compile(r"^(step \d+ loss \S+|final \S+)$", re.M)
LOSS_LINE = re.compile(r"^step (\d+) loss (\S+)$", re.M)


def _run(runs_root, name, *extra):
    out = runs_root / name
    result = memdiag("run", str(SCRIPT), "-n", str(N), "--engine", "tf-distribute", *extra, "--out", str(out),
                     "--timeout", "240", "--", *ARGS)
    assert result.returncode == 0, result.stdout + result.stderr + _log(out)
    return out


def _log(out) -> str:
    path = out / "mpirun.log"
    return path.read_text() if path.exists() else ""


@pytest.fixture(scope="module")
def as_written(runs_root):
    return _run(runs_root, "tfd-as-written")


@pytest.fixture(scope="module")
def dense(runs_root):
    return _run(runs_root, "tfd-dense", "--mode", "dense")


def _collectives(out, rank):
    return [r for r in read_records(out / f"rank-{rank}.jsonl") if r["type"] == "collective"]


def test_the_run_records_the_engine_and_no_horovod(as_written):
    manifest = read_json(as_written / "run.json")
    assert manifest["status"] == "ok" and manifest["engine"] == "tf-distribute"
    assert len(manifest["tf_ports"]) == N
    for rank in range(N):
        [start] = [r for r in read_records(as_written / f"rank-{rank}.jsonl") if r["type"] == "start"]
        assert start["engine"] == "tf-distribute" and start["size"] == N
        assert "horovod" not in start["versions"] and start["versions"]["tensorflow"]
        assert start["tf_config"]["source"] == "memdiag"
        assert f'"index": {rank}' in start["tf_config"]["value"]
    assert undeclared_record_fields(as_written) == {}  # the engine's own fields are declared too


def test_each_step_gathers_n_times_the_longest_workers_rows_with_the_padding(as_written):
    table = keras_variable_name(as_written, "table", "embeddings")
    for rank in range(N):
        records = [r for r in _collectives(as_written, rank) if r["step"] >= 0]
        assert sorted({r["step"] for r in records}) == list(range(STEPS))
        for step in range(STEPS):
            gathers = [r for r in records if r["step"] == step and r["op"] == "allgather"]
            parts = {r["part"]: r for r in gathers}
            assert len(gathers) == 3 and set(parts) == {"lengths", "values", "indices"}, gathers
            lengths, values, indices = parts["lengths"], parts["values"], parts["indices"]
            assert lengths["bytes_in"] == 4 and lengths["bytes_out"] == N * 4
            assert values["name"] == indices["name"] == lengths["name"] == table
            assert all(r["sparse"] and not r["densified"] and r["gradient"] and r["engine"] == "tf-distribute"
                       for r in gathers)
            assert values["padded"] and indices["padded"]
            assert values["shape_in"] == [1500, 256] and values["shape_out"] == [3000, 256]
            assert values["bytes_out"] == VALUES_OUT == 3_072_000
            assert indices["bytes_out"] == INDICES_OUT == 12_000
            assert values["bytes_in"] == 1500 * ROW_BYTES and indices["bytes_in"] == 1500 * INDEX_BYTES
            assert values["rows"] == ROWS[rank] and values["rows_total"] == 2500
            assert values["pad_in_bytes"] == VALUES_PAD_IN[rank]
            assert indices["pad_in_bytes"] == INDICES_PAD_IN[rank]
            assert values["pad_out_bytes"] == VALUES_PAD_OUT == 512_000
            assert indices["pad_out_bytes"] == INDICES_PAD_OUT == 2_000
            # the head's kernel and bias in one pack (257 float32), and the loss
            reduces = [r for r in records if r["step"] == step and r["op"] == "allreduce"]
            [pack] = [r for r in reduces if r["gradient"]]
            assert pack["bytes_out"] == 257 * 4 and pack["stage"] == "pack" and len(pack["pack_members"]) == 2
            assert [r["bytes_out"] for r in reduces if not r["gradient"]] == [4]
    summary = read_json(as_written / "summary.json")
    for rank in summary["ranks"]:
        assert rank["allgather_bytes_per_step"] == N * 4 + VALUES_OUT + INDICES_OUT  # 3,084,008
        assert rank["allreduce_bytes_per_step"] == 257 * 4 + 4


def test_mode_dense_densifies_the_table_and_gathers_nothing(dense):
    table = keras_variable_name(dense, "table", "embeddings")
    for rank in range(N):
        records = [r for r in _collectives(dense, rank) if r["step"] >= 0]
        assert not [r for r in records if r["op"] == "allgather"]
        for step in range(STEPS):
            [pack] = [r for r in records if r["step"] == step and r["op"] == "allreduce" and r["gradient"]]
            assert pack["densified"] and table in pack["pack_members"]
            assert pack["bytes_out"] == DENSE_TABLE_AND_HEAD == 5_121_028
    summary = read_json(dense / "summary.json")
    [policy] = summary["policy"]
    assert policy["name"] == table and policy["decision"] == "dense" and policy["overridden"]
    assert summary["changes_to_job"]


def test_sparse_and_dense_runs_end_with_the_same_parameters(as_written, dense):
    # The same sums in another order: equal to float32 rounding. The table's entries are at most 0.05
    # (Keras' uniform initialiser), where a float32 step is 3.7e-9; each step's update may round
    # differently by about two of them (Keras 3's SGD measured 4 after three steps, Keras 2's up to 3).
    # Three steps move every variable by far more (the table by about 6e-5).
    tolerance = ROUNDING
    sparse_params, dense_params = np.load(as_written / "params.npz"), np.load(dense / "params.npz")
    initial = np.load(as_written / "params_initial.npz")
    assert sorted(sparse_params.files) == sorted(dense_params.files) and len(sparse_params.files) == 3
    for key in sparse_params.files:
        difference = np.max(np.abs(sparse_params[key] - dense_params[key]))
        assert difference <= tolerance, (key, difference)
        assert np.max(np.abs(sparse_params[key] - initial[key])) > 100 * tolerance, key  # training moved it
    sparse_losses = [float(v) for _, v in LOSS_LINE.findall(_log(as_written))]
    dense_losses = [float(v) for _, v in LOSS_LINE.findall(_log(dense))]
    assert len(sparse_losses) == STEPS and np.allclose(sparse_losses, dense_losses, rtol=1e-5, atol=1e-6)


def test_the_script_prints_the_same_under_plain_mpirun(as_written):
    from memdiag.ports import free_ports

    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "TF_PORTS": ",".join(map(str, free_ports(N)))}
    env.pop("TF_CONFIG", None)
    cmd = ["mpirun", "-np", str(N), "--oversubscribe", "-x", "TF_PORTS", "-x",
           "TF_CPP_MIN_LOG_LEVEL"] + (["-x", "PYTHONPATH"] if "PYTHONPATH" in env else [])
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    plain = subprocess.run([*cmd, PYTHON, str(SCRIPT), *ARGS], capture_output=True, text=True, timeout=240,
                           env=env, stdin=subprocess.DEVNULL)
    assert plain.returncode == 0, plain.stdout + plain.stderr
    printed = OUTPUT_LINE.findall(plain.stdout)
    assert len(printed) == STEPS + 1
    assert LOSS_LINE.findall(_log(as_written)) == LOSS_LINE.findall(plain.stdout)


def test_a_worker_that_fails_ends_the_job_with_its_error_not_a_hang(runs_root, tmp_path):
    # Worker 0 waits for worker 1 in the initial broadcast of the variable; worker 1 has raised.
    script = tmp_path / "broken_mwms.py"
    script.write_text("import tensorflow as tf\n"
                      "strategy = tf.distribute.MultiWorkerMirroredStrategy()\n"
                      "if strategy.cluster_resolver.task_id == 1:\n"
                      "    raise ValueError('bad batch shape')\n"
                      "with strategy.scope():\n"
                      "    v = tf.Variable(1.0)\n")
    out = runs_root / "tfd-broken"
    result = memdiag("run", str(script), "-n", "2", "--engine", "tf-distribute", "--timeout", "100", "--out", str(out))
    assert result.returncode == 1
    manifest = read_json(out / "run.json")
    assert manifest["status"] == "failed" and not manifest["timed_out"] and manifest["wall_s"] < 60
    summary = read_json(out / "summary.json")
    [failed] = [r for r in summary["ranks"] if r["rank"] == 1]
    assert failed["status"] == "error" and "bad batch shape" in failed["error"]
