"""One ``memdiag run``: validate, create the run directory, launch, collect, summarise."""

from __future__ import annotations

import os
import shutil
import socket
import sys
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field

from memdiag import __version__, agreement, ports
from memdiag._errors import UserError
from memdiag.agent import replay
from memdiag.agentconfig import ENGINES, HOROVOD, TF_DISTRIBUTE, TF_DISTRIBUTE_MODES, TF_DISTRIBUTE_WORKLOADS, AgentConfig
from memdiag.format import rundir
from memdiag.format.manifest import RunManifest, write_manifest
from memdiag.format.reader import RankRecords, Run, line_kind, load_run, parse_line
from memdiag.format.records import SETUP_STEP
from memdiag.launch import mpirun
from memdiag.launch.options import LaunchOptions
from memdiag.policy import AS_WRITTEN, MODES
from memdiag.workloads import WORKLOADS
from memdiag.workloads import check as check_workload


@dataclass(frozen=True)
class RunRequest:
    target: str  # a built-in workload name or a path to a training script
    world_size: int
    mode: str | None = None  # None: as-written for a script, sparse (what its code does) for a workload
    options: LaunchOptions = field(default_factory=LaunchOptions)
    out: str | None = None
    force: bool = False
    # What only a single run sets (a study's verification run, the tests):
    check_params: bool = True  # digest the parameters after every step
    fault: str | None = None  # injected on purpose by tests of the verification
    check_reduction: bool = False  # reduce each IndexedSlices both ways and compare (verification runs)
    engine: str = HOROVOD  # what reduces the gradients: Horovod, or tf.distribute's MultiWorkerMirroredStrategy
    # Open MPI's allreduce forced to its linear algorithm, which sums the ranks' buffers in rank order
    # (a comparison's second look at a parameter check that failed: verify-order-nN-MODE)
    rank_order_allreduce: bool = False
    # a comparison's runs: fingerprint each IndexedSlices gradient the first time it is reduced
    fingerprint_gradients: bool = False

    def __post_init__(self) -> None:
        if self.mode is None:
            object.__setattr__(self, "mode", AS_WRITTEN if self.is_script else "sparse")

    @property
    def is_script(self) -> bool:
        return is_script(self.target)

    @property
    def label(self) -> str:
        return label(self.target)


def is_script(target: str) -> bool:
    return target.endswith(".py") or os.sep in target


def label(target: str) -> str:
    """A workload's name, or a script's file name without .py."""
    return os.path.splitext(os.path.basename(target))[0] if is_script(target) else target


def validate(request: RunRequest, launcher_needed: bool = True) -> None:
    """Bad input, in one line (UserError). ``launcher_needed``: memdiag starts the ranks itself (not
    ``memdiag agent``, where the user's launcher did)."""
    if request.world_size < 1:
        raise UserError(f"-n {request.world_size}: the number of ranks must be at least 1")
    if request.mode not in MODES:
        raise UserError(f"--mode {request.mode!r}: choose one of {', '.join(MODES)}")
    if request.engine not in ENGINES:
        raise UserError(f"--engine {request.engine!r}: choose one of {', '.join(ENGINES)}")
    options = request.options
    if request.engine == TF_DISTRIBUTE:
        _validate_tf_distribute(request)
    options.validate()
    if request.is_script:
        if not os.path.isfile(request.target):
            raise UserError(f"script {request.target} not found; give the path of a Python training script")
    else:
        check_workload(request.target, options.preset)
        from memdiag.workloads.configs import PRESETS, with_overrides

        with_overrides(PRESETS[request.target][options.preset], dict(options.overrides))
    if launcher_needed:
        mpirun.find_launcher(options.launcher)


def _validate_tf_distribute(request: RunRequest) -> None:
    """What --engine tf-distribute supports for now: a script or the transformer and mixed workloads, on
    one host or --hosts, as written, sparse, dense or auto. An unknown workload's name is check_workload's error."""
    if not request.is_script and request.target in WORKLOADS and request.target not in TF_DISTRIBUTE_WORKLOADS:
        raise UserError(f"--engine {TF_DISTRIBUTE} runs a training script or the workloads "
                        f"{', '.join(TF_DISTRIBUTE_WORKLOADS)} for now, not {request.target}; use --engine "
                        f"{HOROVOD} for it")
    if request.mode not in TF_DISTRIBUTE_MODES:
        raise UserError(f"--engine {TF_DISTRIBUTE} supports --mode {', '.join(TF_DISTRIBUTE_MODES)} for now, "
                        f"not {request.mode}")
    if request.options.horovod_timeline:
        raise UserError(f"--horovod-timeline records Horovod's own timeline: it needs --engine {HOROVOD}")


