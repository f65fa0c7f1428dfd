"""What both conformance tiers check of a script run as written, under plain mpirun and under memdiag."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.helpers import read_json, read_records


def gradient_names(out: Path) -> set[str]:
    """The names of the gradient collectives both ranks of the run in ``out`` recorded."""
    names = set()
    for rank in (0, 1):
        for record in read_records(out / f"rank-{rank}.jsonl"):
            if record.get("type") == "collective" and record.get("gradient"):
                names.add(record["name"])
    return names


def as_written(expected: subprocess.CompletedProcess, done: subprocess.CompletedProcess, out: Path,
               tables: list[str]) -> None:
    """``done`` (memdiag run as written, its run in ``out``) exits 0 as plain mpirun did (``expected``),
    changed nothing and warned of nothing; every gradient's collective is named after its variable, never a
    call site; the IndexedSlices ones are exactly ``tables``."""
    assert done.returncode == expected.returncode == 0, (expected.stderr[-3000:], done.stdout[-2000:],
                                                          done.stderr[-3000:])
    summary = read_json(out / "summary.json")
    assert summary["warnings"] == [], summary["warnings"]
    assert "measured as written: memdiag changed nothing in the job" in " ".join(done.stdout.split())
    names = gradient_names(out)
    assert names and not [n for n in names if "@" in n], names
    sparse = sorted({c["name"] for c in summary["collectives"] if c["sparse"]})
    assert sparse == tables, sparse
