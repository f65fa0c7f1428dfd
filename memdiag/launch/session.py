"""One ``memdiag run``: validate, create the run directory, launch, collect, summarise."""

from __future__ import annotations

import datetime as _dt
import json
import os
import shutil
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Callable

from memdiag import __version__
from memdiag._errors import UserError
from memdiag.agent.main import encode_config
from memdiag.collect import HOROVOD_TIMELINE, RUN_MANIFEST, SUMMARY, load_run
from memdiag.launch import mpirun
from memdiag.policy import AS_WRITTEN, MODES
from memdiag.workloads import check as check_workload


@dataclass
class RunRequest:
    target: str  # a built-in workload name or a path to a training script
    world_size: int
    mode: str | None = None  # None: as-written for a script, sparse (what its code does) for a workload
    steps: int = 5
    preset: str = "tiny"
    out: str | None = None
    force: bool = False
    hosts: str | None = None
    timeout_s: float | None = None
    margin: float = 1.0
    seed: int = 1234
    script_args: list[str] = field(default_factory=list)
    overrides: dict[str, str] = field(default_factory=dict)
    spool: str = "shared"
    check_params: bool = True
    sample_interval_s: float = 0.005
    fault: str | None = None  # injected on purpose by tests of the verification
    check_reduction: bool = False  # reduce each IndexedSlices both ways and compare (verification runs)
    mem_limit_bytes: int | None = None  # per rank: a rank passing it is killed, like a batch system does
    memray: bool = False  # a memray tracker (native stacks) in every rank
    horovod_timeline: bool = False  # Horovod's own timeline, written by rank 0
    threads_per_rank: int | None = None  # set TF's thread pools (a script's own are kept otherwise)

    def __post_init__(self) -> None:
        if self.mode is None:
            self.mode = AS_WRITTEN if self.is_script else "sparse"

    @property
    def is_script(self) -> bool:
        return self.target.endswith(".py") or os.sep in self.target

    @property
    def label(self) -> str:
        return os.path.splitext(os.path.basename(self.target))[0] if self.is_script else self.target


def run_request_from(options: Any, **per_run: Any) -> RunRequest:
    """One run of a study (compare, scale): every launch option the study's request shares with
    RunRequest, by name, then the fields that differ per run."""
    shared = {f.name: getattr(options, f.name) for f in fields(RunRequest) if hasattr(options, f.name)}
    return RunRequest(**{**shared, "force": False, **per_run})


def validate(request: RunRequest) -> None:
    if request.world_size < 1:
        raise UserError(f"-n {request.world_size}: the number of ranks must be at least 1")
    if request.mode not in MODES:
        raise UserError(f"--mode {request.mode!r}: choose one of {', '.join(MODES)}")
    if request.steps < 1:
        raise UserError(f"--steps {request.steps}: run at least 1 step")
    if request.margin <= 0:
        raise UserError(f"--margin {request.margin}: the margin must be a positive factor, e.g. 1.0")
    if request.hosts:
        mpirun.parse_hosts(request.hosts)
    if request.is_script:
        if not os.path.isfile(request.target):
            raise UserError(f"script {request.target} not found; give the path of a Python training script")
    else:
        check_workload(request.target, request.preset)
        from memdiag.workloads.configs import PRESETS, with_overrides

        with_overrides(PRESETS[request.target][request.preset], request.overrides)
    mpirun.find_mpirun()


def default_out(request: RunRequest) -> str:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    base = os.path.join("runs", f"{request.label}-{request.mode}-n{request.world_size}-{stamp}")
    path, k = base, 1
    while os.path.exists(path):
        k += 1
        path = f"{base}-{k}"
    return path


def prepare_run_dir(path: str, force: bool) -> None:
    """Create the run directory; never overwrite an existing one unless asked to."""
    if os.path.exists(path):
        if not os.path.isdir(path):
            raise UserError(f"--out {path} exists and is not a directory; choose another path")
        if os.listdir(path):
            if not force:
                raise UserError(f"--out {path} already exists; choose another path or add --force to replace it")
            shutil.rmtree(path)
    try:
        os.makedirs(path, exist_ok=True)
        probe = os.path.join(path, ".write-test")
        with open(probe, "w") as f:
            f.write("")
        os.remove(probe)
    except OSError as exc:
        raise UserError(f"cannot write to --out {path} ({exc.strerror}); choose a writable directory") from None


def write_manifest(path: str, manifest: dict[str, Any]) -> None:
    tmp = os.path.join(path, RUN_MANIFEST + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=2, default=str)
    os.replace(tmp, os.path.join(path, RUN_MANIFEST))


def write_summary(path: str, summary: dict[str, Any]) -> None:
    tmp = os.path.join(path, SUMMARY + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2, default=str)
    os.replace(tmp, os.path.join(path, SUMMARY))


def changes_to_job(request: RunRequest) -> list[str]:
    """What this run changes in the job it measures, in words (empty: measured as written)."""
    changes = []
    if request.is_script and request.mode != AS_WRITTEN:
        changes.append(f"--mode {request.mode}: IndexedSlices gradients reduced as mode {request.mode} says, "
                       "whatever the script's sparse_as_dense")
    if request.threads_per_rank:
        changes.append(f"--threads-per-rank {request.threads_per_rank}: TensorFlow's intra-op pool set to "
                       f"{request.threads_per_rank} thread(s), inter-op to 1")
    elif not request.is_script:
        changes.append("built-in workload: TensorFlow's intra-op pool sized to the cores per rank, inter-op 1")
    if request.memray:
        changes.append("--memray: every allocation tracked; oneDNN's pooled allocator off (TF_ENABLE_ONEDNN_OPTS=0) "
                       "unless the environment sets it")
    if request.spool == "local":
        changes.append("--spool local: MPI initialised by memdiag before the job (mpi4py, MPI_THREAD_MULTIPLE as "
                       "Horovod asks), to stream every rank's records to rank 0")
    return changes


