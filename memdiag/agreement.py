"""Cross-rank agreement: every decision that changes a collective, made alike on every rank.

A rank that decides alone (to densify a gradient, to run one more warm-up step) issues a collective
the others do not, and the job deadlocks or reduces the wrong tensors. So every such decision is made
from figures every rank contributes, through one interface:

    agreement.gather(key, values)   -> every rank's tuple of integers, in rank order
    agreement.max(key, values)      -> their element-wise largest

- **Once per key.** The first call for a key exchanges; later calls return the first answer, with no
  exchange (a retrace on one rank never agrees again).
- **In order.** Ranks exchange in the order they ask, and must ask for the same keys in the same
  order: the n-th exchange of every rank is the same key. Each exchange carries a 64-bit digest of
  its key, so ranks at different keys (a tensor seen in another order, or by one rank only) learn it
  at once and raise :class:`AgreementError` naming the key, in place of pairing one tensor's rows with
  another's. After that error the agreement is broken and every later call raises it again, so that
  no rank goes on alone.
- **Within a deadline.** A rank whose partners never ask (they took another path) waits at most
  ``timeout_s``, and never past ``until`` (the run's time limit less a margin, so that the reason is
  written before the launcher ends the job), then raises :class:`AgreementError` naming the key.

Transports (each an exchange of one tuple of integers per rank, in rank order):

- :class:`HorovodTransport`: Horovod's allgather (eager, on the gradient's process set, underneath
  memdiag's recording hooks), for jobs reduced by Horovod, under any launcher Horovod supports;
- :class:`MPITransport`: mpi4py on a duplicate of MPI_COMM_WORLD, for the tf-distribute engine's
  workers (no Horovod), all started by an MPI launcher;
- :class:`CoordinationTransport`: TensorFlow's coordination service (the key-value store every
  MultiWorkerMirroredStrategy worker has), for the library's ``densify_gradients`` under any launcher;
- :class:`LocalTransport`: one rank, nothing to exchange.

One decision is agreed inside the graph rather than by this interface's Python calls: Horovod's
``auto`` in a ``tf.function`` whose distinct rows are known only when the first step runs
(:meth:`memdiag.densify.DensifyPolicy.reduce_at_run_time`), where a blocking call would hold one of
TensorFlow's executor threads while the others' steps still need theirs. It is a max-allreduce named
after its key, made once, at the first step, inside the ``tf.cond`` the reduction is built in; Horovod
pairs collectives by their full names, which carry the scopes of the conditionals built before, so
the ranks must build the same reductions in the same order, as Horovod's own collectives of the step
require. The order of every agreement in a run is in docs/explanation/architecture.md
("Agreement between ranks").

This module imports no TensorFlow, Horovod or MPI at import time; each transport imports its own.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

# How long a rank waits for the others at one agreement before it gives up (seconds): they may still be
# building or tracing the model, which takes a minute on an oversubscribed host.
DEFAULT_TIMEOUT_S = 300.0
UNKNOWN = -1  # a figure a rank does not know (its rows, in a graph of a batch of unknown size)


class AgreementError(RuntimeError):
    """The ranks could not agree: they asked for different keys, or some never asked."""


class Transport(Protocol):
    """Exchanges one tuple of integers per rank: every rank's, in rank order, within ``timeout_s``
    (``TimeoutError`` past it). ``seq`` numbers the exchange (0, 1, ...), the same on every rank."""

    rank: int
    size: int

    def exchange(self, seq: int, payload: tuple[int, ...], timeout_s: float) -> list[tuple[int, ...]]: ...


def key_digest(key: str) -> int:
    """A signed 64-bit digest of ``key`` (what fits in an int64 tensor)."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little", signed=True)


