"""Real mpirun, real MultiWorkerMirroredStrategy: memdiag.tensorflow.densify_gradients called by the
script itself (examples/user_mwms_library_policy.py), under `memdiag run --engine tf-distribute` as
written, so that memdiag's hooks record what the strategy really reduced, and under plain mpirun.

Expected figures, worked out here by hand from the script's sizes, never by memdiag's code: worker r
looks up 1000 + 500 r rows of a 5000 x 256 float32 table (row 256 x 4 = 1024 B) with int32 ids (4 B),
1028 B a row gathered. MWMS pads every worker's rows to the longest worker's, so each receives
N x max x 1028; densified, the table is all-reduced whole, 5000 x 1024 = 5,120,000 B:

    N=2: rows 1000, 1500: 2 x 1500 x 1028 = 3,084,000 B <= 5,120,000 B: auto keeps the gather
         (records per worker and step: values [1500,256] -> [3000,256] = 3,072,000 B out, indices
         [1500] -> [3000] = 12,000 B out, the row counts 2 x 4 = 8 B; the head's pack 257 x 4 = 1,028 B)
    N=4: rows 1000 ... 2500: 4 x 2500 x 1028 = 10,280,000 B > 5,120,000 B: auto densifies
         (records: no gather; one pack of table and head, (1,280,000 + 257) x 4 = 5,121,028 B)

on every worker. Final parameters of auto at N=4 against mode sparse at N=4 (the strategy's gather):
the same sums in another order, within ROUNDING (two float32 steps at the table's largest entry, 0.05,
per training step: 2 x 3 x 3.7e-9 = 2.2e-8, as tests/integration/test_tf_distribute.py).
"""

from __future__ import annotations

import json
import os
import re
import subprocess

import numpy as np
import pytest

from tests.helpers import PYTHON, ROOT, keras_variable_name, memdiag, read_records

pytestmark = [pytest.mark.mpi, pytest.mark.tfdist]

SCRIPT = ROOT / "examples" / "user_mwms_library_policy.py"
STEPS = 3
ROWS = {2: [1000, 1500], 4: [1000, 1500, 2000, 2500]}
ROUNDING = 2 * STEPS * float(np.spacing(np.float32(0.05)))  # 2.2e-8
LOSS_LINE = re.compile(r"^step (\d+) loss (\S+)$", re.M)
DECISION_LINE = re.compile(r"^decision (\{.*\})$", re.M)


def _run(runs_root, name, n, mode):
    out = runs_root / name
    result = memdiag("run", str(SCRIPT), "-n", str(n), "--engine", "tf-distribute", "--out", str(out),
                     "--timeout", "240", "--", "--steps", str(STEPS), "--mode", mode)
    log = out / "mpirun.log"
    assert result.returncode == 0, result.stdout + result.stderr + (log.read_text() if log.exists() else "")
    return out


@pytest.fixture(scope="module")
def auto_n2(runs_root):
    return _run(runs_root, "lib-auto-n2", 2, "auto")


@pytest.fixture(scope="module")
def auto_n4(runs_root):
    return _run(runs_root, "lib-auto-n4", 4, "auto")


@pytest.fixture(scope="module")
def sparse_n4(runs_root):
    return _run(runs_root, "lib-sparse-n4", 4, "sparse")


def _steps(out, rank):
    return [r for r in read_records(out / f"rank-{rank}.jsonl") if r["type"] == "collective" and r["step"] >= 0]


def _printed_decision(out):
    [line] = DECISION_LINE.findall((out / "mpirun.log").read_text())
    return json.loads(line)


def test_auto_keeps_the_padded_gather_at_two_workers_on_every_worker(auto_n2):
    table = keras_variable_name(auto_n2, "table", "embeddings")
    decision = _printed_decision(auto_n2)
    assert decision["name"] == table and decision["decision"] == "sparse"
    assert decision["rows_per_worker"] == [1000, 1500] and "<= dense all-reduce" in decision["reason"]
    for rank in range(2):
        records = _steps(auto_n2, rank)
        assert {r["step"] for r in records} == set(range(STEPS))
        for step in range(STEPS):
            mine = [r for r in records if r["step"] == step]
            gathers = {r["stage"]: r for r in mine if r["op"] == "allgather"}
            assert gathers["values"]["shape_in"] == [1500, 256] and gathers["values"]["bytes_out"] == 3_072_000
            assert gathers["indices"]["bytes_out"] == 12_000 and gathers["lengths"]["bytes_out"] == 8
            assert all(g["name"] == table and g["padded"] for g in (gathers["values"], gathers["indices"]))
            [pack] = [r for r in mine if r.get("stage") == "pack"]
            assert table not in pack["pack_members"] and pack["bytes_out"] == 1_028


def test_auto_densifies_the_table_at_four_workers_on_every_worker(auto_n4):
    table = keras_variable_name(auto_n4, "table", "embeddings")
    decision = _printed_decision(auto_n4)
    assert decision["name"] == table and decision["decision"] == "dense"
    assert decision["rows_per_worker"] == ROWS[4] and "> dense all-reduce" in decision["reason"]
    for rank in range(4):
        records = _steps(auto_n4, rank)
        assert not [r for r in records if r["op"] == "allgather"]
        packs = [r for r in records if r.get("stage") == "pack"]
        assert [r["step"] for r in packs] == list(range(STEPS))
        assert all(table in p["pack_members"] and p["bytes_out"] == 5_121_028 for p in packs)


def test_auto_ends_with_the_parameters_of_the_gather_within_rounding(sparse_n4, auto_n4):
    sparse, auto = np.load(sparse_n4 / "params.npz"), np.load(auto_n4 / "params.npz")
    initial = np.load(sparse_n4 / "params_initial.npz")
    assert sorted(sparse.files) == sorted(auto.files) and len(sparse.files) == 3
    for key in sparse.files:
        assert np.max(np.abs(sparse[key] - auto[key])) <= ROUNDING, key
        assert np.max(np.abs(sparse[key] - initial[key])) > 100 * ROUNDING, key  # training moved it
    # mode sparse is the strategy's own padded gather: 4 x 2500 x 1028 = 10,280,000 B per worker and step
    for rank in range(4):
        gathered = [r["bytes_out"] for r in _steps(sparse_n4, rank) if r.get("stage") in ("values", "indices")]
        assert sum(gathered) == STEPS * 10_280_000


def test_the_script_decides_and_trains_alike_under_plain_mpirun(auto_n2):
    from memdiag.ports import free_ports

    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "TF_PORTS": ",".join(map(str, free_ports(2)))}
    env.pop("TF_CONFIG", None)
    cmd = ["mpirun", "-np", "2", "--oversubscribe", "--bind-to", "none", "-x", "TF_PORTS", "-x",
           "TF_CPP_MIN_LOG_LEVEL"] + (["-x", "PYTHONPATH"] if "PYTHONPATH" in env else [])
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    plain = subprocess.run([*cmd, PYTHON, str(SCRIPT), "--steps", str(STEPS), "--mode", "auto"], capture_output=True,
                           text=True, timeout=240, env=env, stdin=subprocess.DEVNULL, cwd=ROOT)
    assert plain.returncode == 0, plain.stdout + plain.stderr
    [line] = DECISION_LINE.findall(plain.stdout)
    assert json.loads(line) == _printed_decision(auto_n2)
    losses = LOSS_LINE.findall(plain.stdout)
    assert len(losses) == STEPS and losses == LOSS_LINE.findall((auto_n2 / "mpirun.log").read_text())