class StepWatcher:
    """Counts the steps rank 0 has finished by reading its record file as it grows."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.steps = 0
        self._offset = 0
        self._partial = b""

    def poll(self) -> int:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return self.steps
        self._offset += len(data)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        self.steps += sum(1 for line in lines if line.startswith(b'{"type":"step"') and b'"step":-1' not in line)
        return self.steps


def execute(request: RunRequest, on_steps: Callable[[int], None] | None = None) -> str:
    """Run ``request`` to completion and return its run directory (summary.json written).

    ``on_steps`` is told how many training steps rank 0 has finished, while the run goes on.
    """
    validate(request)
    out = request.out or default_out(request)
    prepare_run_dir(out, request.force)
    run_id = uuid.uuid4().hex[:12]
    config = {
        "run_id": run_id,
        "run_dir": os.path.abspath(out),
        "workload": None if request.is_script else request.target,
        "script": os.path.abspath(request.target) if request.is_script else None,
        "script_args": request.script_args,
        "preset": request.preset,
        "overrides": request.overrides,
        "mode": request.mode,
        "steps": request.steps,
        "margin": request.margin,
        "seed": request.seed,
        "spool": request.spool,
        "check_params": request.check_params,
        "sample_interval_s": request.sample_interval_s,
        "fault": request.fault,
        "check_reduction": request.check_reduction,
        "memray": request.memray,
        "mem_limit_bytes": request.mem_limit_bytes,
        "threads_per_rank": request.threads_per_rank,
    }
    cores = os.cpu_count() or 1
    manifest: dict[str, Any] = {
        "memdiag_version": __version__,
        "run_id": run_id,
        "argv": sys.argv,
        "request": asdict(request),
        "workload": request.label,
        "script": config["script"],
        "preset": None if request.is_script else request.preset,
        "mode": request.mode,
        "world_size": request.world_size,
        "steps": request.steps,
        "hosts": request.hosts,
        "cores_per_host": cores,
        # Where mpirun puts each rank (slots of --hosts filled in order); the ranks' own start
        # records say where they ran.
        "placement": mpirun.placement(request.world_size, request.hosts),
        "oversubscribed": mpirun.ranks_per_host(request.world_size, request.hosts) > cores,
        "created": time.time(),
        "status": "running",
        "changes_to_job": changes_to_job(request),
    }
    write_manifest(out, manifest)
    extra_env: dict[str, str] = {}
    if request.timeout_s:
        # Horovod's stall inspector then names the missing ranks well before the job is ended.
        stall = max(2, min(60, int(request.timeout_s / 4)))
        extra_env.setdefault("HOROVOD_STALL_CHECK_TIME_SECONDS", os.environ.get("HOROVOD_STALL_CHECK_TIME_SECONDS", str(stall)))
    if request.memray:
        # oneDNN's pooled allocator hands out regions that memray cannot split into tensors.
        extra_env["TF_ENABLE_ONEDNN_OPTS"] = os.environ.get("TF_ENABLE_ONEDNN_OPTS", "0")
    if request.horovod_timeline:
        extra_env["HOROVOD_TIMELINE"] = os.path.join(os.path.abspath(out), HOROVOD_TIMELINE)
    launch = mpirun.Launch(request.world_size, [encode_config(config)], hosts=request.hosts,
                           timeout_s=request.timeout_s, extra_env=extra_env)
    watcher = StepWatcher(os.path.join(out, "rank-0.jsonl"))
    # With --spool local rank 0 streams its records into the run directory too (about once a second).
    poll = None if on_steps is None else (lambda: on_steps(watcher.poll()))
    result = mpirun.run(launch, os.path.join(out, "mpirun.log"), poll)
    run = load_run(out)
    versions = next((r.start.get("versions") for r in run.ranks.values() if r.start), None)
    statuses = {rank: (records.end or {}).get("status", "died") for rank, records in run.ranks.items()}
    ok = result.returncode == 0 and not result.timed_out and len(statuses) == request.world_size \
        and all(s == "ok" for s in statuses.values())
    manifest.update({
        "command": result.command,
        "returncode": result.returncode,
        "timed_out": result.timed_out,
        "wall_s": result.wall_s,
        "finished": time.time(),
        "versions": versions,
        "rank_status": {str(r): statuses.get(r, "missing") for r in range(request.world_size)},
        "status": "ok" if ok else ("timeout" if result.timed_out else "failed"),
    })
    write_manifest(out, manifest)
    problems = {(records.end or {}).get("error") for records in run.ranks.values()
                if (records.end or {}).get("status") == "environment"}
    if problems:
        # Nothing was measured: leave nothing that looks like a run behind.
        shutil.rmtree(out, ignore_errors=True)
        raise UserError(sorted(p for p in problems if p)[0])
    from memdiag.analyze.summary import summarize

    run = load_run(out)
    write_summary(out, summarize(run))
    return out
