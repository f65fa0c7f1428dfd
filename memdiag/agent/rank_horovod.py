"""One rank of a Horovod job: Horovod imported and hooked, native marks loaded, its start record, its script or workload run.

The hooks are installed before the workload or the user's script imports anything from Horovod; a
script initialises Horovod itself (with its own arguments: process sets, ...), and the start record
is written when it does.
"""

from __future__ import annotations

import os
import platform
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from memdiag.agent import replay
from memdiag.agent.rank_env import EnvironmentProblem, cpus_allowed, mpi_version
from memdiag.agent.sampler import MemorySampler, read_rss
from memdiag.agent.tracer import Tracer
from memdiag.agent.workload_run import run_builtin, run_script
from memdiag.agentconfig import AgentConfig
from memdiag.format import rundir
from memdiag.format.layout import RECORDS_FORMAT
from memdiag.format.records import EndRecord, StartRecord
from memdiag.format.writer import RecordWriter

if TYPE_CHECKING:
    from memdiag.agent.hooks import CollectiveHooks


class HorovodRank:
    """A Horovod rank being run; what the ``end`` record takes from it is set as it goes, so that a
    rank that fails part-way still reports what it had set up."""

    def __init__(self, config: AgentConfig, rank: int, spool: str, writer: RecordWriter,
                 sampler: MemorySampler) -> None:
        self.config = config
        self.rank = rank
        self.spool = spool
        self.writer = writer
        self.sampler = sampler
        self.hooks: CollectiveHooks | None = None
        self.marks_files: tuple[str, int] | None = None  # the marks' file and its keys, while this rank keeps them
        self.marks_made: Any = None  # the native marks, for the count of mark ops at the end

    def run(self, start_tracer: Callable[[], Tracer]) -> None:
        """Horovod imported, the tracer started (``start_tracer``), the hooks installed, then the
        script or the built-in workload run to its end."""
        config, rank, spool, writer, sampler = self.config, self.rank, self.spool, self.writer, self.sampler
        hvd = import_horovod()
        before_own_setup = read_rss()  # TensorFlow and Horovod imported: the job's own from here

        tracer = start_tracer()
        from memdiag.agent.hooks import CollectiveHooks

        hooks = self.hooks = CollectiveHooks(
            tracer,
            mode=config.mode,
            margin=config.margin,
            world_size=hvd.size,
            on_decision=lambda d: writer.add(d.as_record(step=tracer.step)),
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
        self.marks_made = marks
        if marks is not None:
            keys = None
            if marks.ring_file is not None:
                self.marks_files = (spool, rank)
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
            record = _start_record(config, hvd, marks_used, sampling, config.record_every_s if marks is not None else 0.0,
                                   marks is not None and marks.ring_file is not None)
            record["own_setup_rss_bytes"] = own_setup
            record["marks_ring_bytes"] = marks.resident_bytes if marks is not None else 0
            writer.write_now(record)

        hooks.install()
        own_setup = max(0, read_rss() - before_own_setup)
        if not config.is_script:
            hvd.init()
            started()
        else:
            # The script initialises Horovod itself, with its own arguments (process sets, ...).
            hooks.on_init = started
        if config.is_script:
            run_script(config)
            # The script succeeded: what memdiag does now is its own bookkeeping, whose failure is
            # a warning in the report, never the script's failure (nor its exit status).
            hooks._guard("end the last step", tracer.finish)
            hooks.record_final(os.path.join(spool, rundir.PARAMETERS) if rank == 0 else None)
        else:
            run_builtin(config, tracer, spool, hooks, hvd.rank(), hvd.size())
            tracer.finish()

    def add_end_fields(self, end: EndRecord) -> None:
        """What the ``end`` record adds for this rank: memdiag's own failures, the mark ops made."""
        if self.hooks is not None and self.hooks.failures:
            end["bookkeeping_failures"] = self.hooks.failures.counts()
        if self.marks_made is not None:
            end["mark_ops"] = self.marks_made.ops_made
            if self.marks_made.op_heap_bytes:
                end["mark_op_heap_bytes"] = self.marks_made.op_heap_bytes
            if self.marks_made.op_resident_bytes:
                end["mark_op_resident_bytes"] = self.marks_made.op_resident_bytes
        if self.hooks is not None and self.hooks.begins_shared:
            end["begins_shared"] = self.hooks.begins_shared

    def records_written(self) -> None:
        """Every mark is in the records now: nothing to replay."""
        if self.marks_files is not None:
            replay.remove_files(*self.marks_files)


def import_horovod() -> Any:
    try:
        import horovod.tensorflow as hvd
    except ImportError as exc:
        raise EnvironmentProblem(f"Horovod with TensorFlow support cannot be imported ({exc}); "
                                 "rebuild it with `make setup`, or see `memdiag doctor`") from None
    if not hvd.mpi_built():
        raise EnvironmentProblem("Horovod was built without MPI; rebuild it with `make setup` "
                                 "(HOROVOD_WITH_MPI=1), or see `memdiag doctor`")
    return hvd


def _start_record(config: AgentConfig, hvd: Any, marks: str = "python", sampling: str = "python",
                  record_every_s: float = 0.0, marks_file: bool = False) -> StartRecord:
    import horovod
    import tensorflow as tf

    mpi = mpi_version()
    return StartRecord(
        type="start",
        format=RECORDS_FORMAT,
        size=hvd.size(),
        local_size=hvd.local_size(),
        host=socket.gethostname(),
        pid=os.getpid(),
        mode=config.mode,
        versions={
            "python": platform.python_version(),
            "tensorflow": tf.__version__,
            "horovod": horovod.__version__,
            "mpi": mpi,
        },
        cpu_count=os.cpu_count(),
        cpus_allowed=cpus_allowed(),
        marks=marks,
        sampling=sampling,
        record_every_s=record_every_s,
        marks_file=marks_file,
    )
