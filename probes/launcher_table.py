"""The launcher table of docs/notes/launchers.md: for run directories made by different launchers, whether each
recorded the same collectives and gathered bytes as a reference `memdiag run` of the same target, whether
`memdiag report` reads it, and how it ended.

    python probes/launcher_table.py REFERENCE_DIR DIR [DIR ...]

Collectives are compared record by record on every rank (op, tensor, part, dtype, shapes, bytes, sparse,
densified, step), as the launcher tests do (tests/launchers.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

FIELDS = ("step", "op", "name", "part", "dtype", "shape_in", "shape_out", "bytes_in", "bytes_out", "sparse", "densified")


def signature(run_dir: str, rank: int) -> list[tuple[str, ...]]:
    from memdiag.format.reader import read_rank_file

    records = read_rank_file(os.path.join(run_dir, f"rank-{rank}.jsonl"), rank)
    return [tuple(str(c.get(f)) for f in FIELDS) for c in records.collectives]


def row(reference: str, run_dir: str) -> dict[str, object]:
    with open(os.path.join(run_dir, "run.json"), encoding="utf-8") as f:
        manifest = json.load(f)
    with open(os.path.join(run_dir, "summary.json"), encoding="utf-8") as f:
        summary = json.load(f)
    with open(os.path.join(reference, "summary.json"), encoding="utf-8") as f:
        ref_summary = json.load(f)
    ranks = int(manifest["world_size"])
    counts = [len(signature(run_dir, r)) for r in range(ranks)]
    same = all(signature(run_dir, r) == signature(reference, r) for r in range(ranks))
    gathered = [r["allgather_bytes_per_step"] for r in summary["ranks"]]
    ref_gathered = [r["allgather_bytes_per_step"] for r in ref_summary["ranks"]]
    report = subprocess.run([sys.executable, "-m", "memdiag", "report", run_dir], capture_output=True, text=True)
    codes = manifest.get("rank_exit_codes") or {"launcher": manifest.get("returncode")}
    return {"dir": os.path.basename(run_dir.rstrip("/")), "launcher": manifest.get("launcher", "mpirun"),
            "target": manifest.get("workload"), "collectives per rank": counts, "same as memdiag run": same,
            "gathered B/step": gathered, "equal": gathered == ref_gathered,
            "report": "ok" if report.returncode == 0 else f"exit {report.returncode}",
            "status": manifest.get("status"), "exit": codes}


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    reference, dirs = argv[0], argv[1:]
    for d in dirs:
        print(json.dumps(row(reference, d)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
