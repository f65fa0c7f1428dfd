"""Helpers of the tests: running the real CLI as a user would, reading what it wrote."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def memdiag(*args: str, timeout: float = 600, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run ``memdiag ARGS`` in a subprocess, as a user types it."""
    env = {**os.environ, "COLUMNS": "160"}
    return subprocess.run([sys.executable, "-m", "memdiag", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd or ROOT, env=env, stdin=subprocess.DEVNULL)


def read_json(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def read_records(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
