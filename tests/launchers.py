"""Helpers of the launcher tests (tests/integration/test_launchers.py, tests/slurm/): how a user starts
`memdiag agent`, and what two run directories must share to have recorded the same collectives."""

from __future__ import annotations

from pathlib import Path

from tests.helpers import PYTHON, ROOT, read_records

# A script that leaves a file behind the moment it starts: bad input must stop memdiag before it.
MARKER_SCRIPT = ROOT / "tests" / "marker_script.py"

# What makes two collective records the same collective, whoever launched the ranks (times aside).
SIGNATURE_FIELDS = ("step", "op", "name", "part", "dtype", "shape_in", "shape_out", "bytes_in", "bytes_out", "sparse",
                    "densified")


def memdiag_agent_argv(*args: str) -> list[str]:
    """``memdiag agent ARGS`` as a launcher starts it on every rank."""
    return [PYTHON, "-m", "memdiag", "agent", *args]


def collective_signature(run_dir: Path, rank: int) -> list[tuple]:
    """Rank ``rank``'s collective records by :data:`SIGNATURE_FIELDS` (via the reader, which expands
    compact records), sorted: step by step, the same collectives. Within a step of a graph they complete
    in no fixed order, as under plain Horovod (memdiag.graphcalls)."""
    from memdiag.format.reader import read_rank_file

    records = read_rank_file(str(Path(run_dir) / f"rank-{rank}.jsonl"), rank)
    return sorted(tuple(str(c.get(f)) for f in SIGNATURE_FIELDS) for c in records.collectives)


def end_records(run_dir: Path, rank: int) -> list[dict]:
    return [r for r in read_records(Path(run_dir) / f"rank-{rank}.jsonl") if r["type"] == "end"]
