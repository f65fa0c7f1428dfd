"""Helpers of the tests: running the real CLI as a user would, reading what it wrote."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The Python that runs memdiag and the scripts under test: pytest's own, or another environment's
# (`make test-tf-latest` runs the tf-distribute tests with .venv-tf-latest's, where Horovod is absent).
PYTHON = os.environ.get("MEMDIAG_TEST_PYTHON") or sys.executable


def memdiag(*args: str, timeout: float = 600, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run ``memdiag ARGS`` in a subprocess, as a user types it."""
    env = {**os.environ, "COLUMNS": "160"}
    return subprocess.run([PYTHON, "-m", "memdiag", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd or ROOT, env=env, stdin=subprocess.DEVNULL)


def read_json(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def read_records(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def keras_variable_name(run_dir: Path, layer: str, variable: str) -> str:
    """A layer's variable named as the run's Keras names it (from rank 0's start record): Keras 2 gives
    ``embeddings:0``, Keras 3 prefixes the layer's path, ``table/embeddings:0``."""
    [start] = [r for r in read_records(Path(run_dir) / "rank-0.jsonl") if r["type"] == "start"]
    keras = start["versions"].get("keras") or ""
    return f"{layer}/{variable}:0" if keras.startswith("3.") else f"{variable}:0"


def undeclared_record_fields(run_dir: Path) -> dict[str, list[str]]:
    """Per record type, the fields the ranks wrote (every ``rank-K.jsonl`` under ``run_dir``) that
    memdiag.schema does not declare for that type: what readers would meet undeclared."""
    from memdiag.schema import undeclared_fields

    found: dict[str, set[str]] = {}
    for path in sorted(Path(run_dir).rglob("rank-*.jsonl")):
        for record in read_records(path):
            fields = undeclared_fields(record)
            if fields:
                found.setdefault(str(record.get("type")), set()).update(fields)
    return {kind: sorted(fields) for kind, fields in found.items()}
