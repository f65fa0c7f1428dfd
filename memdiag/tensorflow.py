"""memdiag's per-tensor reduction policy as drop-ins for Horovod's gradient reduction, and as a gradient
transform for TensorFlow's MultiWorkerMirroredStrategy.

    import memdiag.tensorflow as mdt
    tape = mdt.DistributedGradientTape(tape, mode="auto")          # for hvd.DistributedGradientTape
    opt = mdt.DistributedOptimizer(keras_optimizer, mode="auto")    # for hvd.DistributedOptimizer

Horovod's ``sparse_as_dense`` converts every IndexedSlices gradient or none; ``mode="auto"`` reduces
each one the cheapest of three ways in received bytes: Horovod's allgather, the duplicate rows summed
first and the distinct rows gathered (``mode="dedup"`` does this for all), or a dense allreduce
(``mode="dense"``). Inside a ``tf.function`` the distinct rows are measured, and agreed across the
ranks, when the first step runs; in eager code when the tape is first used. Other keyword arguments
go to Horovod unchanged. ``.memdiag_policy.decisions`` tells what was chosen and why.

A process keeps one policy per (mode, margin, process set): a tape made anew every step (the usual
eager loop) reuses the decisions of the first, and ``auto`` agrees on each decision across the ranks
(the largest row count of any rank) so every rank issues the same collective.

MultiWorkerMirroredStrategy (no Horovod needed: Horovod is imported only by the drop-ins above), inside
the replica function, between ``tape.gradient`` and the optimizer::

    grads = mdt.densify_gradients(grads, variables, mode="auto")   # then apply_gradients / apply

MWMS gathers an IndexedSlices padded to the longest worker's rows (N x max_rows x (row + index bytes)
per worker); ``auto`` densifies it where that exceeds the dense all-reduce x margin. The decision is
made when the step is traced, once per variable, from every worker's row count agreed through the
strategy's coordination service (:class:`MirroredPolicy`); ``mirrored_policy(mode, margin).decisions``
tells what was chosen and why.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from memdiag.agreement import UNKNOWN, Agreement, AgreementError, CoordinationTransport
from memdiag.densify import DensifyPolicy, row_shape, sparse_shape
from memdiag.formula import padding_bytes
from memdiag.policy import MODES, Decision, decide, horovod_op_names
from memdiag.units import format_bytes

__all__ = ["DistributedGradientTape", "DistributedOptimizer", "MirroredPolicy", "densify_gradients", "mirrored_policy"]


_POLICIES: dict[tuple[str, float, Any], DensifyPolicy] = {}


def _policy(mode: str, margin: float, process_set: Any) -> DensifyPolicy:
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: choose one of {', '.join(MODES)}")
    key = (mode, margin, getattr(process_set, "process_set_id", None))
    if key not in _POLICIES:
        _POLICIES[key] = DensifyPolicy(mode, margin, process_set.size)
    return _POLICIES[key]


def _with_policy(reducer: Any, policy: DensifyPolicy, process_set: Any, kwargs: dict[str, Any]) -> Any:
    """The reducer with IndexedSlices gradients converted first; those ``auto`` decides only when the
    step runs (in a graph) are reduced apart, each by its chosen branch, with Horovod's allreduce and
    the same op, compression and process set."""
    import horovod.tensorflow as hvd
    import tensorflow as tf

    op = kwargs.get("op")
    options = {k: kwargs[k] for k in ("op", "compression", "process_set") if kwargs.get(k) is not None}
    reduce_op = _op_name(op)

    def allreduce_grads(grads: Any, vars: Any = None, *args: Any, **kw: Any) -> Any:
        grads = list(grads)
        later = {}
        if op in (None, hvd.Average, hvd.Sum):  # Horovod reduces IndexedSlices with these only
            for i, grad in enumerate(grads):
                var = vars[i] if vars is not None else None
                if isinstance(grad, tf.IndexedSlices) and policy.needs_run_time(grad, var, process_set):
                    later[i], grads[i] = grad, None
        reduced = reducer(policy.apply(grads, vars, process_set, reduce_op=reduce_op), vars, *args, **kw)
        if not later:
            return reduced
        reduced = list(reduced)
        for i, grad in later.items():
            var = vars[i] if vars is not None else None
            name = getattr(var, "name", None) or f"grad_{i}"
            reduced[i] = policy.reduce_at_run_time(
                name, grad, var, False, _size(process_set), process_set,
                lambda tensor, reduction: hvd.allreduce(tensor, **options))
        return reduced

    return allreduce_grads


def _op_name(op: Any) -> str | None:
    """Horovod's reduce op (``hvd.Adasum`` ...) as the name memdiag's policy takes; None: Horovod's
    default (average)."""
    if op is None:
        return None
    import horovod.tensorflow as hvd

    return horovod_op_names(hvd).get(int(op), str(op))


def _size(process_set: Any) -> int:
    size = process_set.size
    return int(size() if callable(size) else size)


def DistributedGradientTape(gradtape: Any, mode: str = "auto", margin: float = 1.0, **kwargs: Any) -> Any:
    """``hvd.DistributedGradientTape`` whose IndexedSlices gradients follow memdiag's policy."""
    import horovod.tensorflow as hvd

    kwargs.pop("sparse_as_dense", None)  # the policy decides, per tensor
    process_set = kwargs.get("process_set", hvd.global_process_set)
    tape = hvd.DistributedGradientTape(gradtape, sparse_as_dense=False, **kwargs)
    tape.memdiag_policy = _policy(mode, margin, process_set)
    tape._allreduce_grads = _with_policy(tape._allreduce_grads, tape.memdiag_policy, process_set, kwargs)
    return tape


