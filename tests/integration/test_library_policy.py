"""The policy as a library: memdiag.tensorflow.DistributedGradientTape in a plain mpirun job."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.helpers import ROOT

pytestmark = pytest.mark.mpi


def library_policy(*args: str) -> dict:
    """examples/library_policy.py on 2 ranks under plain mpirun: rank 0's last line."""
    cmd = ["mpirun", "-np", "2", "--oversubscribe", "--bind-to", "none"]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    cmd += [sys.executable, str(ROOT / "examples" / "library_policy.py"), *args]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert result.returncode == 0, result.stdout + result.stderr
    report: dict = json.loads(result.stdout.strip().splitlines()[-1])
    return report


def test_under_adasum_the_drop_in_densifies_every_table_since_horovod_cannot_gather_them():
    # Horovod 0.28.1 raises for an IndexedSlices reduced with Adasum: auto must not keep one gathered
    report = library_policy("--op", "adasum")
    decisions = report["decisions"]
    assert {name: d["decision"] for name, d in decisions.items()} == \
        {"words/embeddings:0": "dense", "items/embeddings:0": "dense", "tags/embeddings:0": "dense"}
    assert all("adasum" in d["reason"] for d in decisions.values()), decisions
    assert set(report["handed"].values()) == {"dense"}


def test_auto_densifies_the_assumed_sparse_table_keeps_the_truly_sparse_one_and_merges_the_repetitive_one():
    report = library_policy()
    decisions = report["decisions"]
    # words: 2 ranks x 64 x 32 lookups x (64 x 4 + 8) bytes > 1000 x 64 x 4 bytes of table
    assert decisions["words/embeddings:0"]["decision"] == "dense"
    # items: 2 ranks x 128 lookups x 264 bytes, far below 200,000 x 256 bytes of table
    assert decisions["items/embeddings:0"]["decision"] == "sparse"
    assert "auto:" in decisions["items/embeddings:0"]["reason"]
    # tags: 2048 Zipf(1.5) lookups of a 50,000-row table, mostly repeats: merging gathers the fewest bytes
    assert decisions["tags/embeddings:0"]["decision"] == "dedup"
    assert "distinct" in decisions["tags/embeddings:0"]["reason"]
    # the optimizer takes the densified table as a dense gradient (as under sparse_as_dense), the
    # gathered ones as IndexedSlices: the step's batch is static, so the type is settled when it is traced
    handed = report["handed"]
    assert handed["words/embeddings:0"] == "dense"
    assert handed["items/embeddings:0"] == handed["tags/embeddings:0"] == "IndexedSlices"
    # ... and inside Keras SGD's apply_gradients the gathered ones are summed dense: its update with the
    # rows was measured to hold more (memdiag.optimizer_input); the table it took dense already is not noted
    assert decisions["items/embeddings:0"]["dense_update_by"] == decisions["tags/embeddings:0"]["dense_update_by"] \
        == "SGD"
    assert "before SGD's update" in decisions["items/embeddings:0"]["reason"]
    assert decisions["words/embeddings:0"]["dense_update_by"] is None
