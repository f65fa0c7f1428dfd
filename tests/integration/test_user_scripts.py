"""Users' own scripts, unchanged: eager DistributedGradientTape and Keras DistributedOptimizer."""

from __future__ import annotations

import pytest

from tests.helpers import ROOT, memdiag, read_json

pytestmark = pytest.mark.mpi


def test_keras_fit_script_gets_the_auto_policy(runs_root):
    out = runs_root / "user-keras"
    result = memdiag("run", str(ROOT / "examples" / "user_keras_fit.py"), "-n", "2", "--mode", "auto",
                     "--out", str(out), "--", "--batches", "3", "--vocab", "300")
    assert result.returncode == 0, result.stdout + result.stderr
    summary = read_json(out / "summary.json")
    [policy] = summary["policy"]
    # 2 ranks x 512 rows x (32 x 4 + 4 for Keras' int32 ids) bytes gathered > 300 x 32 x 4 dense
    assert policy["decision"] == "dense" and policy["gathered_bytes"] == 2 * 512 * 132
    entry = next(c for c in summary["collectives"] if c["name"] == policy["name"] and c["op"] == "allreduce")
    assert entry["densified"] and entry["bytes_out_per_rank"] == 300 * 32 * 4
    assert not [c for c in summary["collectives"] if c["op"] == "allgather"]


def test_a_failing_script_is_reported_with_its_error(runs_root, tmp_path):
    script = tmp_path / "broken.py"
    script.write_text("import horovod.tensorflow as hvd\nhvd.init()\nraise ValueError('bad batch shape')\n")
    out = runs_root / "user-broken"
    result = memdiag("run", str(script), "-n", "2", "--out", str(out))
    assert result.returncode == 1
    summary = read_json(out / "summary.json")
    assert summary["status"] == "failed"
    assert all(r["status"] == "error" and "bad batch shape" in r["error"] for r in summary["ranks"])
    assert "bad batch shape" in result.stdout
