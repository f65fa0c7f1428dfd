"""One rank of a memdiag run.

Order matters: TensorFlow threads are sized (built-in workloads, or when asked) before any op runs, the
hooks are installed before the workload or the user's script imports anything from Horovod, and every
exit path writes an ``end`` record so the launcher can tell a finished rank from one that died. With
``--spool local`` MPI is initialised before TensorFlow and Horovod, so that the rank's records travel
to rank 0 from the start, whatever ends the rank (:mod:`memdiag.agent.delivery`).

A user's script is measured as written: its thread pools, its Horovod options and its allocator are
left alone unless an option of memdiag's asks otherwise (and run.json says so).

With ``--engine tf-distribute`` (a script, or a built-in workload's MultiWorkerMirroredStrategy
variant) nothing imports Horovod: ranks come from MPI's environment, memdiag's own agreements go
through mpi4py, and the strategy's collectives are hooked instead (:mod:`memdiag.agent.hooks_tf`).
"""

from __future__ import annotations

import os
import platform
import runpy
import signal
import socket
import sys
import tempfile
import traceback
from collections.abc import Callable
from typing import Any

from memdiag import agreement, rundir
from memdiag.agent import delivery as _delivery
from memdiag.agent import launcher_env, replay
from memdiag.agent.records import RecordWriter
from memdiag.agent.sampler import MemorySampler, read_hwm, read_rss
from memdiag.agent.tracer import Tracer
from memdiag.agentconfig import HOROVOD, TF_DISTRIBUTE, AgentConfig
from memdiag.agreement import Agreement
from memdiag.recordformat import RECORDS_FORMAT


# Rank, size and ranks on this node as the launcher set them (mpirun, srun, horovodrun, Hydra):
# memdiag.agent.launcher_env, where each launcher's variables are read.
def _rank_from_env() -> int:
    return launcher_env.current(os.environ).rank


def _ranks_on_node() -> int:
    return launcher_env.current(os.environ).local_size