class Agreement:
    """The agreement of one group of ranks (the job, or one Horovod process set) over one transport."""

    def __init__(self, transport: Transport, timeout_s: float = DEFAULT_TIMEOUT_S, until: float | None = None) -> None:
        self.transport = transport
        self.timeout_s = timeout_s
        self.until = until  # wall-clock time (time.time()) past which no exchange waits
        self.keys: list[str] = []  # agreed so far, in order
        self._answers: dict[str, tuple[tuple[int, ...], ...]] = {}
        self._broken: AgreementError | None = None
        self._lock = threading.Lock()

    @property
    def rank(self) -> int:
        return self.transport.rank

    @property
    def size(self) -> int:
        return self.transport.size

    def gather(self, key: str, values: Sequence[int]) -> tuple[tuple[int, ...], ...]:
        """Every rank's ``values`` for ``key``, in rank order: exchanged the first time ``key`` is asked
        for, then kept. Every rank must ask for the same keys in the same order."""
        with self._lock:
            known = self._answers.get(key)
            if known is not None:
                return known
            if self._broken is not None:
                raise self._broken
            seq = len(self.keys)
            mine = tuple(int(v) for v in values)
            wait_s = self._wait_s()
            try:
                payloads = self.transport.exchange(seq, (key_digest(key), *mine), wait_s)
            except TimeoutError:
                self._broken = AgreementError(
                    f"rank {self.rank}: the other ranks did not agree on {key!r} (agreement {seq + 1} of this "
                    f"rank) within {wait_s:.3g} s: {_SAME_ORDER}")
                raise self._broken from None
            digest = key_digest(key)
            others = [r for r, payload in enumerate(payloads) if not payload or payload[0] != digest]
            if others:
                self._broken = AgreementError(
                    f"rank {self.rank}: agreement {seq + 1} is on {key!r} here but on another key on rank"
                    f"{'s' if len(others) > 1 else ''} {', '.join(map(str, others))}: {_SAME_ORDER}")
                raise self._broken
            answer = tuple(tuple(payload[1:]) for payload in payloads)
            if any(len(v) != len(mine) for v in answer):
                self._broken = AgreementError(f"rank {self.rank}: ranks gave different numbers of figures for "
                                              f"{key!r}: {[len(v) for v in answer]}")
                raise self._broken
            self.keys.append(key)
            self._answers[key] = answer
            return answer

    def _wait_s(self) -> float:
        """How long the next exchange may wait: ``timeout_s``, cut to what is left before ``until``
        (half a second at least)."""
        if self.until is None:
            return self.timeout_s
        return max(0.5, min(self.timeout_s, self.until - time.time()))

    def max(self, key: str, values: Sequence[int]) -> tuple[int, ...]:
        """The largest of every rank's ``values`` for ``key``, element by element."""
        return tuple(max(column) for column in zip(*self.gather(key, values)))


_SAME_ORDER = ("every rank must meet the same sparse gradients (and warm-up steps) in the same order; a rank "
               "that skips a tensor, has one the others lack, or retraces on its own breaks this")


class LocalTransport:
    """One rank: nothing to exchange."""

    rank = 0
    size = 1

    def exchange(self, seq: int, payload: tuple[int, ...], timeout_s: float) -> list[tuple[int, ...]]:
        return [payload]


class MPITransport:
    """mpi4py, on a duplicate of ``comm`` (MPI_COMM_WORLD by default) made when the transport is: every
    rank must make it at the same point, from the thread that initialised MPI. An exchange is a
    non-blocking barrier, polled until the deadline, then an allgather of the payloads, so a rank whose
    partners never come gives up in time."""

    def __init__(self, comm: Any = None) -> None:
        from mpi4py import MPI

        self._comm = (comm if comm is not None else MPI.COMM_WORLD).Dup()
        self.rank = int(self._comm.Get_rank())
        self.size = int(self._comm.Get_size())

    def exchange(self, seq: int, payload: tuple[int, ...], timeout_s: float) -> list[tuple[int, ...]]:
        request = self._comm.Ibarrier()
        deadline, pause = time.monotonic() + timeout_s, 1e-4
        while not request.Test():
            if time.monotonic() > deadline:
                raise TimeoutError
            time.sleep(pause)
            pause = min(2 * pause, 0.02)
        return [tuple(p) for p in self._comm.allgather(payload)]


class HorovodTransport:
    """Horovod's allgather of an int64 vector (the payload, prefixed by its length), eager, underneath
    memdiag's recording hooks, on ``process_set`` (Horovod's global set by default). It runs on a thread
    of its own (a daemon), which gives it a deadline and makes it eager even while a ``tf.function`` is
    traced; where eager execution is disabled (TF1-style code), in a graph and session of its own."""

    def __init__(self, process_set: Any = None) -> None:
        import horovod.tensorflow as hvd

        self.process_set = process_set if process_set is not None else hvd.global_process_set
        self.rank = int(self.process_set.rank())
        self.size = int(self.process_set.size())
        self._graph: Any = None
        self._session: Any = None

    def exchange(self, seq: int, payload: tuple[int, ...], timeout_s: float) -> list[tuple[int, ...]]:
        # A daemon thread: one left waiting past the deadline must not keep the process from exiting.
        outcome: list[Any] = []

        def run() -> None:
            try:
                outcome.append(self._allgather(seq, payload))
            except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread
                outcome.append(exc)

        thread = threading.Thread(target=run, name=f"memdiag-agree-{seq}", daemon=True)
        thread.start()
        thread.join(timeout_s)
        if not outcome:
            raise TimeoutError
        if isinstance(outcome[0], BaseException):
            raise outcome[0]
        return outcome[0]  # type: ignore[no-any-return]

    def _allgather(self, seq: int, payload: tuple[int, ...]) -> list[tuple[int, ...]]:
        import tensorflow as tf

        allgather = horovod_op("allgather")
        name = f"memdiag_agree.{self.process_set.process_set_id}.{seq}"
        if tf.executing_eagerly():
            gathered = allgather(tf.constant([len(payload), *payload], tf.int64), name=name,
                                 process_set=self.process_set).numpy()
        else:
            # Eager execution disabled (a TF1-style script): a graph and session of memdiag's own.
            if self._session is None:
                self._graph = tf.Graph()
                self._session = tf.compat.v1.Session(graph=self._graph)
            with self._graph.as_default():
                op = allgather(tf.constant([len(payload), *payload], tf.int64), name=name, process_set=self.process_set)
            gathered = self._session.run(op)
        return _split([int(v) for v in gathered.tolist()])


