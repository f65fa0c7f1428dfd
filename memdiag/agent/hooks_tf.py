"""Hooks on tf.distribute.MultiWorkerMirroredStrategy's collectives (``--engine tf-distribute``).

MWMS reduces gradients in ``CollectiveAllReduce._all_reduce`` (``distribute/cross_device_ops.py``):
dense tensors are packed (one pack of all of them in a ``tf.function``, one tensor at a time eagerly)
and all-reduced by ``CollectiveReplicaLauncher.batch_all_reduce``; each IndexedSlices goes to
``CollectiveReplicaLauncher.all_reduce_indexed_slices``, which gathers every worker's row count, then
its values and its indices, padded with zero rows (``_pad_util``) to the longest worker's rows when
the counts differ (docs/explanation/physics.md). Every collective ends in ``collective_ops.all_reduce_v2``
or ``all_gather_v2``, looked up as module attributes at call time. These are replaced here:

* ``CollectiveAllReduceExtended._initialize_multi_worker``: the strategy is up: the start record.
* ``CollectiveAllReduce.batch_reduce_implementation``: a batch reduction (gradients: Keras reduces
  them with ``batch_reduce_to``); names from the destinations when they are variables.
* ``CollectiveAllReduce._all_reduce``: labels each value; applies ``--mode dense`` (an IndexedSlices
  becomes ``tf.convert_to_tensor`` of it before the strategy sees it).
* ``CollectiveReplicaLauncher.batch_all_reduce``: which values each dense all-reduce carries (a pack).
* ``CollectiveReplicaLauncher.all_reduce_indexed_slices``: the sparse context of the next gathers:
  the lengths, then values and indices (the two branches of its ``cond`` are both traced, each
  gathering values then indices).
* ``cross_device_utils._pad_util``: the next gather is padded; the worker's own rows are kept for the
  padding figures.
* ``collective_ops.all_gather_v2`` / ``all_reduce_v2``: the records, with run-time shapes, as the
  Horovod hooks make them (:class:`memdiag.agent.hooks.CollectiveHooks`): in a graph a
  ``tf.py_function`` before the collective (begin) and one after it (the record), the output passed on
  through ``tf.identity`` under a control dependency on the record, so that a record inside a ``cond``
  branch runs exactly when that branch does.

Padding of a padded gather: in-bytes (max - own rows) x row_bytes, out-bytes (N x max - sum of rows)
x row_bytes, row_bytes being a row of what is gathered (values: width x itemsize; indices: itemsize).

The collectives are serialised by the strategy (a lock around each reduction, an ordering token), so
the context below is shared by the threads that run them (eagerly, a reduction runs in a pool thread).
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import tensorflow as tf

from memdiag import graphcalls
from memdiag.agent import reduction_check
from memdiag.agent.collective_records import static_shape
from memdiag.agent.hooks import CollectiveHooks
from memdiag.agent.naming import Origin, call_site, var_name
from memdiag.agreement import UNKNOWN, Agreement
from memdiag.densify import row_shape, sparse_shape
from memdiag.format.records import ReductionCheckRecord
from memdiag.formula import SparseGradientShape, padding_bytes
from memdiag.graphcalls import host_call
from memdiag.policy import Decision, decide
from memdiag.units import format_bytes
from memdiag.workloads.loop import variable_name

ENGINE = "tf-distribute"
# The policy's reasons, said of MWMS (which has no sparse_as_dense: it always gathers an IndexedSlices).
REASONS = {
    "as-written": "as written: MultiWorkerMirroredStrategy gathers each IndexedSlices, padded to the longest "
                  "worker's rows",
    "sparse": "mode sparse: MultiWorkerMirroredStrategy's gather path, padded to the longest worker's rows",
    "dense": "mode dense: every IndexedSlices densified before MultiWorkerMirroredStrategy reduces it",
}  # auto's reason is its own (StrategyHooks._decision): the padded gather against the dense all-reduce
SPARSE_STAGES = ("lengths", "values", "indices")


@dataclass
class StrategyOrigin(Origin):
    """What a collective of the strategy carries: :class:`Origin` with the sparse stage and padding."""

    stage: str | None = None  # lengths | values | indices (an IndexedSlices) | pack (dense all-reduce) | None
    padded: bool = False
    members: list[str] = field(default_factory=list)  # a pack's tensors


@dataclass
class _Sparse:
    """One ``all_reduce_indexed_slices`` call being built (traced, or run eagerly)."""

    origin: StrategyOrigin
    gathers: int = 0
    lengths: Any = None  # the gathered row counts of every worker
    own_rows: Any = None  # set by _pad_util: this worker's rows before padding


class StrategyHooks(CollectiveHooks):
    """Records of MWMS's collectives, with the policy of ``--mode`` (as-written, sparse, dense)."""

    def __init__(self, tracer: Any, mode: str, margin: float, world_size: Callable[[], int],
                 on_decision: Callable[[Any], None], initial_parameters: str | None = None,
                 agreement: Agreement | None = None, fault: str | None = None,
                 check_reduction: bool = False) -> None:
        def decided(decision: Any) -> None:
            on_decision(replace(decision, reason=REASONS.get(decision.mode, decision.reason)))

        super().__init__(tracer, mode, margin, world_size, decided, fault=fault, check_reduction=check_reduction,
                         initial_parameters=initial_parameters)
        self.agreement = agreement  # every worker's rows (memdiag.agreement; the agent's is over MPI)
        self.on_strategy: Callable[[Any], None] | None = None  # called once, when the strategy is up
        self._lock = threading.RLock()
        self._labels: dict[int, StrategyOrigin] = {}  # id(value) -> label, for one reduction
        self._batch: list[tuple[str | None, Any]] | None = None  # (name, variable) per value of a batch reduction
        self._dense: deque[StrategyOrigin] = deque()  # labels of the dense all-reduces to come
        self._sparse: list[_Sparse] = []
        self._front: dict[int, tuple[Any, str, Any]] = {}  # id(gradient) -> (gradient, name, variable): Keras 3

    # -- installation -------------------------------------------------------------------------
    def install(self) -> None:
        from tensorflow.python.distribute import collective_all_reduce_strategy as cars
        from tensorflow.python.distribute import cross_device_ops as cdo
        from tensorflow.python.distribute import cross_device_utils as cdu
        from tensorflow.python.ops import collective_ops as cops

        launcher = cdu.CollectiveReplicaLauncher
        table: list[tuple[Any, str, Callable[[Callable], Callable]]] = [
            (cars.CollectiveAllReduceExtended, "_initialize_multi_worker", self._wrap_initialize),
            (cdo.CollectiveAllReduce, "batch_reduce_implementation", self._wrap_batch_reduce),
            (cdo.CollectiveAllReduce, "_all_reduce", self._wrap_all_reduce),
            (launcher, "batch_all_reduce", self._wrap_batch_all_reduce),
            (launcher, "all_reduce_indexed_slices", self._wrap_all_reduce_indexed_slices),
            (cdu, "_pad_util", self._wrap_pad_util),
            (cops, "all_gather_v2", self._wrap_collective("allgather")),
            (cops, "all_reduce_v2", self._wrap_collective("allreduce")),
        ]
        self._originals += graphcalls.install()  # memdiag's records order nothing in the job's graph
        for owner, attr, wrap in table:
            original = getattr(owner, attr)
            if getattr(original, "__memdiag__", False):
                continue
            wrapped: Any = wrap(original)
            wrapped.__memdiag__ = True
            wrapped.__wrapped__ = original
            self._originals.append((owner, attr, original))
            setattr(owner, attr, wrapped)

    # -- the strategy -------------------------------------------------------------------------------
    def _wrap_initialize(self, original: Callable) -> Callable:
        def initialize(extended, *args, **kwargs):
            result = original(extended, *args, **kwargs)
            # Keras 3's optimizer is hooked once the strategy is up: importing Keras earlier could touch
            # TensorFlow before the script configures its collectives.
            self._install_keras3()
            callback, self.on_strategy = self.on_strategy, None
            if callback is not None:
                callback(extended)
            return result

        return initialize

    def _install_keras3(self) -> None:
        """Keras 3 (TF >= 2.16) reduces gradient tensors, not (gradient, variable) pairs: its
        ``TFOptimizer._all_reduce_sum_gradients`` is where the variables are known. Without Keras 3's
        TensorFlow backend (Keras 2), nothing to hook."""
        try:
            from keras.src.backend.tensorflow.optimizer import TFOptimizer
        except Exception:  # noqa: BLE001 - no Keras 3, or another backend
            return
        original = getattr(TFOptimizer, "_all_reduce_sum_gradients", None)
        if original is None or getattr(original, "__memdiag__", False):
            return
        wrapped: Any = self._wrap_keras3_all_reduce(original)
        wrapped.__memdiag__ = True
        wrapped.__wrapped__ = original
        self._originals.append((TFOptimizer, "_all_reduce_sum_gradients", original))
        TFOptimizer._all_reduce_sum_gradients = wrapped

    def _wrap_keras3_all_reduce(self, original: Callable) -> Callable:
        def all_reduce_sum_gradients(optimizer, grads_and_vars):
            pairs = list(grads_and_vars)
            known = [(g, v) for g, v in pairs if g is not None and v is not None]
            # The variables here are TensorFlow's, named by their last part ("transformer/kernel:0" for
            # every kernel of a model): named instead by the path of the optimizer's Keras variable that
            # holds each, as the workloads save them.
            paths = {id(keras_variable.value): variable_name(keras_variable)
                     for keras_variable in getattr(optimizer, "_trainable_variables", ())}
            # The gradients cross to the strategy's reduction as the same objects (perhaps in another
            # thread): a process-wide map by id, holding the gradient so that its id is not reused.
            with self._lock:
                for g, v in known:
                    self._front[id(g)] = (g, paths.get(id(v)) or var_name(v), v)
            try:
                return original(optimizer, pairs)
            finally:
                with self._lock:
                    for g, _ in known:
                        self._front.pop(id(g), None)

        return all_reduce_sum_gradients

    def _wrap_batch_reduce(self, original: Callable) -> Callable:
        def batch_reduce_implementation(cross_device_ops, reduce_op, value_destination_pairs, options):
            pairs = list(value_destination_pairs)
            batch = []
            for _, destination in pairs:
                variable = destination if isinstance(destination, tf.Variable) else None
                batch.append((var_name(variable) if variable is not None else None, variable))
            with self._lock:
                previous, self._batch = self._batch, batch
            try:
                return original(cross_device_ops, reduce_op, pairs, options)
            finally:
                with self._lock:
                    self._batch = previous

        return batch_reduce_implementation

    def _wrap_all_reduce(self, original: Callable) -> Callable:
        def all_reduce(cross_device_ops, reduce_op, value, replica_id, options):
            flat = tf.nest.flatten(value, expand_composites=False)
            with self._lock:
                batch = self._batch if self._batch is not None and len(self._batch) == len(flat) else None
            gradient = batch is not None
            reduce_name = "average" if str(getattr(reduce_op, "value", reduce_op)).lower() == "mean" else "sum"
            labelled: list[Any] = []
            later: list[tuple[int, str, Any]] = []  # (position, name, variable) decided when the step runs
            checked: list[tuple[int, str]] = []  # (position, name) of the IndexedSlices gathered: check_reduction
            for i, item in enumerate(flat):
                name, variable = batch[i] if batch is not None else (None, None)
                if name is None:
                    with self._lock:
                        front = self._front.get(id(item))
                    if front is not None and front[0] is item:
                        _, name, variable = front
                sparse = isinstance(item, tf.IndexedSlices)
                if name is None:
                    name = _value_name("gradient" if gradient else "reduce", i, item)
                if variable is not None:
                    self.parameters.capture(name, variable)
                densified = False
                if sparse:
                    decision = self.decide(name, item, variable)
                    if decision is None:  # auto, rows unknown until the step runs: reduced below, on its own
                        later.append((i, name, variable))
                        labelled.append(item)
                        continue
                    if decision.densify:
                        item = self.policy.densify(item)
                        densified = True
                    elif self.check_reduction:
                        checked.append((i, name))
                label = StrategyOrigin(name, sparse=sparse, densified=densified, gradient=gradient,
                                       reduce_op=reduce_name)
                with self._lock:
                    self._labels[id(item)] = label
                labelled.append(item)
            if gradient:
                self._parameters_before_first_update()
            if later:
                return self._reduce_with_run_time_decisions(original, cross_device_ops, reduce_op, value, labelled,
                                                            later, replica_id, options, gradient, reduce_name)
            try:
                reduced = original(cross_device_ops, reduce_op, tf.nest.pack_sequence_as(value, labelled), replica_id,
                                   options)
            finally:
                with self._lock:
                    for item in labelled:
                        self._labels.pop(id(item), None)
            if checked:
                results = tf.nest.flatten(reduced, expand_composites=False)
                for i, name in checked:
                    self._compare_with_dense(original, cross_device_ops, reduce_op, labelled[i], results[i], name,
                                             replica_id, options, gradient, reduce_name)
            return reduced

        return all_reduce

    def _compare_with_dense(self, original: Callable, cross_device_ops: Any, reduce_op: Any, grad: tf.IndexedSlices,
                            gathered: tf.IndexedSlices, name: str, replica_id: Any, options: Any, gradient: bool,
                            reduce_name: str) -> None:
        """The reduction check (``check_reduction``, the verification run): ``grad``, gathered by the
        strategy into ``gathered`` (every worker's rows, the padding already cut off by
        ``all_reduce_indexed_slices``), reduced again densely through the same ``_all_reduce``, and the
        two compared (:func:`memdiag.agent.reduction_check.compare_reduced`). MWMS has no merged path:
        dense only. Every worker traces its reductions in the same order, so the extra all-reduce pairs up."""
        # Densified as the policy densifies (with --inject-fault sum-densified, N x the gradient).
        reduced = self._reduce_one(original, cross_device_ops, reduce_op, grad, name, True, replica_id, options,
                                   gradient, reduce_name).values
        base = ReductionCheckRecord(type="reduction_check", name=name, reduce_op=reduce_name, compression=None,
                                    engine=ENGINE)
        reduction_check.compare_reduced(self.tracer, base, gathered, [(reduced, "dense")])

    # -- the policy -----------------------------------------------------------------------------
    def decide(self, name: str, grad: tf.IndexedSlices, variable: Any = None) -> Decision | None:
        """The decision for ``name``, made the first time it is seen, for the whole job, from the rows
        of every worker (agreed: every worker decides from the same list). None: ``auto`` in a graph
        whose rows are unknown until the step runs (:meth:`_reduce_with_run_time_decisions`).

        Every worker takes part in the agreement, rows known or not, so that nobody waits alone;
        workers trace the same reductions in the same order, and a decision is kept per name, so a
        later retrace on one worker never agrees again."""
        known = self.policy.decisions.get(name)
        if known is not None:
            return known
        world = self.world_size()
        shape = sparse_shape(grad, variable)
        local = UNKNOWN if shape is None else shape.rows_per_rank
        rows = self.agree_rows(f"rows/{name}", local) if world > 1 else [local]
        if shape is None or UNKNOWN in rows:
            if self.policy.mode == "auto" and world > 1 and not tf.executing_eagerly() \
                    and row_shape(grad, variable) is not None:
                return None
            decision = decide(self.policy.mode, name, world, None, self.policy.margin)
            reason = REASONS.get(decision.mode, "auto: row count unknown; kept MultiWorkerMirroredStrategy's gather")
            decision = replace(decision, reason=reason)
            decision = replace(decision, local_rows=None if local == UNKNOWN else local, engine=ENGINE)
        else:
            decision = self._decision(name, shape, local, rows, world)
        return self._keep(decision)

    def _keep(self, decision: Decision) -> Decision:
        with self._lock:
            known = self.policy.decisions.get(decision.name)
            if known is not None:
                return known
            self.policy.decisions[decision.name] = decision
        if self.policy.on_decision is not None:
            self.policy.on_decision(decision)
        return decision

    def _decision(self, name: str, shape: SparseGradientShape, local: int, rows: list[int], world: int,
                  note: str = "") -> Decision:
        """MWMS's figures: it gathers N x the longest worker's rows (padded), or, densified, all-reduces
        the whole table. ``auto`` densifies when the padded gather receives more than the dense
        all-reduce x margin."""
        agreed = replace(shape, rows_per_rank=max(rows))
        mode, margin = self.policy.mode, self.policy.margin
        if mode == "auto":
            gathered, dense = agreed.gathered(world), agreed.dense()
            padding = padding_bytes(rows, shape.row_bytes, shape.index_bytes)
            densify = gathered > margin * dense
            margin_text = "" if margin == 1.0 else f" x {margin:g}"
            reason = (f"auto: padded gather {format_bytes(gathered)} (N={world} x {agreed.rows_per_rank} rows, the "
                      f"most of any worker; padding {format_bytes(padding)}) {'>' if densify else '<='} dense "
                      f"all-reduce {format_bytes(dense)}{margin_text}{note}")
            decision = Decision(name, "dense" if densify else "sparse", reason, world, agreed, False, local, mode)
        else:
            decision = decide(mode, name, world, agreed, margin, False, local)
            decision = replace(decision, reason=REASONS.get(mode, decision.reason))
        return replace(decision, rows_per_worker=tuple(rows), engine=ENGINE)

    def _reduce_with_run_time_decisions(self, original: Callable, cross_device_ops: Any, reduce_op: Any, value: Any,
                                        labelled: list[Any], later: list[tuple[int, str, Any]], replica_id: Any,
                                        options: Any, gradient: bool, reduce_name: str) -> Any:
        """``auto`` in a graph whose rows are known only when the step runs: the other values are reduced
        as the strategy would; each such IndexedSlices is reduced on its own, in a ``tf.cond`` whose
        branch (gather, or densify and all-reduce) a ``tf.py_function`` picks: at its first run it
        agrees every worker's rows (:attr:`agreement`), decides, and keeps the decision for the whole job; later
        runs return the kept decision. Every worker takes the same branch. The dense branch returns
        ``IndexedSlices`` over every row, so that both branches have one type."""
        results: list[Any] = list(labelled)
        deferred = {i for i, _, _ in later}
        rest = [item for i, item in enumerate(labelled) if i not in deferred]
        try:
            if rest:
                for i, item in zip([i for i in range(len(labelled)) if i not in deferred],
                                   original(cross_device_ops, reduce_op, rest, replica_id, options)):
                    results[i] = item
        finally:
            with self._lock:
                for item in rest:
                    self._labels.pop(id(item), None)
        world = self.world_size()
        previous: Any = None
        for i, name, variable in later:
            grad = labelled[i]
            found = row_shape(grad, variable)
            assert found is not None, "decide() defers only rows of known width"
            known_shape: SparseGradientShape = found

            def choose(rows: Any, name: str = name, shape: SparseGradientShape = known_shape) -> Any:
                known = self.policy.decisions.get(name)
                if known is None:
                    local = int(np.asarray(rows))
                    decision = self._decision(name, replace(shape, rows_per_rank=local), local,
                                              self.agree_rows(f"run/{name}", local), world,
                                              "; rows measured when the first step ran")
                    known = self._keep(decision)
                return np.int32(1 if known.densify else 0)

            # One after another, in the order traced (the same on every worker): each first run agrees.
            with tf.control_dependencies([] if previous is None else [previous]):
                choice = host_call(choose, [tf.shape(grad.values, out_type=tf.int64)[0]], Tout=tf.int32,
                                   name="memdiag_decide")
            choice.set_shape([])
            previous = choice
            results[i] = tf.cond(tf.equal(choice, 1),
                                 lambda grad=grad, name=name: self._reduce_one(original, cross_device_ops, reduce_op,
                                                                               grad, name, True, replica_id, options,
                                                                               gradient, reduce_name),
                                 lambda grad=grad, name=name: self._reduce_one(original, cross_device_ops, reduce_op,
                                                                               grad, name, False, replica_id, options,
                                                                               gradient, reduce_name))
        return tf.nest.pack_sequence_as(value, results)

    def _reduce_one(self, original: Callable, cross_device_ops: Any, reduce_op: Any, grad: tf.IndexedSlices,
                    name: str, densify: bool, replica_id: Any, options: Any, gradient: bool,
                    reduce_name: str) -> tf.IndexedSlices:
        item: Any = self.policy.densify(grad) if densify else grad
        label = StrategyOrigin(name, sparse=True, densified=densify, gradient=gradient, reduce_op=reduce_name)
        with self._lock:
            self._labels[id(item)] = label
        try:
            [reduced] = original(cross_device_ops, reduce_op, [item], replica_id, options)
        finally:
            with self._lock:
                self._labels.pop(id(item), None)
        if not densify:
            return reduced
        rows = tf.range(tf.shape(reduced, out_type=grad.indices.dtype)[0])
        return tf.IndexedSlices(reduced, rows, grad.dense_shape)

    def agree_rows(self, key: str, rows: int) -> list[int]:
        """Every worker's ``rows`` (-1: unknown) for ``key``, in worker order, the same list on every
        worker: one exchange of :attr:`agreement` (memdiag's own, outside the strategy's collectives)."""
        if self.agreement is None:
            raise RuntimeError("StrategyHooks: auto on several workers needs an agreement between them")
        return [r[0] for r in self.agreement.gather(key, (rows,))]

    def _parameters_before_first_update(self) -> None:
        # Saved under the names the hooks gave them (under Keras 3, their Keras paths: TensorFlow's own
        # names repeat).
        self.parameters.before_first_update()

    def _label(self, value: Any, kind: str) -> StrategyOrigin:
        with self._lock:
            label = self._labels.get(id(value))
        if label is not None:
            return label
        shape = value.values if isinstance(value, tf.IndexedSlices) else value
        return StrategyOrigin(_value_name(f"{kind}@{call_site()}", None, shape),
                              sparse=isinstance(value, tf.IndexedSlices))

    # -- the launcher ---------------------------------------------------------------------------
    def _wrap_batch_all_reduce(self, original: Callable) -> Callable:
        def batch_all_reduce(launcher, input_tensor_packs, options=None):
            labels = []
            for pack in input_tensor_packs:
                members = [self._label(t, "allreduce") for t in pack]
                if tf.executing_eagerly() or len(members) == 1:
                    labels.extend(members)  # eagerly, one all-reduce per tensor
                else:
                    labels.append(_pack_label(members))
            with self._lock:
                before = len(self._dense)
                self._dense.extend(labels)
            try:
                return original(launcher, input_tensor_packs, options)
            finally:
                with self._lock:
                    while len(self._dense) > before:  # labels an error left unissued
                        self._dense.pop()

        return batch_all_reduce

    def _wrap_all_reduce_indexed_slices(self, original: Callable) -> Callable:
        def all_reduce_indexed_slices(launcher, input_slices, options=None):
            origin = replace(self._label(input_slices, "allgather"), sparse=True)
            with self._lock:
                self._sparse.append(_Sparse(origin))
            try:
                return original(launcher, input_slices, options)
            finally:
                with self._lock:
                    self._sparse.pop()

        return all_reduce_indexed_slices

    def _wrap_pad_util(self, original: Callable) -> Callable:
        def pad_util(input_tensor, full_axis_dim):
            with self._lock:
                context = self._sparse[-1] if self._sparse else None
            if context is not None:
                context.own_rows = tf.shape(input_tensor, out_type=tf.int64)[0]
            return original(input_tensor, full_axis_dim)

        return pad_util

    # -- the collectives --------------------------------------------------------------------------
    def _wrap_collective(self, op: str) -> Callable[[Callable], Callable]:
        def wrap(original: Callable) -> Callable:
            def collective(tensor, *args, **kwargs):
                origin, context, own_rows = self._collective_origin(op, tensor)
                with tf.control_dependencies(self._begin(op, [(origin, tensor)])):
                    output = original(tensor, *args, **kwargs)
                if context is not None and origin.stage == "lengths":
                    output = self._emit(op, origin, tensor, output)
                    context.lengths = output
                    return output
                if context is not None and origin.stage in ("values", "indices"):
                    extra = [own_rows, tf.reduce_sum(tf.cast(context.lengths, tf.int64))] if origin.padded else []
                    return self._emit(op, origin, tensor, output, extra)
                return self._emit(op, origin, tensor, output)

            return collective

        return wrap

    def _collective_origin(self, op: str, tensor: Any) -> tuple[StrategyOrigin, _Sparse | None, Any]:
        with self._lock:
            if op == "allreduce":
                label = self._dense.popleft() if self._dense else None
                return (label if label is not None else self._label(tensor, op)), None, None
            context = self._sparse[-1] if self._sparse else None
            if context is None:
                return self._label(tensor, op), None, None
            i = context.gathers
            context.gathers += 1
            own_rows, context.own_rows = context.own_rows, None
        stage = "lengths" if i == 0 else ("values" if i % 2 == 1 else "indices")
        padded = stage != "lengths" and own_rows is not None
        return replace(context.origin, stage=stage, padded=padded), context, own_rows

    def _meta(self, op: str, origin: Origin, tensor: Any, grouped: bool) -> dict[str, Any]:
        meta = super()._meta(op, origin, tensor, grouped)
        stage = getattr(origin, "stage", None)
        meta["part"] = stage if stage in SPARSE_STAGES and not origin.densified else None
        meta["engine"] = ENGINE
        meta["stage"] = stage
        if stage in ("values", "indices"):
            meta["padded"] = bool(getattr(origin, "padded", False))
        members = getattr(origin, "members", None)
        if members:
            meta["pack_members"] = list(members)
        return meta

    def _emit(self, op: str, origin: StrategyOrigin, tensor: Any, output: Any, extra: list[Any] | None = None) -> Any:
        """Record the completed collective; in a graph, return its output under a control dependency on
        the record (so that the record runs whenever the output is used, in a ``cond`` branch too)."""
        meta = self._meta(op, origin, tensor, grouped=False)
        record = self.tracer.collective
        sparse_part = origin.stage in ("values", "indices")

        def fields(shape_in: list[int], shape_out: list[int], extras: list[int]) -> dict[str, Any] | None:
            if not sparse_part:
                return None
            if not extras:
                return {"pad_in_bytes": 0, "pad_out_bytes": 0}
            own_rows, total_rows = extras
            row_bytes = math.prod(shape_in[1:]) * meta["itemsize"]
            return {"rows": own_rows, "rows_total": total_rows,
                    "pad_in_bytes": (shape_in[0] - own_rows) * row_bytes,
                    "pad_out_bytes": (shape_out[0] - total_rows) * row_bytes}

        if tf.executing_eagerly():
            shape_in, shape_out = static_shape(tensor), static_shape(output)
            extras = [int(e) for e in (extra or [])]
            record(meta, shape_in, shape_out, fields(shape_in, shape_out, extras))
            return output

        def emit(shape_in, shape_out, *extras):
            s_in, s_out = np.asarray(shape_in).tolist(), np.asarray(shape_out).tolist()
            record(meta, s_in, s_out, fields(s_in, s_out, [int(np.asarray(e)) for e in extras]))
            return np.int32(0)

        with tf.control_dependencies([output]):
            inputs = [tf.shape(tensor, out_type=tf.int64), tf.shape(output, out_type=tf.int64), *(extra or [])]
            done = host_call(emit, inputs, Tout=tf.int32, name="memdiag_record")
        with tf.control_dependencies([done]):
            return tf.identity(output)


