"""Read a run directory back into one result: the manifest and every rank's records.

A rank killed mid-write leaves a truncated last line; a damaged disk can leave garbage. What can be
read is kept, and what cannot is counted and reported as a warning, never an exception.
"""

from __future__ import annotations

import glob
import json
import os
import re
from dataclasses import dataclass, field
from typing import Any

from memdiag._errors import UserError

RUN_MANIFEST = "run.json"
SUMMARY = "summary.json"
HOROVOD_TIMELINE = "horovod-timeline.json"
MPIRUN_LOG = "mpirun.log"
_RANK_FILE = re.compile(r"rank-(\d+)\.jsonl$")


@dataclass
class RankRecords:
    rank: int
    start: dict[str, Any] | None = None
    end: dict[str, Any] | None = None
    killed: dict[str, Any] | None = None
    steps: list[dict[str, Any]] = field(default_factory=list)
    collectives: list[dict[str, Any]] = field(default_factory=list)
    policies: list[dict[str, Any]] = field(default_factory=list)
    memory: list[dict[str, Any]] = field(default_factory=list)
    reduction_checks: list[dict[str, Any]] = field(default_factory=list)
    waiting: list[dict[str, Any]] = field(default_factory=list)
    other: list[dict[str, Any]] = field(default_factory=list)
    bad_lines: int = 0


@dataclass
class Run:
    path: str
    manifest: dict[str, Any]
    ranks: dict[int, RankRecords]
    warnings: list[str] = field(default_factory=list)
    log: str = ""


def parse_records(lines: list[bytes] | list[str], rank: int) -> RankRecords:
    """Sort each readable record into its kind; count lines that are not records."""
    result = RankRecords(rank)
    buckets = {"step": result.steps, "collective": result.collectives, "policy": result.policies,
               "mem": result.memory, "reduction_check": result.reduction_checks,
               "waiting": result.waiting}
    for raw in lines:
        if isinstance(raw, bytes):
            try:
                raw = raw.decode("utf-8")
            except UnicodeDecodeError:
                result.bad_lines += 1
                continue
        raw = raw.strip()
        if not raw:
            continue
        try:
            record = json.loads(raw)
        except ValueError:
            result.bad_lines += 1
            continue
        if not isinstance(record, dict) or not isinstance(record.get("type"), str):
            result.bad_lines += 1
            continue
        kind = record["type"]
        if kind == "start":
            result.start = record
        elif kind == "end":
            result.end = record
        elif kind == "killed":
            result.killed = record
        else:
            buckets.get(kind, result.other).append(record)
    return result


def read_rank_file(path: str, rank: int) -> RankRecords:
    with open(path, "rb") as f:
        return parse_records(f.read().split(b"\n"), rank)


def load_run(path: str) -> Run:
    if not os.path.isdir(path):
        raise UserError(f"{path} is not a directory; give the run directory that `memdiag run` wrote")
    manifest_path = os.path.join(path, RUN_MANIFEST)
    if not os.path.exists(manifest_path):
        raise UserError(f"{path} is not a memdiag run (no {RUN_MANIFEST}); give a directory written by `memdiag run`")
    try:
        with open(manifest_path, encoding="utf-8") as f:
            manifest = json.load(f)
    except (ValueError, UnicodeDecodeError):
        raise UserError(f"{manifest_path} is not valid JSON; the run directory is damaged") from None
    run = Run(path, manifest, {})
    for file in sorted(glob.glob(os.path.join(path, "rank-*.jsonl"))):
        match = _RANK_FILE.search(file)
        if not match:
            continue
        rank = int(match.group(1))
        records = read_rank_file(file, rank)
        run.ranks[rank] = records
        if records.bad_lines:
            run.warnings.append(f"rank {rank}: {records.bad_lines} unreadable line(s) in {os.path.basename(file)} skipped")
    log = os.path.join(path, MPIRUN_LOG)
    if os.path.exists(log):
        with open(log, encoding="utf-8", errors="replace") as f:
            run.log = f.read()
    expected = manifest.get("world_size")
    if isinstance(expected, int):
        missing = [r for r in range(expected) if r not in run.ranks]
        if missing:
            run.warnings.append(f"no records from rank(s) {', '.join(map(str, missing))}")
    return run
