"""Real mpirun, real MultiWorkerMirroredStrategy at 2 and 4 workers: the policy records' MWMS figures
and `--mode auto` (examples/user_mwms_embedding.py, uneven rows).

Expected figures are worked out here by hand from the script's sizes, never by memdiag's code: worker r
looks up 1000 + 500 r rows of a 5000 x 256 float32 table (row 1024 B) with int32 ids (4 B), 1028 B a
row gathered. MWMS pads every worker's rows to the longest's, so each worker receives N x max x 1028:

    N=2: rows 1000, 1500: 2 x 1500 x 1028 = 3,084,000 B, padding (3000 - 2500) x 1028 = 514,000 B
    N=4: rows 1000 ... 2500: 4 x 2500 x 1028 = 10,280,000 B, padding (10000 - 7000) x 1028 = 3,084,000 B

The table densified is 5000 x 1024 = 5,120,000 B (5,121,028 B with the head's 257 float32 in its pack),
the same at any N: auto keeps the gather at N=2 (3,084,000 <= 5,120,000) and densifies at N=4
(10,280,000 > 5,120,000), on every worker.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers import ROOT, keras_variable_name, memdiag, read_json, read_records

pytestmark = [pytest.mark.mpi, pytest.mark.tfdist]

SCRIPT = ROOT / "examples" / "user_mwms_embedding.py"
STEPS = 3
ROW = 256 * 4 + 4  # values row + index
TABLE = 5000 * 256 * 4  # 5,120,000
PACK_DENSIFIED = (5000 * 256 + 256 + 1) * 4  # 5,121,028
ROWS = {2: [1000, 1500], 4: [1000, 1500, 2000, 2500]}
GATHERED = {2: 2 * 1500 * ROW, 4: 4 * 2500 * ROW}
# Two float32 steps at the table's largest entry (0.05, Keras' uniform initialiser) per training step:
# what reducing the same numbers in another order may change (Keras 3's SGD measured 4 after 3 steps).
ROUNDING = 2 * STEPS * float(np.spacing(np.float32(0.05)))  # 2.2e-8
PADDING = {2: (2 * 1500 - 2500) * ROW, 4: (4 * 2500 - 7000) * ROW}


def _run(runs_root, name, n, *extra, script_args=()):
    out = runs_root / name
    result = memdiag("run", str(SCRIPT), "-n", str(n), "--engine", "tf-distribute", *extra, "--out", str(out),
                     "--timeout", "240", "--", "--steps", str(STEPS), *script_args)
    log = out / "mpirun.log"
    assert result.returncode == 0, result.stdout + result.stderr + (log.read_text() if log.exists() else "")
    return out, result.stdout


@pytest.fixture(scope="module")
def auto_n2(runs_root):
    return _run(runs_root, "tfd-auto-n2", 2, "--mode", "auto")


@pytest.fixture(scope="module")
def as_written_n4(runs_root):
    return _run(runs_root, "tfd-as-written-n4", 4)


@pytest.fixture(scope="module")
def auto_n4(runs_root):
    return _run(runs_root, "tfd-auto-n4", 4, "--mode", "auto")


def _policies(out, n):
    found = []
    for rank in range(n):
        [policy] = [r for r in read_records(out / f"rank-{rank}.jsonl") if r["type"] == "policy"]
        found.append(policy)
    return found


def _steps(out, rank):
    return [r for r in read_records(out / f"rank-{rank}.jsonl") if r["type"] == "collective" and r["step"] >= 0]


def _check_policy(out, policy, rank, n, mode, decision):
    assert policy["name"] == keras_variable_name(out, "table", "embeddings")
    assert policy["engine"] == "tf-distribute" and policy["mode"] == mode
    assert policy["decision"] == decision and policy["world_size"] == n
    assert policy["local_rows"] == 1000 + 500 * rank
    assert policy["rows_per_worker"] == ROWS[n] and policy["agreed_rows"] == max(ROWS[n])
    assert policy["gathered_bytes"] == GATHERED[n] and policy["padding_bytes"] == PADDING[n]
    assert policy["dense_bytes"] == TABLE


def test_auto_at_2_workers_keeps_the_gather_on_every_worker(auto_n2):
    out, stdout = auto_n2
    for rank, policy in enumerate(_policies(out, 2)):
        _check_policy(out, policy, rank, 2, "auto", "sparse")
        assert policy["gathered_bytes"] == 3_084_000 and policy["padding_bytes"] == 514_000
        assert "padded gather" in policy["reason"] and "<=" in policy["reason"]
        for step in range(STEPS):
            gathers = [r for r in _steps(out, rank) if r["step"] == step and r["op"] == "allgather"]
            assert sum(r["bytes_out"] for r in gathers if r["part"] != "lengths") == 3_084_000
    assert "Padded gathers" in stdout and "engine tf-distribute" in stdout


def test_as_written_at_4_workers_gathers_4_times_the_longest_rows(as_written_n4):
    out, stdout = as_written_n4
    for rank, policy in enumerate(_policies(out, 4)):
        _check_policy(out, policy, rank, 4, "as-written", "sparse")
        records = _steps(out, rank)
        for step in range(STEPS):
            parts = {r["part"]: r for r in records if r["step"] == step and r["op"] == "allgather"}
            assert parts["values"]["bytes_out"] + parts["indices"]["bytes_out"] == 4 * 2500 * (1024 + 4) == 10_280_000
            assert parts["values"]["pad_out_bytes"] + parts["indices"]["pad_out_bytes"] == 3_084_000
    summary = read_json(out / "summary.json")
    [padding] = summary["padding"]
    assert padding["padding_bytes_per_step"] == 3_084_000 and padding["gathered_bytes_per_step"] == 10_280_000
    assert summary["engine"] == "tf-distribute" and "Padded gathers" in stdout


def test_auto_at_4_workers_densifies_on_every_worker(auto_n4):
    out, _ = auto_n4
    for rank, policy in enumerate(_policies(out, 4)):
        _check_policy(out, policy, rank, 4, "auto", "dense")
        assert "> dense all-reduce" in policy["reason"]
        records = _steps(out, rank)
        assert not [r for r in records if r["op"] == "allgather"]
        for step in range(STEPS):
            [pack] = [r for r in records if r["step"] == step and r["op"] == "allreduce" and r["gradient"]]
            assert pack["densified"] and pack["bytes_out"] == PACK_DENSIFIED == 5_121_028
    summary = read_json(out / "summary.json")
    assert summary["changes_to_job"] and summary["padding"] == []


def _params(out):
    return np.load(out / "params.npz")


def test_auto_ends_with_the_parameters_of_the_gather_within_rounding(as_written_n4, auto_n4):
    # The same sums in another order: equal to float32 rounding (ROUNDING); three steps move the table by
    # about 6e-5.
    tolerance = ROUNDING
    sparse, auto = _params(as_written_n4[0]), _params(auto_n4[0])
    initial = np.load(as_written_n4[0] / "params_initial.npz")
    assert sorted(sparse.files) == sorted(auto.files) and len(sparse.files) == 3
    for key in sparse.files:
        assert np.max(np.abs(sparse[key] - auto[key])) <= tolerance, key
        assert np.max(np.abs(sparse[key] - initial[key])) > 100 * tolerance, key


def test_auto_decides_when_the_step_runs_if_the_rows_are_unknown_when_traced(runs_root, as_written_n4):
    out, _ = _run(runs_root, "tfd-auto-n4-unknown", 4, "--mode", "auto", script_args=["--unknown-rows"])
    for rank, policy in enumerate(_policies(out, 4)):
        _check_policy(out, policy, rank, 4, "auto", "dense")
        assert "rows measured when the first step ran" in policy["reason"]
        records = _steps(out, rank)
        assert not [r for r in records if r["op"] == "allgather"]  # only the taken branch runs
        for step in range(STEPS):
            name = keras_variable_name(out, "table", "embeddings")
            table = [r for r in records if r["step"] == step and r["name"] == name]
            assert [(r["op"], r["densified"], r["bytes_out"]) for r in table] == [("allreduce", True, TABLE)]
    sparse, auto = _params(as_written_n4[0]), _params(out)
    for key in sparse.files:
        assert np.max(np.abs(sparse[key] - auto[key])) <= ROUNDING, key


KERAS3_PYTHON = ROOT / ".venv-tf-latest" / "bin" / "python"


@pytest.mark.skipif(not KERAS3_PYTHON.exists(), reason="no .venv-tf-latest (make setup-tf-latest)")
def test_under_keras_3_the_tensors_carry_their_variables_names_and_parameters_are_saved(runs_root):
    import os
    import subprocess

    out = runs_root / "tfd-keras3-auto-n2"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "160"}
    result = subprocess.run([str(KERAS3_PYTHON), "-m", "memdiag", "run", str(SCRIPT), "-n", "2", "--engine",
                             "tf-distribute", "--mode", "auto", "--out", str(out), "--timeout", "240", "--",
                             "--steps", str(STEPS)], capture_output=True, text=True, timeout=300, env=env, cwd=ROOT,
                            stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stdout + result.stderr
    [start] = [r for r in read_records(out / "rank-0.jsonl") if r["type"] == "start"]
    assert start["versions"]["keras"].startswith("3.")
    for policy in _policies(out, 2):
        assert policy["name"].endswith("embeddings:0") and policy["decision"] == "sparse"
        assert policy["rows_per_worker"] == ROWS[2] and policy["gathered_bytes"] == 3_084_000
    names = {r["name"] for r in _steps(out, 0)}
    assert not [n for n in names if n.startswith("gradient_")], names  # no positional names
    saved = np.load(out / "params.npz")
    assert len(saved.files) == 3 and any(k.endswith("embeddings:0") for k in saved.files)
    assert (out / "params_initial.npz").exists()