def DistributedOptimizer(optimizer: Any, mode: str = "auto", margin: float = 1.0, **kwargs: Any) -> Any:
    """Keras ``hvd.DistributedOptimizer`` whose IndexedSlices gradients follow memdiag's policy."""
    import horovod.tensorflow.keras as hvd

    kwargs.pop("sparse_as_dense", None)
    process_set = kwargs.get("process_set", hvd.global_process_set)
    wrapped = hvd.DistributedOptimizer(optimizer, sparse_as_dense=False, **kwargs)
    wrapped.memdiag_policy = _policy(mode, margin, process_set)
    wrapped._allreduce_grads = _with_policy(wrapped._allreduce_grads, wrapped.memdiag_policy, process_set, kwargs)
    return wrapped


# -- MultiWorkerMirroredStrategy: a gradient transform, no Horovod ----------------------------------------

MIRRORED_MODES = ("sparse", "dense", "auto")
# How long a worker waits for the others' row counts (they trace the same step at once).
AGREE_TIMEOUT_MS = 300_000
_MIRRORED_REASONS = {
    "sparse": "mode sparse: MultiWorkerMirroredStrategy's gather, padded to the longest worker's rows",
    "dense": "mode dense: densified before MultiWorkerMirroredStrategy reduces it",
}
_COORDINATION: list[Agreement] = []  # the workers' agreement through the coordination service, once made


def agree_rows_coordination(key: str, rows: int) -> list[int]:
    """Every worker's ``rows`` (in task order, the same list on every worker) through the key-value store
    of TensorFlow's coordination service, which MultiWorkerMirroredStrategy starts on every worker
    (:class:`memdiag.agreement.CoordinationTransport`: no MPI, it works under any launcher). Called at
    trace time (plain Python, no op); every worker must ask for the same keys in the same order."""
    if not _COORDINATION:
        try:
            transport = CoordinationTransport()
        except ValueError:
            raise ValueError("densify_gradients: mode 'auto' agrees the rows through the coordination service of "
                             "MultiWorkerMirroredStrategy; call it inside strategy.run of a MultiWorkerMirroredStrategy "
                             "with a multi-worker TF_CONFIG, or use mode='dense'") from None
        _COORDINATION.append(Agreement(transport, AGREE_TIMEOUT_MS / 1000))
    try:
        return [r[0] for r in _COORDINATION[0].gather(key, (rows,))]
    except AgreementError as error:
        raise AgreementError(f"densify_gradients: {error}") from error