# Open MPI's tuned allreduce, algorithm 1 ("basic linear"): every rank's buffer reduced at rank 0 in rank
# order, then broadcast. The allgather path sums the gathered rows in the same rank order.
RANK_ORDER_MCA = ("--mca", "coll_tuned_use_dynamic_rules", "1", "--mca", "coll_tuned_allreduce_algorithm", "1")


def default_out(request: RunRequest) -> str:
    return rundir.new_dir_name(f"{request.label}-{request.mode}-n{request.world_size}")


# Settings in the user's environment that change how the ranks' memory is allocated, and so what RSS
# shows. memdiag never sets them for the job (but for --memray's TF_ENABLE_ONEDNN_OPTS, a change it
# states): it records them in run.json and the reports name them (report/terminal.py says what each governs).
MEMORY_ENVIRONMENT = ("TF_ENABLE_ONEDNN_OPTS", "TF_CPU_ALLOCATOR_USE_BFC", "MALLOC_ARENA_MAX",
                      "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "LD_PRELOAD")


def memory_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The memory settings the user's environment passes to the ranks, name -> value."""
    environ = os.environ if environ is None else environ
    return {name: environ[name] for name in MEMORY_ENVIRONMENT if name in environ}


def changes_to_job(request: RunRequest) -> list[str]:
    """What this run changes in the job it measures, in words (empty: measured as written)."""
    changes = []
    options = request.options
    if request.engine == TF_DISTRIBUTE:
        # MWMS has no option to densify: sparse is what it does, dense is memdiag's change.
        if request.mode == "dense":
            changes.append("--mode dense: every IndexedSlices gradient densified (tf.convert_to_tensor) before "
                           "MultiWorkerMirroredStrategy reduces it")
        elif request.mode == "auto":
            changes.append("--mode auto: an IndexedSlices gradient densified (tf.convert_to_tensor) where "
                           "MultiWorkerMirroredStrategy's padded gather would receive more than its dense all-reduce, "
                           "decided once per tensor from every worker's rows")
    elif request.is_script and request.mode != AS_WRITTEN:
        changes.append(f"--mode {request.mode}: IndexedSlices gradients reduced as mode {request.mode} says, "
                       "whatever the script's sparse_as_dense")
    if options.threads_per_rank:
        changes.append(f"--threads-per-rank {options.threads_per_rank}: TensorFlow's intra-op pool set to "
                       f"{options.threads_per_rank} thread(s), inter-op to 1")
    elif not request.is_script:
        changes.append("built-in workload: TensorFlow's intra-op pool sized to the cores per rank, inter-op 1")
    if options.memray:
        changes.append("--memray: every allocation tracked; oneDNN's pooled allocator off (TF_ENABLE_ONEDNN_OPTS=0) "
                       "unless the environment sets it")
    if request.rank_order_allreduce:
        changes.append("verification run: Open MPI's allreduce set to its linear algorithm (mpirun "
                       f"{' '.join(RANK_ORDER_MCA)}), which sums the ranks' gradients in rank order")
    if options.spool == "local":
        changes.append("--spool local: MPI initialised by memdiag before the job (mpi4py, MPI_THREAD_MULTIPLE as "
                       "Horovod asks), to stream every rank's records to rank 0")
    return changes


def agent_config(request: RunRequest, run_id: str, run_dir: str) -> AgentConfig:
    options = request.options
    return AgentConfig(
        run_id=run_id,
        run_dir=os.path.abspath(run_dir),
        workload=None if request.is_script else request.target,
        script=os.path.abspath(request.target) if request.is_script else None,
        script_args=options.script_args,
        preset=options.preset,
        overrides=dict(options.overrides),
        mode=str(request.mode),
        steps=options.steps,
        margin=options.margin,
        seed=options.seed,
        spool=options.spool,
        check_params=request.check_params,
        sample_interval_s=options.sample_interval_s,
        fault=request.fault,
        check_reduction=request.check_reduction,
        memray=options.memray,
        mem_limit_bytes=options.mem_limit_bytes,
        threads_per_rank=options.threads_per_rank,
        max_warmup=options.max_warmup,
        engine=request.engine,
        agree_until=agreement.run_deadline(options.timeout_s),
        record_every_s=options.record_every_s or 0.0,
        fingerprint_gradients=request.fingerprint_gradients,
    )


@dataclass
class RankProgress:
    """What a rank's records say while it runs."""

    steps: int = 0  # training steps finished
    rss_bytes: int | None = None  # its resident memory at the end of its last finished step
    peak_bytes: int | None = None  # the largest step peak so far


class StepWatcher:
    """Follows a rank's record file as it grows: the steps finished, the memory at the last one's end
    and the largest peak so far."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.progress = RankProgress()
        self._offset = 0
        self._partial = b""

    @property
    def steps(self) -> int:
        return self.progress.steps

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
        for line in lines:
            kind = line_kind(line)  # the other kinds are skipped unparsed
            record = parse_line(line) if kind in ("step", "mem") else None
            if record is None or record.get("step") == SETUP_STEP:
                continue
            if kind == "step":
                self.progress.steps += 1
                peak = record.get("peak_rss_bytes")
                if isinstance(peak, int):
                    self.progress.peak_bytes = max(peak, self.progress.peak_bytes or 0)
            elif isinstance(rss := record.get("rss_last"), int):
                self.progress.rss_bytes = rss
        return self.steps


def progress_parts(what: str, elapsed_s: float, ranks: list[RankProgress]) -> list[str]:
    """Where a run going on is: what runs with the time since it started, then each of up to 4 ranks (of
    more: the range of steps done and the largest peak with its rank)."""
    from memdiag.units import format_bytes

    minutes, seconds = divmod(int(elapsed_s), 60)
    parts = [f"{what} · {minutes}:{seconds:02d}"]
    if len(ranks) <= 4:
        for rank, p in enumerate(ranks):
            if p.steps == 0:
                parts.append(f"rank {rank}: starting")
            else:
                parts.append(f"rank {rank}: {p.steps} steps, {format_bytes(p.rss_bytes)} "
                             f"(peak {format_bytes(p.peak_bytes)})")
    else:
        steps = [p.steps for p in ranks]
        parts.append(f"steps {min(steps)}-{max(steps)} done" if min(steps) != max(steps) else f"{steps[0]} steps done")
        peaks = [(p.peak_bytes, rank) for rank, p in enumerate(ranks) if p.peak_bytes is not None]
        if peaks:
            peak, rank = max(peaks)
            parts.append(f"largest peak {format_bytes(peak)} (rank {rank})")
    return parts


def progress_line(what: str, elapsed_s: float, ranks: list[RankProgress]) -> str:
    """:func:`progress_parts` on one line."""
    return " · ".join(progress_parts(what, elapsed_s, ranks))


def run_manifest(request: RunRequest, run_id: str, config: AgentConfig, launcher: str) -> RunManifest:
    """run.json as a run starts: what was asked, where ranks go (as far as the launcher lets it be known
    beforehand), ``status: running``. :func:`conclude` completes it."""
    options = request.options
    cores = os.cpu_count() or 1
    # mpirun places ranks as memdiag.hosts says; srun and foreign launchers as their allocation does,
    # known from the ranks' start records when the run ends (conclude).
    known = launcher == "mpirun"
    return {
        "memdiag_version": __version__,
        "run_id": run_id,
        "argv": sys.argv,
        "request": asdict(request),
        "launcher": launcher,
        "workload": request.label,
        "script": config.script,
        "preset": None if request.is_script else options.preset,
        "mode": request.mode,
        "engine": request.engine,
        "world_size": request.world_size,
        "steps": options.steps,
        "hosts": options.hosts,
        "cores_per_host": cores,
        # Where mpirun puts each rank (slots of --hosts filled in order); the ranks' own start
        # records say where they ran.
        "placement": mpirun.placement(request.world_size, options.hosts) if known else None,
        "oversubscribed": mpirun.ranks_per_host(request.world_size, options.hosts) > cores if known else None,
        "created": time.time(),
        # Who writes this run's end (memdiag collect tells a killed launcher from a running one).
        "launcher_pid": os.getpid(),
        "launcher_host": socket.gethostname(),
        "status": "running",
        "changes_to_job": changes_to_job(request),
        "memory_environment": memory_environment(),
    }


def rank_environment(request: RunRequest, out: str) -> dict[str, str]:
    """Variables every rank gets beside the user's environment."""
    options = request.options
    extra_env: dict[str, str] = {}
    if options.timeout_s:
        # Horovod's stall inspector then names the missing ranks well before the job is ended.
        stall = max(2, min(60, int(options.timeout_s / 4)))
        extra_env.setdefault("HOROVOD_STALL_CHECK_TIME_SECONDS", os.environ.get("HOROVOD_STALL_CHECK_TIME_SECONDS", str(stall)))
    if options.memray:
        # oneDNN's pooled allocator hands out regions that memray cannot split into tensors.
        extra_env["TF_ENABLE_ONEDNN_OPTS"] = os.environ.get("TF_ENABLE_ONEDNN_OPTS", "0")
    if options.horovod_timeline:
        extra_env["HOROVOD_TIMELINE"] = os.path.join(os.path.abspath(out), rundir.HOROVOD_TIMELINE)
    return extra_env


def execute(request: RunRequest, on_steps: Callable[[int], None] | None = None,
            on_ranks: Callable[[list[RankProgress]], None] | None = None) -> str:
    """Run ``request`` to completion and return its run directory (summary.json written).

    ``on_steps`` is told how many training steps rank 0 has finished, and ``on_ranks`` where every rank
    is (:class:`RankProgress`), about twice a second while the run goes on. A SIGTERM
    or SIGHUP to memdiag ends the ranks (they write their last records), completes the run directory
    ("terminated by SIGTERM at step K") and exits with 128 + the signal's number.
    """
    validate(request)
    options = request.options
    out = request.out or default_out(request)
    rundir.prepare(out, request.force)
    run_id = uuid.uuid4().hex[:12]
    config = agent_config(request, run_id, out)
    manifest = run_manifest(request, run_id, config, options.launcher)
    write_manifest(out, manifest)
    extra_env = rank_environment(request, out)
    if request.engine == TF_DISTRIBUTE:
        if options.hosts:
            # Free ports of other hosts are unknown here: each rank chooses its own port and address, and
            # the ranks exchange them (their start records' tf_config says what each chose).
            extra_env[ports.ENV] = ports.RANKS
            manifest["tf_ports"] = None
            manifest["tf_ports_by"] = "ranks"
        else:
            # One gRPC port per worker, all on this host; the agents write TF_CONFIG from them.
            chosen = ports.free_ports(request.world_size)
            extra_env[ports.ENV] = ports.encode(chosen)
            manifest["tf_ports"] = chosen
            manifest["tf_ports_by"] = "launcher"
        write_manifest(out, manifest)
    launch = mpirun.Launch(request.world_size, [config.encode()], hosts=options.hosts,
                           timeout_s=options.timeout_s, extra_env=extra_env,
                           mpirun_args=list(RANK_ORDER_MCA) if request.rank_order_allreduce else [],
                           launcher=options.launcher, unbound=not config.is_script)
    watchers = [StepWatcher(os.path.join(out, rundir.rank_file(rank)))
                for rank in range(request.world_size if on_ranks is not None else 1)]
    # With --spool local the ranks stream their records into the run directory too (about once a second).

    def poll() -> None:
        for watcher in watchers:
            watcher.poll()
        if on_steps is not None:
            on_steps(watchers[0].steps)
        if on_ranks is not None:
            on_ranks([watcher.progress for watcher in watchers])
    started = time.monotonic()
    try:
        result = mpirun.run(launch, os.path.join(out, rundir.MPIRUN_LOG),
                            poll if on_steps is not None or on_ranks is not None else None)
    except SystemExit as exc:
        # mpirun.run ended the ranks on a signal to memdiag (SystemExit(128 + signal)): say so, then exit.
        code = exc.code if isinstance(exc.code, int) else 1
        signum = code - 128 if code > 128 else None
        conclude(out, manifest, returncode=code, timed_out=False, wall_s=time.monotonic() - started,
                 command=mpirun.command(launch), signal_name=_signal_name(signum) if signum else None)
        raise
    run = conclude(out, manifest, returncode=result.returncode, timed_out=result.timed_out, wall_s=result.wall_s,
                   command=result.command, summarize_run=False)
    problems = {records.end.get("error") for records in run.ranks.values()
                if records.end and records.end.get("status") == "environment"}
    if problems:
        # Nothing was measured: leave nothing that looks like a run behind.
        shutil.rmtree(out, ignore_errors=True)
        raise UserError(sorted(p for p in problems if p)[0])
    write_summary(run)
    return out


def _signal_name(signum: int) -> str:
    import signal

    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def stopped_at(records: RankRecords) -> int | None:
    """The last training step a rank recorded (its last ``step`` record, or a later step its records
    name: a collective in flight, a ``terminated`` record); None before its first step."""
    found = [step for r in (*records.steps, records.killed, records.end, *records.side_records())
             if r is not None and isinstance(step := r.get("step"), int) and step >= 0]
    if records.collectives:
        last = records.collectives[-1].get("step")
        if isinstance(last, int) and last >= 0:
            found.append(last)
    return max(found) if found else None


def where_ranks_stopped(stopped: Mapping[int, int | None], world_size: int) -> str:
    """``rank(s) 0, 1 stopped at step 3; rank 2 before its first step; rank 3 left no records``."""
    groups: dict[str, list[int]] = {}
    for rank in range(world_size):
        if rank not in stopped:
            where = "left no records"
        elif stopped[rank] is None:
            where = "before its first step"
        else:
            where = f"stopped at step {stopped[rank]}"
        groups.setdefault(where, []).append(rank)
    return "; ".join(f"rank{'s' if len(r) > 1 else ''} {', '.join(map(str, r))} {where}" for where, r in groups.items())


def conclude(out: str, manifest: RunManifest, *, returncode: int | None, timed_out: bool, wall_s: float | None,
             command: list[str] | None, signal_name: str | None = None, exit_codes: Mapping[int, int] | None = None,
             summarize_run: bool = True, unfinished: bool = False) -> Run:
    """Complete run.json from the ranks' records (status, per-rank status, where the ranks ran) and,
    unless told not to, write summary.json. Returns the run as read.

    ``exit_codes``: each rank's exit status where the launcher is not memdiag's (``memdiag agent``; a
    negative one is the signal that ended the rank). ``signal_name``: the signal that ended the run
    from outside. ``unfinished``: nothing was heard from the launcher (a run directory still ``running``
    whose launcher is gone: SIGKILL, a lost node); the status says so and where each rank stopped.
    A rank that ended without an end record is named with the step it stopped at.
    """
    world_size = int(manifest.get("world_size") or 0)
    # The marks a script's rank killed outright left in its file: the steps they complete, into its records.
    replay.recover(out, range(world_size))
    run = load_run(out)
    versions = next((r.start.get("versions") for r in run.ranks.values() if r.start), None)
    from memdiag.analyze.rank_summary import rank_status

    # As summary.json says it: "killed" for a rank the memory limit ended, "died" for one that left no record why.
    statuses = {rank: rank_status(records) for rank, records in run.ranks.items()}
    stopped = {rank: stopped_at(records) for rank, records in run.ranks.items()}
    ok = returncode == 0 and not timed_out and len(statuses) == world_size and all(s == "ok" for s in statuses.values())
    if exit_codes is not None:
        ok = ok and all(code == 0 for code in exit_codes.values())
    if unfinished:
        status = "ended without a word from its launcher; " + where_ranks_stopped(stopped, world_size)
    elif signal_name is not None:
        reached = [s for s in stopped.values() if s is not None]
        status = f"terminated by {signal_name} at step {max(reached)}" if reached else \
            f"terminated by {signal_name} before the first step"
    else:
        status = "ok" if ok else ("timeout" if timed_out else "failed")
    starts = [run.ranks[r].start if r in run.ranks else None for r in range(world_size)]
    hosts = [start.get("host") if start else None for start in starts]
    if manifest.get("placement") is None and all(hosts):
        # Where srun or the user's launcher put the ranks: their start records say.
        counts: dict[str, int] = {}
        for host in hosts:
            counts[str(host)] = counts.get(str(host), 0) + 1
        manifest["placement"] = [str(h) for h in hosts]
        manifest["hosts"] = ",".join(f"{h}:{c}" for h, c in counts.items()) if len(counts) > 1 else None
        manifest["oversubscribed"] = max(counts.values()) > int(manifest.get("cores_per_host") or 1)
    manifest.update({
        "command": command,
        "returncode": returncode,
        "timed_out": timed_out,
        "wall_s": wall_s,
        "finished": time.time(),
        "versions": versions,
        "rank_status": {str(r): statuses.get(r, "missing") for r in range(world_size)},
        "rank_stopped_at_step": {str(r): stopped.get(r) for r in range(world_size)},
        "status": status,
    })
    if exit_codes is not None:
        manifest["rank_exit_codes"] = {str(r): exit_codes.get(r) for r in range(world_size)}
    if signal_name is not None:
        manifest["terminated_by"] = signal_name
    write_manifest(out, manifest)
    run.manifest = manifest  # the records were read above; only the manifest has changed since
    if summarize_run:
        write_summary(run)
    return run


def write_summary(run: Run) -> None:
    from memdiag.analyze.summary import summarize

    rundir.write_json(os.path.join(run.path, rundir.SUMMARY), summarize(run))
