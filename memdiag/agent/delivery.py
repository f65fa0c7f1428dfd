"""``--spool local``: every rank's files reach the run directory through rank 0, over MPI.

When the hosts share no file system, each rank writes into a spool folder on its own node and this
module moves what it writes to rank 0, which writes it into the run directory (on the launching host).

Invariants:

- No file is ever held whole in memory: files travel in chunks of at most :data:`CHUNK_BYTES`, and
  rank 0 writes each chunk at its offset as it arrives.
- Record files (``*.jsonl``, append-only) are streamed while the rank runs, about once a second. So
  the run directory holds every rank's records up to about the last second, however the job ends:
  the ranks mpirun tears down after one died get no chance to send anything more. Other files
  (memray's, the parameters) are complete only when the rank ends, and are sent then.
- A rank that the memory watchdog kills first sends the rest of its records, the ``killed`` record
  among them, and waits (bounded) until rank 0 says they are written; only then is it killed.
  Its memray file is not sent: sending gigabytes would hold the kill back while memory keeps growing.
- Nobody waits forever: a sender gives up on rank 0 after :data:`ACK_TIMEOUT_S`; rank 0 waits for
  another rank's last files only while that rank keeps talking (every rank sends at least a heartbeat
  every :data:`HEARTBEAT_S`) and gives up on it after :data:`QUIET_S` of silence. A rank 0 that failed
  waits only :data:`FAILED_GRACE_S`: the others may be blocked in a collective waiting for it, and
  only its exit (mpirun then ends the job) frees them.
- The messages travel on a duplicate of MPI_COMM_WORLD, so they never meet the job's own messages.
  MPI is initialised here, when the rank starts (mpi4py, MPI_THREAD_MULTIPLE: the level Horovod asks
  for itself), so that delivery works from any thread, from the first moment, and also for a script
  that fails before calling ``hvd.init()``.
"""

from __future__ import annotations

import abc
import os
import shutil
import sys
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from memdiag.agentconfig import AgentConfig

CHUNK_BYTES = 4 * 2**20
STREAM_INTERVAL_S = 1.0
HEARTBEAT_S = 2.0
ACK_TIMEOUT_S = 60.0
# Memory keeps growing while a rank over its limit sends its last records: wait less for rank 0.
KILL_ACK_TIMEOUT_S = 10.0
QUIET_S = 60.0
# A few streaming rounds: what the other ranks wrote before rank 0 failed reaches it in that time.
FAILED_GRACE_S = 3 * STREAM_INTERVAL_S
_POLL_S = 0.002

TAG_CHUNK, TAG_DONE, TAG_ACK, TAG_HEARTBEAT = 1, 2, 3, 4


def is_streamed(name: str) -> bool:
    """Append-only files, safe to send while they grow: the record files."""
    return name.endswith(".jsonl")


def start(config: AgentConfig, rank: int, spool: str) -> Delivery | None:
    """The delivery of this rank's spool folder, started; None when the ranks write into the run
    directory themselves (``--spool shared``)."""
    if config.spool != "local":
        return None
    from mpi4py import MPI  # initialises MPI unless it already is

    comm = MPI.COMM_WORLD.Dup()
    kind = Collector if comm.Get_rank() == 0 else Courier
    delivery = kind(comm, rank, spool, config.run_dir)
    delivery.start()
    return delivery