class MirroredPolicy:
    """memdiag's per-tensor policy for MultiWorkerMirroredStrategy: :meth:`apply` to the gradients inside
    the replica function, between ``tape.gradient`` and the optimizer.

    ``dense`` densifies every IndexedSlices (``tf.convert_to_tensor``: the strategy then all-reduces it
    with the dense gradients); ``sparse`` leaves them to the strategy's padded gather; ``auto`` densifies
    an IndexedSlices when the padded gather, N x the longest worker's rows x (row + index bytes), receives
    more than ``margin`` x the dense all-reduce of the variable. A decision changes the collective every
    worker issues, so ``auto`` decides once per variable, for the whole job, from every worker's row
    count, agreed when the step is traced (``agree(key, rows)`` -> every worker's, in worker order; the
    coordination service's key-value store by default, :func:`agree_rows_coordination`). Rows unknown
    when traced (a ``None`` batch dimension) on any worker: every worker raises the same ValueError.
    ``num_replicas`` replaces the replica context's ``num_replicas_in_sync`` (tests; code outside a
    replica context). ``decisions`` holds each variable's :class:`memdiag.policy.Decision`.
    """

    def __init__(self, mode: str = "auto", margin: float = 1.0,
                 agree: Callable[[str, int], Sequence[int]] | None = None, num_replicas: int | None = None) -> None:
        if mode not in MIRRORED_MODES:
            raise ValueError(f"mode {mode!r}: choose one of {', '.join(MIRRORED_MODES)}")
        self.mode = mode
        self.margin = margin
        self.decisions: dict[str, Decision] = {}
        self._agree = agree if agree is not None else agree_rows_coordination
        self._num_replicas = num_replicas
        self._lock = threading.Lock()

    def apply(self, grads: Sequence[Any], variables: Sequence[Any]) -> list[Any]:
        """``grads`` with each IndexedSlices densified or kept as decided; other gradients unchanged."""
        import tensorflow as tf

        grads, variables = list(grads), list(variables)
        if len(grads) != len(variables):
            raise ValueError(f"densify_gradients: {len(grads)} gradients for {len(variables)} variables")
        out: list[Any] = []
        for grad, variable in zip(grads, variables):
            if isinstance(grad, tf.IndexedSlices) and self.decide(grad, variable).densify:
                grad = tf.convert_to_tensor(grad)
            out.append(grad)
        return out

    def decide(self, grad: Any, variable: Any) -> Decision:
        """The decision for ``variable``'s IndexedSlices gradient: made (and agreed) the first time, then kept."""
        from memdiag.workloads.loop import variable_name

        name = variable_name(variable)
        with self._lock:
            known = self.decisions.get(name)
            if known is None:
                known = self.decisions[name] = self._decide(name, grad, _tf_variable(variable))
            return known

    def _replicas(self) -> int:
        if self._num_replicas is not None:
            return self._num_replicas
        import tensorflow as tf

        context = tf.distribute.get_replica_context()
        if context is None:
            raise ValueError("densify_gradients: call it inside the replica function (strategy.run), "
                             "between tape.gradient and the optimizer")
        return int(context.num_replicas_in_sync)

    def _decide(self, name: str, grad: Any, variable: Any) -> Decision:
        world = self._replicas()
        shape = sparse_shape(grad, variable)
        local = None if shape is None else shape.rows_per_rank
        if self.mode != "auto":
            decision = decide(self.mode, name, world, None, self.margin, local_rows=local)
            return replace(decision, reason=_MIRRORED_REASONS[self.mode], engine="tf-distribute")
        if world == 1:
            decision = decide("sparse", name, world, None, self.margin, local_rows=local)
            return replace(decision, mode="auto", engine="tf-distribute",
                           reason="auto: one replica, nothing is reduced: kept as IndexedSlices")
        # Every worker publishes, rows known or not, so that none waits alone; all then act on the same list.
        rows = [int(r) for r in self._agree(f"rows/{name}", UNKNOWN if local is None else local)]
        if len(rows) != world:
            raise ValueError(f"densify_gradients: {len(rows)} workers for {world} replicas in sync: mode 'auto' "
                             f"supports one replica per worker; use mode='dense' or 'sparse'")
        if shape is None or UNKNOWN in rows:
            unknown = [i for i, r in enumerate(rows) if r == UNKNOWN]
            what = "width" if row_shape(grad, variable) is None and local is not None else "rows"
            raise ValueError(f"densify_gradients: the {what} of {name}'s IndexedSlices gradient are unknown when "
                             f"the step is traced (workers {unknown or 'all'}); mode 'auto' must decide then, alike "
                             f"on every worker: trace the step for a batch of fixed size (no None in its "
                             f"input_signature), or pass mode='dense' or mode='sparse'")
        agreed = replace(shape, rows_per_rank=max(rows))
        decision = decide("auto", name, world, agreed, self.margin, local_rows=local)
        gathered, dense = agreed.gathered(world), agreed.dense()
        padding = padding_bytes(rows, shape.row_bytes, shape.index_bytes)
        margin_text = "" if self.margin == 1.0 else f" x {self.margin:g}"
        reason = (f"auto: padded gather {format_bytes(gathered)} (N={world} x {agreed.rows_per_rank} rows, the most of "
                  f"any worker; padding {format_bytes(padding)}) {'>' if decision.densify else '<='} dense all-reduce "
                  f"{format_bytes(dense)}{margin_text}")
        return replace(decision, reason=reason, rows_per_worker=tuple(rows), engine="tf-distribute")


def _tf_variable(variable: Any) -> Any:
    """TensorFlow's variable behind a Keras 3 variable (whose ``shape`` is a tuple), else the variable."""
    inner = getattr(variable, "value", None)
    return variable if hasattr(getattr(variable, "shape", None), "rank") or inner is None else inner


_MIRRORED: dict[tuple[str, float], MirroredPolicy] = {}


def mirrored_policy(mode: str = "auto", margin: float = 1.0) -> MirroredPolicy:
    """The process-wide :class:`MirroredPolicy` of (mode, margin): the one :func:`densify_gradients` uses."""
    key = (mode, float(margin))
    if key not in _MIRRORED:
        _MIRRORED[key] = MirroredPolicy(mode, margin)
    return _MIRRORED[key]


def densify_gradients(grads: Sequence[Any], variables: Sequence[Any], mode: str = "auto",
                      margin: float = 1.0) -> list[Any]:
    """For MultiWorkerMirroredStrategy: ``grads`` with their IndexedSlices densified as memdiag's policy
    decides (see :class:`MirroredPolicy`), to call inside ``strategy.run`` between ``tape.gradient`` and
    ``optimizer.apply_gradients`` / ``optimizer.apply``. ``mirrored_policy(mode, margin).decisions``
    says what was chosen and why."""
    return mirrored_policy(mode, margin).apply(grads, variables)
