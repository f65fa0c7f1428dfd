"""One rank of a memdiag run: its records, its engine's rank (Horovod or tf.distribute), an ``end`` record on every exit path.

Order matters: TensorFlow threads are sized (built-in workloads, or when asked) before any op runs, the
hooks are installed before the workload or the user's script imports anything from Horovod, and every
exit path writes an ``end`` record so the launcher can tell a finished rank from one that died. With
``--spool local`` MPI is initialised before TensorFlow and Horovod, so that the rank's records travel
to rank 0 from the start, whatever ends the rank (:mod:`memdiag.agent.delivery`).

A user's script is measured as written: its thread pools, its Horovod options and its allocator are
left alone unless an option of memdiag's asks otherwise (and run.json says so).

The engine's rank sits in a module of its own: :mod:`memdiag.agent.rank_horovod` (``--engine horovod``)
and :mod:`memdiag.agent.rank_strategy` (``--engine tf-distribute``, where nothing imports Horovod);
:mod:`memdiag.agent.termination` ends a rank other than by returning.
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import traceback
from collections.abc import Callable
from typing import Any

from memdiag import agreement
from memdiag.agent import delivery as _delivery
from memdiag.agent import rank_horovod, rank_strategy, termination
from memdiag.agent.rank_env import EnvironmentProblem, rank_from_env, ranks_on_node, world_size_from_env
from memdiag.agent.sampler import MemorySampler, read_hwm
from memdiag.agent.tracer import Tracer
from memdiag.agentconfig import TF_DISTRIBUTE, AgentConfig
from memdiag.format import rundir
from memdiag.format.records import EndRecord, KilledRecord
from memdiag.format.writer import RecordWriter


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    config = AgentConfig.decode(argv[0])
    agreement.configure(config.agree_until)
    rank = rank_from_env()
    strategy = config.engine == TF_DISTRIBUTE
    # MWMS reads TF_CONFIG when the script builds the strategy: written before anything touches TensorFlow.
    tf_config = rank_strategy.write_tf_config(rank, world_size_from_env()) if strategy else None
    spool = _spool_dir(config, rank)
    writer = RecordWriter(os.path.join(spool, rundir.rank_file(rank)), rank)
    sampler = MemorySampler(config.sample_interval_s)
    sampler.start()
    status, error, exit_code = "ok", None, 0
    delivery: _delivery.Delivery | None = None
    tracker = _start_memray(config, spool, rank)
    sampler.on_tick = writer.flush
    tracer: Tracer | None = None
    termination.end_on_termination(writer, lambda: tracer, lambda: delivery)
    horovod = None if strategy else rank_horovod.HorovodRank(config, rank, spool, writer, sampler)

    def start_tracer() -> Tracer:
        """The rank's tracer, watched at every sampler tick: made once the engine's modules are imported."""
        nonlocal tracer
        tracer = Tracer(writer, sampler, rank, auto_steps=config.is_script)
        _watch(config, tracer, writer, sampler, delivery)
        return tracer

    try:
        delivery = _delivery.start(config, rank, spool)
        if tf_config is not None and tf_config.get("error"):
            raise EnvironmentProblem(tf_config["error"])
        _limit_threads(config)
        if horovod is None:
            rank_strategy.run(config, start_tracer(), writer, rank, spool, tf_config or {})
        else:
            horovod.run(start_tracer)
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the record file
        status, error, exit_code = _outcome(exc, rank)
    if status == "ok":
        _let_horovod_timeline_drain(os.environ.get("HOROVOD_TIMELINE", ""))
    if strategy and status == "ok":
        status, error, exit_code = termination.leave_together(rank, status, error, exit_code)
    if tracker is not None:
        tracker.__exit__(None, None, None)
    sampler.stop()
    run_peak = tracer.hwm.run_peak() if tracer is not None else read_hwm()
    end = EndRecord(type="end", status=status, error=error, hwm_bytes=run_peak, sampler_cpu_s=sampler.cpu_s)
    if horovod is not None:
        horovod.add_end_fields(end)
    writer.write_now(end)
    writer.close()
    if horovod is not None:
        horovod.records_written()
    _deliver(delivery, status)
    if strategy and exit_code:
        termination.abort(exit_code)
    if not config.is_script or strategy:
        # MWMS: gRPC and the coordination service are not torn down (their shutdown can hang or abort).
        termination.exit_without_teardown(exit_code)
    return exit_code


def _outcome(exc: BaseException, rank: int) -> tuple[str, str | None, int]:
    """The status, error and exit code of a rank that raised ``exc``; a script's ``sys.exit(0)`` is a success."""
    if isinstance(exc, SystemExit):  # a user's script calling sys.exit()
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        return ("error", f"SystemExit({exc.code})", code) if code else ("ok", None, 0)
    if isinstance(exc, EnvironmentProblem):
        print(f"memdiag: rank {rank}: {exc}", file=sys.stderr, flush=True)
        return "environment", str(exc), 2
    print(f"memdiag: rank {rank}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
    return "error", "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)), 1


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


def _memory_watchdog(limit: int, tracer: Tracer, writer: RecordWriter,
                     before_kill: Callable[[], None] | None = None) -> Callable[[int], None]:
    """Kill this rank the moment its RSS passes ``limit``, as a batch system's memory enforcement
    does, after writing what it was doing: the step and the collective in flight.

    ``before_kill`` hands the records on first when they are spooled on the node (``--spool local``):
    once this rank is dead, mpirun ends every rank, and nothing else would carry them off the node."""

    def check(rss: int) -> None:
        if rss <= limit:
            return
        # frozen first: no step ends between naming the step and the kill (between two steps, the next one
        # is named: every step before it has its record)
        step, in_flight = tracer.freeze()
        writer.write_now(KilledRecord(type="killed", reason="mem-limit", step=step, rss_bytes=rss,
                                      limit_bytes=limit, hwm_bytes=tracer.hwm.run_peak(), in_flight=in_flight,
                                      received_this_step=tracer.largest_received()))
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

    threads = config.threads_per_rank or max(1, (os.cpu_count() or 1) // ranks_on_node())
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)


def _let_horovod_timeline_drain(path: str) -> None:
    """Give Horovod's timeline writer time to write what is queued before Horovod shuts down
    (:func:`memdiag.format.rundir.wait_for_timeline_writer`). Every rank waits, since a rank's shutdown ends
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