def _split(flat: list[int]) -> list[tuple[int, ...]]:
    """Length-prefixed payloads, one after another, as tuples."""
    out, i = [], 0
    while i < len(flat):
        n = int(flat[i])
        out.append(tuple(int(v) for v in flat[i + 1:i + 1 + n]))
        i += 1 + n
    return out


class CoordinationTransport:
    """TensorFlow's coordination service (started by MultiWorkerMirroredStrategy on every worker): each
    worker publishes its payload under ``memdiag/agree/SEQ/TASK`` and reads every worker's, waiting up
    to the deadline. No MPI and no Horovod: it works under any launcher."""

    def __init__(self, strategy: Any = None) -> None:
        import tensorflow as tf
        from tensorflow.python.eager import context

        strategy = strategy if strategy is not None else tf.distribute.get_strategy()
        resolver = getattr(strategy, "cluster_resolver", None)
        self._context = context.context()
        if resolver is None or not self._context.coordination_service:
            raise ValueError("no coordination service: agreement needs a MultiWorkerMirroredStrategy with a "
                             "multi-worker TF_CONFIG")
        spec = resolver.cluster_spec()
        self._tasks = [f"{job}:{i}" for job in ("chief", "worker") if job in spec.jobs
                       for i in range(spec.num_tasks(job))]
        self._me = f"{resolver.task_type}:{resolver.task_id}"
        self.rank = self._tasks.index(self._me)
        self.size = len(self._tasks)

    def exchange(self, seq: int, payload: tuple[int, ...], timeout_s: float) -> list[tuple[int, ...]]:
        import tensorflow as tf

        self._context.set_config_key_value(f"memdiag/agree/{seq}/{self._me}", ",".join(map(str, payload)))
        found = []
        deadline = time.monotonic() + timeout_s
        for task in self._tasks:
            left_ms = max(1, int(1000 * (deadline - time.monotonic())))
            try:
                text = self._context.get_config_key_value(f"memdiag/agree/{seq}/{task}", left_ms)
            except tf.errors.OpError:  # the worker's key never came (a deadline, or the service gone)
                raise TimeoutError from None
            found.append(tuple(int(v) for v in text.split(",") if v))
        return found


_until: float | None = None
_horovod: dict[Any, Agreement] = {}


def run_deadline(run_timeout_s: float | None, now: float | None = None) -> float | None:
    """The wall-clock time past which no agreement of a run launched ``now`` with a time limit
    (``memdiag run --timeout``) waits: the limit less a margin (a quarter of it, at most 10 s), so that
    ranks that cannot agree write their reason before the run is ended. None: no limit."""
    if run_timeout_s is None:
        return None
    return (time.time() if now is None else now) + run_timeout_s - min(10.0, run_timeout_s / 4)


def configure(until: float | None) -> None:
    """The deadline of the agreements made from now on (the agent sets the run's)."""
    global _until
    _until = until


def for_horovod(process_set: Any = None) -> Agreement:
    """The agreement of a Horovod process set (the global set by default), one per set per process."""
    import horovod.tensorflow as hvd

    process_set = process_set if process_set is not None else hvd.global_process_set
    key = process_set.process_set_id
    agreement = _horovod.get(key)
    if agreement is None:
        size = int(process_set.size())
        transport: Transport = LocalTransport() if size <= 1 else HorovodTransport(process_set)
        agreement = _horovod[key] = Agreement(transport, until=_until)
    return agreement


def horovod_max_in_graph(key: str, values: Any, process_set: Any = None) -> Any:
    """The element-wise largest of every rank's int64 ``values`` tensor, as an op of the graph being
    built: Horovod's max-allreduce named after ``key`` (it holds no executor thread while it waits).
    For the one agreement made when a step runs; see the module's documentation."""
    import re

    import horovod.tensorflow as hvd

    allreduce = horovod_op("_allreduce")
    return allreduce(values, op=hvd.Max, process_set=process_set if process_set is not None else hvd.global_process_set,
                     name="memdiag_agree_" + re.sub(r"[^A-Za-z0-9_.]", "_", key))


def horovod_op(attr: str) -> Callable[..., Any]:
    """Horovod's own op underneath memdiag's recording hook (for memdiag's own collectives)."""
    import horovod.tensorflow.mpi_ops as mpi_ops

    function = getattr(mpi_ops, attr)
    while hasattr(function, "__wrapped__"):
        function = function.__wrapped__
    return function  # type: ignore[no-any-return]