def _world_size_from_env() -> int:
    return launcher_env.current(os.environ).size


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    config = AgentConfig.decode(argv[0])
    agreement.configure(config.agree_until)
    rank = _rank_from_env()
    strategy = config.engine == TF_DISTRIBUTE
    # MWMS reads TF_CONFIG when the script builds the strategy: written before anything touches TensorFlow.
    tf_config = _write_tf_config(rank, _world_size_from_env()) if strategy else None
    spool = _spool_dir(config, rank)
    writer = RecordWriter(os.path.join(spool, rundir.rank_file(rank)), rank)
    sampler = MemorySampler(config.sample_interval_s)
    sampler.start()
    status, error, exit_code = "ok", None, 0
    delivery: _delivery.Delivery | None = None
    tracker = _start_memray(config, spool, rank)
    sampler.on_tick = writer.flush
    tracer: Tracer | None = None
    _end_on_termination(writer, lambda: tracer, lambda: delivery)
    hooks: Any = None
    marks_files: tuple[str, int] | None = None  # the marks' file and its keys, while this rank keeps them
    marks_made: Any = None  # the native marks, for the count of mark ops at the end
    try:
        delivery = _delivery.start(config, rank, spool)
        if tf_config is not None and tf_config.get("error"):
            raise EnvironmentProblem(tf_config["error"])
        _limit_threads(config)
        if strategy:
            tracer = Tracer(writer, sampler, rank, auto_steps=config.is_script)
            _watch(config, tracer, writer, sampler, delivery)
            _run_with_strategy(config, tracer, writer, rank, spool, tf_config or {})
        else:
            hvd = _import_horovod()
            before_own_setup = read_rss()  # TensorFlow and Horovod imported: the job's own from here

            tracer = Tracer(writer, sampler, rank, auto_steps=config.is_script)
            _watch(config, tracer, writer, sampler, delivery)
            from memdiag.agent.hooks import CollectiveHooks

            hooks = CollectiveHooks(
                tracer,
                mode=config.mode,
                margin=config.margin,
                world_size=hvd.size,
                on_decision=lambda d: writer.add({**d.as_record(), "step": tracer.step}),
                fault=config.fault,
                check_reduction=config.check_reduction,
                fingerprint_gradients=config.fingerprint_gradients,
                initial_parameters=os.path.join(spool, rundir.INITIAL_PARAMETERS) if rank == 0 else None,
            )

            from memdiag import nativemarks

            # A script's marks are kept in a file until they are drained, so that a rank killed outright loses
            # at most the step it was in however seldom they are drained (memdiag.agent.replay); only where the
            # launcher reads the run directory when the run ends (not --spool local's node-local folder).
            keep = config.is_script and config.spool == "shared"
            marks, marks_used = nativemarks.load(ring_file=os.path.join(spool, rundir.marks_file(rank)) if keep else None)
            sampling = "python"
            marks_made = marks
            if marks is not None:
                keys = None
                if marks.ring_file is not None:
                    marks_files = (spool, rank)
                    keys = replay.KeysFile(os.path.join(spool, rundir.keys_file(rank)))
                hooks.use_native(marks, config.record_every_s, keys)
                # --record-every: RSS read every interval by the marks library's own thread, and this
                # process's Python thread woken only to drain; not under --mem-limit, whose watchdog needs
                # every sample as it is taken
                if config.record_every_s and sampler.use_native_timer(marks, config.record_every_s):
                    sampling = "native"

            def started() -> None:
                if hvd.rank() != rank:
                    raise RuntimeError(f"Horovod rank {hvd.rank()} differs from MPI rank {rank}")
                writer.write_now({**_start_record(config, hvd, marks_used, sampling,
                                                  config.record_every_s if marks is not None else 0.0,
                                                  marks is not None and marks.ring_file is not None),
                                  "own_setup_rss_bytes": own_setup,
                                  "marks_ring_bytes": marks.resident_bytes if marks is not None else 0})

            hooks.install()
            own_setup = max(0, read_rss() - before_own_setup)
            if not config.is_script:
                hvd.init()
                started()
            else:
                # The script initialises Horovod itself, with its own arguments (process sets, ...).
                hooks.on_init = started
            if config.is_script:
                _run_script(config)
                # The script succeeded: what memdiag does now is its own bookkeeping, whose failure is
                # a warning in the report, never the script's failure (nor its exit status).
                hooks._guard("end the last step", tracer.finish)
                hooks.record_final(os.path.join(spool, rundir.PARAMETERS) if rank == 0 else None)
            else:
                _run_builtin(config, tracer, spool, hooks, hvd.rank(), hvd.size())
                tracer.finish()
    except SystemExit as exc:  # a user's script calling sys.exit()
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if code:
            status, error, exit_code = "error", f"SystemExit({exc.code})", code
    except EnvironmentProblem as exc:
        status, error, exit_code = "environment", str(exc), 2
        print(f"memdiag: rank {rank}: {exc}", file=sys.stderr, flush=True)
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the record file
        status, error, exit_code = "error", "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)), 1
        print(f"memdiag: rank {rank}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
    if status == "ok":
        _let_horovod_timeline_drain(os.environ.get("HOROVOD_TIMELINE", ""))
    if strategy and status == "ok":
        status, error, exit_code = _leave_together(rank, status, error, exit_code)
    if tracker is not None:
        tracker.__exit__(None, None, None)
    sampler.stop()
    run_peak = tracer.hwm.run_peak() if tracer is not None else read_hwm()
    end: dict[str, Any] = {"type": "end", "status": status, "error": error, "hwm_bytes": run_peak,
                           "sampler_cpu_s": sampler.cpu_s}
    if hooks is not None and hooks.failures:
        end["bookkeeping_failures"] = hooks.failure_counts()
    if marks_made is not None:
        end["mark_ops"] = marks_made.ops_made
    writer.write_now(end)
    writer.close()
    if marks_files is not None:  # every mark is in the records now: nothing to replay
        replay.remove_files(*marks_files)
    _deliver(delivery, status)
    if strategy and exit_code:
        _abort(exit_code)
    if not config.is_script or strategy:
        # MWMS: gRPC and the coordination service are not torn down (their shutdown can hang or abort).
        _exit_without_teardown(exit_code)
    return exit_code


# How a batch system ends a job (scancel, a time limit; mpirun and memdiag agent pass it on): SIGTERM,
# then SIGKILL after a grace period (Slurm's KillWait, mpirun's odls_base_sigkill_timeout).
_TERMINATING = (signal.SIGTERM,)


def _on_terminating_signal(signum: int, frame: object) -> None:
    """memdiag's Python-level handler of SIGTERM: it does nothing itself; the thread of
    :func:`_end_on_termination` acts (the main thread may be blocked in a collective)."""


def _end_on_termination(writer: RecordWriter, tracer_of: Callable[[], Tracer | None],
                        delivery_of: Callable[[], _delivery.Delivery | None]) -> None:
    """On SIGTERM, write where this rank was (a ``terminated`` record: the step, the collective in
    flight) and its ``end`` record (status ``terminated``), hand the records on (``--spool local``), and
    exit with 128 + the signal, as the signal's default would, at once: from a thread of its own, woken
    through Python's wakeup file descriptor, since the main thread may be blocked in a collective that
    a peer, already gone, never joins. A script that installs its own SIGTERM handler keeps it (and its
    own way of ending)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    for sig in _TERMINATING:
        signal.signal(sig, _on_terminating_signal)
    signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)

    def watch() -> None:
        while True:
            for signum in os.read(read_fd, 64):
                if signum in _TERMINATING and signal.getsignal(signum) is _on_terminating_signal:
                    _terminated(signum, writer, tracer_of(), delivery_of())

    threading.Thread(target=watch, name="memdiag-signals", daemon=True).start()


def _terminated(signum: int, writer: RecordWriter, tracer: Tracer | None, delivery: _delivery.Delivery | None) -> None:
    name = signal.Signals(signum).name
    # in_flight() first: it hands the tracer the native marks not yet read (under --record-every up to
    # that many seconds of them), so the steps they end are written and the step is the current one
    in_flight = tracer.in_flight() if tracer is not None else None
    step = tracer.step if tracer is not None else None
    where = f"at step {step}" if step is not None and step >= 0 else "before the first step"
    writer.write_now({"type": "terminated", "signal": name, "step": step, "in_flight": in_flight})
    writer.write_now({"type": "end", "status": "terminated", "signal": name, "step": step,
                      "error": f"terminated by {name} {where}",
                      "hwm_bytes": tracer.hwm.run_peak() if tracer is not None else read_hwm()})
    if delivery is not None:
        delivery.before_kill()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(128 + signum)


def _abort(code: int) -> None:
    """A failed MWMS worker, its records written and delivered, ends the whole job: its peers may be
    waiting for it inside a collective, and MPI_Finalize would wait for them (a deadlock until
    --timeout). mpirun ends the other ranks on MPI_Abort, or on a non-zero exit before MPI was
    initialised."""
    sys.stdout.flush()
    sys.stderr.flush()
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.COMM_WORLD.Abort(code)
    os._exit(code)


def _watch(config: AgentConfig, tracer: Tracer, writer: RecordWriter, sampler: MemorySampler,
           delivery: _delivery.Delivery | None) -> None:
    """Long waits reported and records flushed at every sampler tick; the memory limit enforced."""

    def tick() -> None:
        tracer.report_long_wait()
        writer.flush()

    sampler.on_tick = tick
    if config.mem_limit_bytes:
        sampler.on_sample = _memory_watchdog(config.mem_limit_bytes, tracer, writer,
                                             before_kill=delivery.before_kill if delivery else None)


def _write_tf_config(rank: int, size: int) -> dict[str, Any]:
    """TF_CONFIG for worker ``rank`` of ``size``: at ``localhost`` on the ports the launcher chose
    (``MEMDIAG_TF_PORTS``, one host), or, with ``--hosts`` (``MEMDIAG_TF_PORTS=ranks``), at the addresses
    and ports the ranks chose and exchanged (:func:`_gather_tf_cluster`); a TF_CONFIG already in the
    environment is the user's and is kept.
    Returns what the start record says of it (``error``: why none could be written)."""
    import json

    from memdiag import ports

    gathered: tuple[list[str], dict[str, Any]] | str | None = None
    if os.environ.get(ports.ENV) == ports.RANKS:
        # Every rank takes part, a user's TF_CONFIG or not: mpirun may hand it to some hosts' ranks only.
        try:
            gathered = _gather_tf_cluster(rank, size)
        except ValueError as exc:
            gathered = str(exc)
    if os.environ.get("TF_CONFIG"):
        return {"source": "environment", "value": os.environ["TF_CONFIG"]}
    chosen: dict[str, Any] = {}
    if isinstance(gathered, str):
        return {"error": gathered}
    if gathered is not None:
        workers, chosen = gathered
    else:
        try:
            launcher_ports = ports.decode(os.environ.get(ports.ENV, ""))
        except ValueError as exc:
            return {"error": str(exc)}
        if len(launcher_ports) != size:
            return {"error": f"{ports.ENV} gives {len(launcher_ports)} port(s) for {size} rank(s): run through "
                             "`memdiag run`"}
        workers = [f"localhost:{p}" for p in launcher_ports]
        chosen = {"ports_by": "launcher"}
    value = json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": rank}})
    os.environ["TF_CONFIG"] = value
    return {"source": "memdiag", "value": value, **chosen}


def _gather_tf_cluster(rank: int, size: int) -> tuple[list[str], dict[str, Any]]:
    """``--hosts``: this rank's address (:func:`memdiag.ports.own_address`) and a free port of its
    own host, exchanged with every rank's in one MPI allgather (mpi4py, before TensorFlow), the port held
    until every rank has chosen, so that ranks sharing a host choose distinct ones. Returns the workers
    ``ADDR:PORT`` in rank order and what the start record says of this rank's choice; ValueError (the
    same on every rank) when a rank found no address."""
    from mpi4py import MPI

    from memdiag import ports

    with ports.hold_free_port() as port:
        try:
            address, how = ports.own_address()
            mine: tuple[str | None, int, str] = (address, port, how)
        except ValueError as exc:
            mine = (None, port, str(exc))
        everyone = MPI.COMM_WORLD.allgather(mine)
    if len(everyone) != size:
        raise ValueError(f"MPI has {len(everyone)} rank(s), the job {size}")
    failed = [(r, how) for r, (address, _, how) in enumerate(everyone) if address is None]
    if failed:
        r, reason = failed[0]
        raise ValueError(f"rank {r}: {reason}")
    workers = [f"[{a}]:{p}" if ":" in str(a) else f"{a}:{p}" for a, p, _ in everyone]
    if len(set(workers)) != size:
        raise ValueError(f"the workers chose the same address and port twice ({', '.join(workers)}): set "
                         f"{ports.ADDRESS_ENV} to an address on the network the workers share")
    return workers, {"ports_by": "ranks", "address": everyone[rank][0], "port": everyone[rank][1],
                     "address_from": everyone[rank][2]}


def _run_with_strategy(config: AgentConfig, tracer: Tracer, writer: RecordWriter, rank: int, spool: str,
                       tf_config: dict[str, Any]) -> None:
    """A script using tf.distribute.MultiWorkerMirroredStrategy, run as written (``--mode`` aside), or
    a built-in workload's strategy variant: no Horovod is imported; the start record is written when
    the strategy is up. A built-in workload's rank and size are MPI's, its warm-up agreed over MPI,
    and it saves its own parameters (after ``--steps``, whatever the warm-up adds)."""
    # The policy agrees every worker's rows over MPI (memdiag's own exchange on a communicator of its
    # own, made from the thread that traces or runs the step): MPI initialised, and the communicator
    # made, in the main thread, at mpi4py's MPI_THREAD_MULTIPLE, at the same point on every worker.
    from memdiag.agent.hooks_tf import StrategyHooks

    ranks = agreement.Agreement(agreement.MPITransport(), until=config.agree_until)

    hooks = StrategyHooks(
        tracer,
        mode=config.mode,
        margin=config.margin,
        world_size=_world_size_from_env,
        on_decision=lambda d: writer.add({**d.as_record(), "step": tracer.step}),
        initial_parameters=os.path.join(spool, rundir.INITIAL_PARAMETERS) if rank == 0 else None,
        fault=config.fault,
        check_reduction=config.check_reduction,
        agreement=ranks,
    )

    def started(extended: Any) -> None:
        task = int(extended._task_id)
        if task != rank:
            raise RuntimeError(f"MultiWorkerMirroredStrategy worker {task} runs on MPI rank {rank}")
        writer.write_now(_strategy_start_record(config, extended, tf_config))

    hooks.on_strategy = started
    hooks.install()
    try:
        if config.is_script:
            _run_script(config)
        else:
            _run_builtin(config, tracer, spool, hooks, rank, _world_size_from_env(), agreement=ranks)
    finally:
        hooks.uninstall()
    if config.is_script:
        hooks._guard("end the last step", tracer.finish)
        hooks.record_final(os.path.join(spool, rundir.PARAMETERS) if rank == 0 else None)
    else:
        tracer.finish()


def _strategy_start_record(config: AgentConfig, extended: Any, tf_config: dict[str, Any]) -> dict[str, Any]:
    import tensorflow as tf

    versions: dict[str, str | None] = {"python": platform.python_version(), "tensorflow": tf.__version__}
    for package in ("keras", "mpi4py"):
        try:
            versions[package] = __import__(package).__version__
        except Exception:  # noqa: BLE001 - versions are informative only
            versions[package] = None
    versions["mpi"] = _mpi_version()
    current = os.environ.get("TF_CONFIG")
    source = tf_config.get("source")
    if source == "memdiag" and current != tf_config.get("value"):
        source = "script"  # the script wrote its own before building the strategy
    return {
        "type": "start",
        "format": RECORDS_FORMAT,
        "engine": config.engine,
        "size": int(extended._num_workers),
        "local_size": _ranks_on_node(),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "mode": config.mode,
        "versions": versions,
        "cpu_count": os.cpu_count(),
        "tf_config": {"source": source, "value": current,
                      # who chose the ports: the launcher (one host), or each rank (--hosts: its own
                      # address, how it found it, and its port)
                      **({key: tf_config[key] for key in ("ports_by", "address", "port", "address_from")
                          if key in tf_config} if source == "memdiag" else {})},
    }


def _leave_together(rank: int, status: str, error: str | None, exit_code: int) -> tuple[str, str | None, int]:
    """Every worker waits for the others before leaving: worker 0 leads MWMS's coordination service,
    and a peer whose leader has gone fails on its heartbeats."""
    try:
        from mpi4py import MPI

        MPI.COMM_WORLD.Barrier()
    except Exception as exc:  # noqa: BLE001 - the end record must still be written
        print(f"memdiag: rank {rank}: final barrier: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return "error", f"final barrier: {type(exc).__name__}: {exc}", 1
    return status, error, exit_code


def _exit_without_teardown(code: int) -> None:
    """End a built-in workload's rank once everything is written: the exit handlers run (Horovod's
    shutdown), MPI is finalised, then the process exits without the interpreter's teardown of
    TensorFlow's modules and threads, which took most of a run's wind-up (measured:
    docs/notes/code-figures.md#agent-teardown). Only for built-in workloads: a user's script may rely on
    the interpreter closing its files."""
    import atexit

    atexit._run_exitfuncs()
    # mpi4py (--spool local initialises MPI through it, before Horovod) finalises MPI in the
    # interpreter's teardown, not in an exit handler: finalise here, as MPI requires of every process.
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.Finalize()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class EnvironmentProblem(Exception):
    """The software on this host cannot run memdiag: nothing about the workload."""


def _import_horovod() -> Any:
    try:
        import horovod.tensorflow as hvd
    except ImportError as exc:
        raise EnvironmentProblem(f"Horovod with TensorFlow support cannot be imported ({exc}); "
                                 "rebuild it with `make setup`, or see `memdiag doctor`") from None
    if not hvd.mpi_built():
        raise EnvironmentProblem("Horovod was built without MPI; rebuild it with `make setup` "
                                 "(HOROVOD_WITH_MPI=1), or see `memdiag doctor`")
    return hvd


def _memory_watchdog(limit: int, tracer: Tracer, writer: RecordWriter,
                     before_kill: Callable[[], None] | None = None) -> Callable[[int], None]:
    """Kill this rank the moment its RSS passes ``limit``, as a batch system's memory enforcement
    does, after writing what it was doing: the step and the collective in flight.

    ``before_kill`` hands the records on first when they are spooled on the node (``--spool local``):
    once this rank is dead, mpirun ends every rank, and nothing else would carry them off the node."""

    def check(rss: int) -> None:
        if rss <= limit:
            return
        writer.write_now({"type": "killed", "reason": "mem-limit", "step": tracer.step, "rss_bytes": rss,
                          "limit_bytes": limit, "hwm_bytes": tracer.hwm.run_peak(), "in_flight": tracer.in_flight(),
                          "received_this_step": tracer.largest_received()})
        if before_kill is not None:
            before_kill()
        os.kill(os.getpid(), signal.SIGKILL)

    return check


def _start_memray(config: AgentConfig, spool: str, rank: int) -> Any:
    """A memray tracker with native stacks for this rank, started before TensorFlow and Horovod
    allocate anything, so their start-up buffers are attributed too."""
    if not config.memray:
        return None
    import memray

    tracker = memray.Tracker(os.path.join(spool, rundir.memray_file(rank)), native_traces=True)
    tracker.__enter__()
    return tracker


def _limit_threads(config: AgentConfig) -> None:
    """Built-in workloads: ranks sharing a node share its cores, so TF's pools are sized to not fight
    over them, and one inter-op thread makes peaks repeatable. A script keeps its own settings unless
    ``--threads-per-rank`` asks."""
    if config.is_script and not config.threads_per_rank:
        return
    import tensorflow as tf

    threads = config.threads_per_rank or max(1, (os.cpu_count() or 1) // _ranks_on_node())
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)


def _mpi_version() -> str | None:
    try:
        from mpi4py import MPI

        return MPI.Get_library_version().strip().splitlines()[0]
    except Exception:  # noqa: BLE001 - versions are informative only
        return None


def _start_record(config: AgentConfig, hvd: Any, marks: str = "python", sampling: str = "python",
                  record_every_s: float = 0.0, marks_file: bool = False) -> dict[str, Any]:
    import horovod
    import tensorflow as tf

    mpi_version = _mpi_version()
    return {
        "type": "start",
        "format": RECORDS_FORMAT,
        "size": hvd.size(),
        "local_size": hvd.local_size(),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "mode": config.mode,
        "versions": {
            "python": platform.python_version(),
            "tensorflow": tf.__version__,
            "horovod": horovod.__version__,
            "mpi": mpi_version,
        },
        "cpu_count": os.cpu_count(),
        "marks": marks,
        "sampling": sampling,
        "record_every_s": record_every_s,
        "marks_file": marks_file,
    }


def _run_script(config: AgentConfig) -> None:
    """The user's script as ``python SCRIPT ARGS`` would run it; ``sys.exit(0)`` is a success like
    reaching the end (any other exit status is raised on as the script's failure)."""
    assert config.script is not None
    sys.argv = [config.script, *config.script_args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(config.script)))
    try:
        runpy.run_path(config.script, run_name="__main__")
    except SystemExit as exc:
        if exc.code not in (None, 0):
            raise


def _run_builtin(config: AgentConfig, tracer: Tracer, spool: str, hooks: Any, rank: int, size: int,
                 agreement: Agreement | None = None) -> None:
    """A built-in workload on this rank; ``agreement`` as :attr:`WorkloadContext.agreement` (None:
    Horovod's)."""
    from memdiag.workloads.loop import WorkloadContext

    # Under the strategy, auto decides when the step is traced, from every worker's rows agreed over
    # MPI (StrategyHooks.decide); the decision from the first batch's ids agrees through Horovod.
    decide_lookups = hooks.decide_lookups if config.mode == "auto" and size > 1 and config.engine == HOROVOD \
        else None
    ctx = WorkloadContext(
        tracer=tracer,
        rank=rank,
        size=size,
        steps=config.steps,
        seed=config.seed,
        preset=config.preset,
        overrides=config.overrides,
        run_dir=spool,
        check_params=config.check_params,
        max_warmup=config.max_warmup,
        decide_lookups=decide_lookups,
        engine=config.engine,
        agreement=agreement,
    )
    if config.workload == "resnet50":
        from memdiag.workloads import resnet

        resnet.run(ctx)
    else:
        from memdiag.workloads import transformer

        transformer.run(ctx, workload=config.workload or "transformer")


def _let_horovod_timeline_drain(path: str) -> None:
    """Give Horovod's timeline writer time to write what is queued before Horovod shuts down
    (:func:`memdiag.rundir.wait_for_timeline_writer`). Every rank waits, since a rank's shutdown ends
    Horovod's loop on all ranks; a rank on a host without the file waits the quiet interval only."""
    if path:
        rundir.wait_for_timeline_writer(path)


def _spool_dir(config: AgentConfig, rank: int) -> str:
    """Where this rank writes: the run directory, or a node-local folder when it is not shared.

    The node-local folder lies in OpenMPI's session directory of this job on this node
    (OMPI_FILE_LOCATION, under TMPDIR or /tmp), which the node's daemon removes when the job ends,
    however the rank ended: a rank killed by its memory limit, or torn down by mpirun after another
    rank died, cannot clean up after itself. Under another MPI, the temporary directory.
    """
    if config.spool == "local":
        session = os.environ.get("OMPI_FILE_LOCATION", "")
        base = session if os.path.isdir(session) else tempfile.gettempdir()
        path = os.path.join(base, f"memdiag-{config.run_id}-rank{rank}")
        os.makedirs(path, exist_ok=True)
        return path
    return config.run_dir


def _deliver(delivery: _delivery.Delivery | None, status: str) -> None:
    """Without a shared file system, hand this rank's files on to rank 0 (records were streamed all
    along; see memdiag.agent.delivery), whatever the rank's status: a failed rank's records are the
    ones most needed."""
    if delivery is not None:
        delivery.finish(status)
