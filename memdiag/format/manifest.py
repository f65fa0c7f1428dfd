"""``run.json``, the run's manifest: its typed fields, written and read here alone.

The launcher writes it as the run starts (what was asked, ``status: running``) and completes it when the
run ends (status, each rank's status, where the ranks ran); a foreign launcher's run adds what it knows
of that launcher. Every reader (the summary, the reports, a scaling study, ``memdiag collect``) reads it
with :func:`read_manifest`. docs/reference/run-directory.md lists the fields for users.
"""

from __future__ import annotations

import os
from typing import Any, TypedDict, cast

from memdiag._errors import UserError
from memdiag.format.rundir import RUN_MANIFEST, read_json, write_json


class RunManifest(TypedDict, total=False):
    # written as the run starts (memdiag.launch.session.run_manifest)
    memdiag_version: str
    run_id: str
    argv: list[str]
    request: dict[str, Any]  # the RunRequest as asked, field by field
    launcher: str  # mpirun, srun, or the name of a foreign launcher
    workload: str
    script: str | None
    preset: str | None
    mode: str | None
    engine: str
    world_size: int
    steps: int | None
    hosts: str | None
    cores_per_host: int
    placement: list[str] | None  # each rank's host, in rank order (None: not known before the run)
    oversubscribed: bool | None
    created: float
    launcher_pid: int
    launcher_host: str
    status: str
    changes_to_job: list[str]
    memory_environment: dict[str, Any]
    tf_ports: list[int] | None
    tf_ports_by: str
    # a foreign launcher's run (memdiag.launch.foreign)
    launcher_env: dict[str, Any]
    launcher_command: list[list[str]]  # rank 0's parent and its parents, each as its command line
    allocation: dict[str, Any] | None
    agent_command: list[str]
    user_command: list[str]
    python: str
    memray_ranks: list[int] | None
    trace_ranks: list[int] | None
    spool: str | None
    # completed when the run ends (memdiag.launch.session.conclude)
    command: list[str] | None
    returncode: int | None
    timed_out: bool
    wall_s: float | None
    finished: float
    versions: dict[str, Any] | None
    rank_status: dict[str, str]
    rank_stopped_at_step: dict[str, int | None]
    rank_exit_codes: dict[str, int | None]
    terminated_by: str


def manifest_path(run_dir: str) -> str:
    return os.path.join(run_dir, RUN_MANIFEST)


def read_manifest(run_dir: str) -> RunManifest:
    """``run_dir``'s manifest; a one-line UserError where there is none or it is not a JSON object."""
    path = manifest_path(run_dir)
    if not os.path.exists(path):
        raise UserError(f"{run_dir} is not a memdiag run (no {RUN_MANIFEST}); give a directory written by `memdiag run`")
    value = read_json(path)
    if not isinstance(value, dict):
        raise UserError(f"{path} is not a JSON object; the run directory is damaged")
    return cast(RunManifest, value)


def write_manifest(run_dir: str, manifest: RunManifest) -> None:
    """Write ``run_dir``'s manifest atomically (a reader sees the old one or the new one)."""
    write_json(manifest_path(run_dir), manifest)
