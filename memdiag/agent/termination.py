"""How a rank ends: on SIGTERM, its records and exit; MWMS workers leaving together, or aborting; the exit without teardown.

Whatever ends it, a rank has written its ``end`` record first (status ``terminated`` on SIGTERM), so
that the launcher can tell a finished rank from one that died.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable

from memdiag.agent import delivery as _delivery
from memdiag.agent.sampler import read_hwm
from memdiag.agent.tracer import Tracer
from memdiag.format.records import EndRecord, TerminatedRecord
from memdiag.format.writer import RecordWriter

# How a batch system ends a job (scancel, a time limit; mpirun and memdiag agent pass it on): SIGTERM,
# then SIGKILL after a grace period (Slurm's KillWait, mpirun's odls_base_sigkill_timeout).
_TERMINATING = (signal.SIGTERM,)


def _on_terminating_signal(signum: int, frame: object) -> None:
    """memdiag's Python-level handler of SIGTERM: it does nothing itself; the thread of
    :func:`end_on_termination` acts (the main thread may be blocked in a collective)."""


def end_on_termination(writer: RecordWriter, tracer_of: Callable[[], Tracer | None],
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
    # freeze() hands the tracer the native marks not yet read (under --record-every up to that many
    # seconds of them), so the steps they end are written, and keeps the main thread from ending another
    # step before the exit: the step named is the one no record covers yet
    step, in_flight = tracer.freeze() if tracer is not None else (None, None)
    where = f"at step {step}" if step is not None and step >= 0 else "before the first step"
    writer.write_now(TerminatedRecord(type="terminated", signal=name, step=step, in_flight=in_flight))
    writer.write_now(EndRecord(type="end", status="terminated", signal=name, step=step,
                               error=f"terminated by {name} {where}",
                               hwm_bytes=tracer.hwm.run_peak() if tracer is not None else read_hwm()))
    if delivery is not None:
        delivery.before_kill()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(128 + signum)


def abort(code: int) -> None:
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


def leave_together(rank: int, status: str, error: str | None, exit_code: int) -> tuple[str, str | None, int]:
    """Every worker waits for the others before leaving: worker 0 leads MWMS's coordination service,
    and a peer whose leader has gone fails on its heartbeats."""
    try:
        from mpi4py import MPI

        MPI.COMM_WORLD.Barrier()
    except Exception as exc:  # noqa: BLE001 - the end record must still be written
        print(f"memdiag: rank {rank}: final barrier: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return "error", f"final barrier: {type(exc).__name__}: {exc}", 1
    return status, error, exit_code


def exit_without_teardown(code: int) -> None:
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