def _pack_label(members: list[StrategyOrigin]) -> StrategyOrigin:
    """One all-reduce of several tensors concatenated (MWMS's pack, in a graph). Named by its first member
    and the count of the others, the count last: a name shortened from the left, as reports shorten
    names, still says it is a pack (the members' names joined read as one tensor there, and ran to
    kilobytes); ``members`` keeps every name."""
    names = [m.name for m in members]
    name = names[0] if len(names) == 1 else f"{names[0]} and {len(names) - 1} more (pack)"
    return StrategyOrigin(name, sparse=any(m.sparse for m in members),
                          densified=any(m.densified for m in members), gradient=any(m.gradient for m in members),
                          reduce_op=members[0].reduce_op, stage="pack", members=names)


def _value_name(prefix: str, index: int | None, value: Any) -> str:
    """A name for a value that has no variable: stable from step to step and the same on every worker
    (its position and shape; an IndexedSlices' dense shape, since its rows differ between workers)."""
    if isinstance(value, tf.IndexedSlices):
        dense_shape = tf.get_static_value(value.dense_shape) if value.dense_shape is not None else None
        shape = tf.TensorShape(None if dense_shape is None else [int(d) for d in dense_shape])
        if shape.rank is None and value.values.shape.rank is not None:
            shape = tf.TensorShape([None, *value.values.shape[1:]])
    else:
        shape = tf.TensorShape(getattr(value, "shape", None))
    text = "x".join("?" if d is None else str(d) for d in shape.as_list()) if shape.rank is not None else "?"
    return f"{prefix}{'' if index is None else f'_{index}'}[{text}]"
