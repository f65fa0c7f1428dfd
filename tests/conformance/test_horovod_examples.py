"""The conformance tier: Horovod v0.28.1's own TensorFlow and Keras examples, unchanged (SOURCES.md), on 2
ranks under plain mpirun and under ``memdiag run``, through tests/conformance/launch.py (local data, a
step count from CONFORMANCE_STEPS, the TF1 names those scripts import).

Every script, as written: the same exit status as plain mpirun, no bookkeeping warning, and every
collective of a gradient named after its variable. word2vec, the one with IndexedSlices gradients (the
embeddings, the NCE weights and biases), runs again under every mode: the mode the report names is the
mode the records show.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conformance.checks import as_written
from tests.helpers import ROOT, read_json

pytestmark = [pytest.mark.mpi, pytest.mark.slow]

HERE = Path(__file__).resolve().parent
LAUNCH = HERE / "launch.py"
TABLE = json.loads((HERE / "scripts.json").read_text())["scripts"]
WORD2VEC = "tests/conformance/horovod_v0.28.1/tensorflow_word2vec.py"
WORD2VEC_TABLES = ["Variable:0", "Variable_1:0", "Variable_2:0"]  # embeddings, nce_weights, nce_biases


def _id(entry: dict) -> str:
    return Path(entry["path"]).stem


def _env(entry: dict, workdir: Path) -> dict[str, str]:
    return {**os.environ, **entry["env"], "CONFORMANCE_WORKDIR": str(workdir),
            "CONFORMANCE_DATA_DIR": str(workdir.parent.parent / "data")}


def plain(entry: dict, workdir: Path) -> subprocess.CompletedProcess:
    cmd = ["mpirun", "-np", "2", "--oversubscribe"]  # as a user runs it: mpirun's own binding, as memdiag's
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    return subprocess.run([*cmd, sys.executable, str(LAUNCH), str(ROOT / entry["path"]), *entry["args"]],
                          capture_output=True, text=True, timeout=600, env=_env(entry, workdir), cwd=ROOT,
                          stdin=subprocess.DEVNULL)


def under_memdiag(entry: dict, workdir: Path, out: Path, mode: str | None = None) -> subprocess.CompletedProcess:
    env = _env(entry, workdir)
    args = ["run", str(LAUNCH), "-n", "2", "--out", str(out), *(["--mode", mode] if mode else []),
            "--", str(ROOT / entry["path"]), *entry["args"]]
    return subprocess.run([sys.executable, "-m", "memdiag", *args], capture_output=True, text=True, timeout=600,
                          env={**env, "COLUMNS": "160"}, cwd=ROOT, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("entry", TABLE, ids=_id)
def test_each_example_as_written_exits_as_under_plain_mpirun_with_every_gradient_named(entry, tmp_path):
    expected = plain(entry, tmp_path / "runs" / "plain")
    done = under_memdiag(entry, tmp_path / "runs" / "memdiag", tmp_path / "run")
    as_written(expected, done, tmp_path / "run", WORD2VEC_TABLES if entry["path"] == WORD2VEC else [])


@pytest.mark.parametrize("mode", ["sparse", "dense", "dedup", "auto"])
def test_word2vec_under_every_mode_is_reduced_as_the_report_names_it(mode, tmp_path):
    [entry] = [e for e in TABLE if e["path"] == WORD2VEC]
    done = under_memdiag(entry, tmp_path / "runs" / "memdiag", tmp_path / "run", mode)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    summary = read_json(tmp_path / "run" / "summary.json")
    assert summary["warnings"] == [], summary["warnings"]
    applied = summary["mode_applied"]
    assert applied["applied"] == WORD2VEC_TABLES and applied["not_applied"] == [] and applied["unlabelled"] == []
    gathered = {c["name"] for c in summary["collectives"] if c["sparse"] and c["op"] == "allgather"}
    densified = {c["name"] for c in summary["collectives"] if c["densified"]}
    if mode == "dense":
        assert gathered == set() and densified == set(WORD2VEC_TABLES)
    elif mode in ("sparse", "dedup"):
        assert gathered == set(WORD2VEC_TABLES) and densified == set()
    if mode == "sparse":  # the script draws a batch size per rank and step: the rows' range is reported
        [embeddings] = [p for p in summary["policy"] if p["name"] == "Variable:0"]
        least, _, most = embeddings["own_rows_range"]
        assert 64 <= least < most <= 128


def test_the_vendored_scripts_are_byte_for_byte_those_sources_md_names():
    import hashlib
    import re

    folder = HERE / "horovod_v0.28.1"
    listed = dict(re.findall(r"^\| (\S+) \| \S+ \| ([0-9a-f]{64}) \|$", (folder / "SOURCES.md").read_text(), re.M))
    assert len(listed) == 13  # the twelve scripts and Horovod's LICENSE
    for name, digest in listed.items():
        assert hashlib.sha256((folder / name).read_bytes()).hexdigest() == digest, name