class Spool:
    """A rank's spool folder and how much of each file has been handed on."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.sent: dict[str, int] = {}

    def chunks(self, streamed_only: bool) -> Iterator[tuple[str, int, bytes]]:
        """What has not been handed on yet, as (name, offset, bytes); a chunk counts as handed on
        once the consumer asks for the next one, so an interrupted hand-over is repeated, not lost."""
        for name in sorted(os.listdir(self.path)):
            full = os.path.join(self.path, name)
            if (streamed_only and not is_streamed(name)) or not os.path.isfile(full):
                continue
            offset = self.sent.get(name, 0)
            with open(full, "rb") as f:
                f.seek(offset)
                while data := f.read(CHUNK_BYTES):
                    yield name, offset, data
                    offset += len(data)
                    self.sent[name] = offset

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def write_chunk(run_dir: str, name: str, offset: int, data: bytes) -> None:
    """Rank 0: one chunk into the run directory, at its offset (a repeated chunk rewrites the same
    bytes). Only a plain file name is accepted, so nothing lands outside the run directory."""
    name = os.path.basename(name)
    fd = os.open(os.path.join(run_dir, name), os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.pwrite(fd, data, offset)
    finally:
        os.close(fd)


class Delivery(abc.ABC):
    """What both ends share: the spool, a lock (the streaming thread, the memory watchdog and the
    rank's last act all hand files on, one at a time) and the streaming thread."""

    def __init__(self, comm: Any, rank: int, spool: str, run_dir: str) -> None:
        self.comm = comm
        self.rank = rank
        self.size = comm.Get_size()
        self.spool = Spool(spool)
        self.run_dir = run_dir
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="memdiag-delivery", daemon=True)

    def start(self) -> None:
        self._thread.start()

    @abc.abstractmethod
    def finish(self, status: str) -> None:
        """The rank has ended (its files closed): hand everything on and clean the spool."""

    @abc.abstractmethod
    def before_kill(self) -> None:
        """The rank is about to be killed: hand its records on, bounded in time."""

    @abc.abstractmethod
    def _loop(self) -> None:
        """The streaming thread."""

    def _stop_thread(self) -> None:
        self._stop.set()
        self._thread.join(timeout=ACK_TIMEOUT_S)


class Courier(Delivery):
    """Every rank but 0: sends its files to rank 0."""

    def __init__(self, comm: Any, rank: int, spool: str, run_dir: str) -> None:
        super().__init__(comm, rank, spool, run_dir)
        self._last_sent = 0.0
        self._given_up = False

    def finish(self, status: str) -> None:
        self._stop_thread()
        with self._lock:
            delivered = self._hand_over(status, streamed_only=False, timeout_s=ACK_TIMEOUT_S)
        if delivered:
            self.spool.remove()
        else:
            print(f"memdiag: rank {self.rank}: rank 0 did not take this rank's files within {ACK_TIMEOUT_S:g} s; "
                  f"they stay in {self.spool.path}", file=sys.stderr, flush=True)

    def before_kill(self) -> None:
        # The streaming thread may be in the middle of a hand-over: wait for it, but not for long.
        if not self._lock.acquire(timeout=KILL_ACK_TIMEOUT_S):
            return
        try:
            if self._hand_over("killed", streamed_only=True, timeout_s=KILL_ACK_TIMEOUT_S):
                self.spool.remove()
        finally:
            self._lock.release()

    def _hand_over(self, status: str, streamed_only: bool, timeout_s: float) -> bool:
        """Send what is left, then the end of this rank's files, and wait for rank 0's word that all
        of it is written."""
        deadline = time.monotonic() + timeout_s
        if not self._send_new(streamed_only, deadline) or not self._send(TAG_DONE, status, deadline):
            return False
        while time.monotonic() < deadline:
            if self.comm.iprobe(source=0, tag=TAG_ACK):
                self.comm.recv(source=0, tag=TAG_ACK)
                return True
            time.sleep(_POLL_S)
        return False

    def _loop(self) -> None:
        while not self._stop.wait(STREAM_INTERVAL_S):
            with self._lock:
                if self._given_up:
                    return
                deadline = time.monotonic() + ACK_TIMEOUT_S
                if self._send_new(streamed_only=True, deadline=deadline) \
                        and time.monotonic() - self._last_sent >= HEARTBEAT_S:
                    # Rank 0 waits at the end only for ranks that it hears from.
                    self._send(TAG_HEARTBEAT, None, deadline)

    def _send_new(self, streamed_only: bool, deadline: float) -> bool:
        for name, offset, data in self.spool.chunks(streamed_only):
            if not self._send(TAG_CHUNK, (name, offset, data), deadline):
                return False
        return True

    def _send(self, tag: int, payload: Any, deadline: float) -> bool:
        """One message to rank 0, polled rather than blocking so that a rank 0 that is gone cannot
        hold this rank for ever."""
        if self._given_up:
            return False
        request = self.comm.isend(payload, dest=0, tag=tag)
        while not request.Test():
            if time.monotonic() > deadline:
                self._give_up()
                return False
            time.sleep(_POLL_S)
        self._last_sent = time.monotonic()
        return True

    def _give_up(self) -> None:
        if not self._given_up:
            self._given_up = True
            print(f"memdiag: rank {self.rank}: rank 0 stopped taking records; the rest stay in {self.spool.path}",
                  file=sys.stderr, flush=True)


class Collector(Delivery):
    """Rank 0: writes what every rank sends, and its own files, into the run directory."""

    def __init__(self, comm: Any, rank: int, spool: str, run_dir: str) -> None:
        super().__init__(comm, rank, spool, run_dir)
        os.makedirs(run_dir, exist_ok=True)
        now = time.monotonic()
        self._heard = {r: now for r in range(1, self.size)}
        self._done: dict[int, str] = {}
        self._state = threading.Lock()

    def finish(self, status: str) -> None:
        with self._lock:
            self._copy_own(streamed_only=False)
        grace = None if status == "ok" else time.monotonic() + FAILED_GRACE_S
        missing = self._wait_for_others(grace)
        self._stop_thread()
        if missing and grace is None:
            print(f"memdiag: rank 0: no word from rank(s) {', '.join(map(str, missing))} for {QUIET_S:g} s; "
                  "what they had not sent is missing from the run directory", file=sys.stderr, flush=True)
        self.spool.remove()

    def before_kill(self) -> None:
        if self._lock.acquire(timeout=KILL_ACK_TIMEOUT_S):
            try:
                self._copy_own(streamed_only=True)
            finally:
                self._lock.release()

    def _wait_for_others(self, deadline: float | None) -> list[int]:
        """Wait until every other rank has handed over its files, fell silent for QUIET_S, or the
        deadline passed; the ranks still missing."""
        while True:
            now = time.monotonic()
            with self._state:
                pending = [r for r in range(1, self.size) if r not in self._done]
                if not pending or all(now - self._heard[r] > QUIET_S for r in pending) \
                        or (deadline is not None and now > deadline):
                    return pending
            time.sleep(0.05)

    def _loop(self) -> None:
        from mpi4py import MPI

        status = MPI.Status()
        next_copy = 0.0
        while not self._stop.is_set():
            busy = False
            while self.comm.iprobe(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=status):
                busy = True
                self._receive(status.Get_source(), status.Get_tag())
            if time.monotonic() >= next_copy:
                next_copy = time.monotonic() + STREAM_INTERVAL_S
                with self._lock:
                    self._copy_own(streamed_only=True)
            if not busy:
                self._stop.wait(0.01)

    def _receive(self, source: int, tag: int) -> None:
        payload = self.comm.recv(source=source, tag=tag)
        if tag == TAG_CHUNK:
            write_chunk(self.run_dir, *payload)
        with self._state:
            self._heard[source] = time.monotonic()
            if tag == TAG_DONE:
                self._done[source] = payload
        if tag == TAG_DONE:
            # Messages from one rank arrive in the order sent: its chunks are all written by now.
            self.comm.send(None, dest=source, tag=TAG_ACK)

    def _copy_own(self, streamed_only: bool) -> None:
        for name, offset, data in self.spool.chunks(streamed_only):
            write_chunk(self.run_dir, name, offset, data)
