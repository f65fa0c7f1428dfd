"""The reduction policy applied to live TensorFlow gradients (the agent's hooks and the public API).

:mod:`memdiag.policy` decides from sizes; this module reads the sizes off an ``IndexedSlices``
gradient (its rows T and, where the indices are concrete, its distinct rows U), agrees on them across
the ranks, keeps each tensor's decision (made once, at the first step, for the whole job) and converts:
densifies, or merges duplicate rows (:func:`merge_duplicates`).

Agreement (:mod:`memdiag.agreement`): in ``auto`` every rank contributes its rows and distinct rows
to one exchange (Horovod's allgather, on the gradient's process set, by default) the first time a
tensor is seen, so every rank decides from the same, largest, figures and issues the same collective.
It runs eagerly even while a ``tf.function`` is being traced, which every rank does at its first step.
The new tensors of one reduction are agreed in the order of their names, so ranks that list the same
gradients in different orders still agree.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import tensorflow as tf

from memdiag import agreement, optimizer_input
from memdiag.agreement import UNKNOWN
from memdiag.compat import paired
from memdiag.formula import SparseGradientShape
from memdiag.graphcalls import host_call
from memdiag.policy import GATHERED_OPS, Decision, decide

# agree(key, values, process_set) -> every rank's values, in rank order (memdiag.agreement.Agreement.gather)
Agree = Callable[[str, tuple[int, ...], Any], Sequence[Sequence[int]]]


def merge_duplicates(grad: tf.IndexedSlices, drop: bool = False) -> tf.IndexedSlices:
    """The same gradient with the rows of equal index summed: one row per distinct index (U <= T), in
    order of first appearance, with the same dense shape. Summation order changes, so the result agrees
    with the unmerged reduction to rounding. ``drop`` (a deliberate fault) keeps the first row of each
    index instead of the sum."""
    unique, segments = tf.unique(grad.indices)
    count = tf.shape(unique)[0]
    if drop:
        positions = tf.range(tf.shape(grad.indices, out_type=segments.dtype)[0])
        first = tf.math.unsorted_segment_min(positions, segments, count)
        values = tf.gather(grad.values, first)
    else:
        values = tf.math.unsorted_segment_sum(grad.values, segments, count)
    return tf.IndexedSlices(values, unique, grad.dense_shape)


def distinct_rows(indices: Any) -> Any:
    """U: how many distinct indices (a tensor; an int when eager)."""
    return tf.size(tf.unique(tf.reshape(indices, [-1])).y)


class DensifyPolicy:
    def __init__(
        self,
        mode: str,
        margin: float,
        world_size: Callable[[], int] | None = None,
        on_decision: Callable[[Decision], None] | None = None,
        fault: str | None = None,
        agree: Agree | None = None,
    ) -> None:
        self.mode = mode
        self.margin = margin
        self.world_size = world_size
        self.on_decision = on_decision
        self.fault = fault
        self.agree = agree if agree is not None else agree_horovod
        self.decisions: dict[str, Decision] = {}
        self._flags: dict[str, Any] = {}  # auto's decisions made when the first step ran, as variables
        # auto: the gradients an optimizer took dense after their gather, by name: its class (optimizer_input)
        self._dense_update: dict[str, str] = {}

    def decide(self, name: str, grad: tf.IndexedSlices, var: Any = None, script_densifies: bool = False,
               process_set: Any = None, reduce_op: str | None = None) -> Decision:
        """The decision for ``name``, made the first time it is seen and kept for the whole job;
        ``reduce_op``: the script's reduction (:func:`memdiag.policy.decide`)."""
        if name not in self.decisions:
            world = _set_size(process_set) if process_set is not None or self.world_size is None \
                else self.world_size()
            shape = sparse_shape(grad, var)
            # U is known here only when the indices are concrete (eager code); in a graph it is measured
            # when the step runs (see the hooks' run-time decision).
            local_distinct = int(distinct_rows(grad.indices)) if tf.executing_eagerly() \
                and self.mode in ("auto", "dedup") else None
            decision = self._decide_shape(name, shape, local_distinct, script_densifies, process_set, world,
                                          reduce_op)
            if not decision.densify:
                self._keep_gathered(name, var)
            self.decisions[name] = decision
            if self.on_decision is not None:
                self.on_decision(decision)
        return self.decisions[name]

    def decide_in_name_order(self, items: list[tuple[str, Any, Any]], script_densifies: bool = False,
                             process_set: Any = None, run_time_ok: bool = True, reduce_op: str | None = None) -> None:
        """Decide for the new IndexedSlices of ``items`` (name, gradient, variable), in the order of
        their names: each decision is agreed across the ranks, in the order they ask, so a rank that
        lists the same gradients in another order still agrees with the others. Those decided when the
        step runs (``run_time_ok`` and :meth:`needs_run_time`) are left to the run."""
        fresh = sorted((name, i) for i, (name, grad, var) in enumerate(items)
                       if isinstance(grad, tf.IndexedSlices) and name not in self.decisions
                       and not (run_time_ok and self.needs_run_time(grad, var, process_set, name)))
        for name, i in fresh:
            _, grad, var = items[i]
            self.decide(name, grad, var, script_densifies, process_set, reduce_op)

    def _decide_shape(self, name: str, shape: SparseGradientShape | None, local_distinct: int | None,
                      script_densifies: bool, process_set: Any, world: int | None = None,
                      reduce_op: str | None = None) -> Decision:
        """The decision from this rank's sizes, agreed in ``auto`` (the largest rows and distinct rows
        of any rank, agreed in one exchange)."""
        if world is None:
            world = _set_size(process_set) if process_set is not None or self.world_size is None \
                else self.world_size()
        local_rows = None if shape is None else shape.rows_per_rank
        if shape is not None and local_distinct is not None:
            shape = replace(shape, distinct_rows=local_distinct)
        if self.mode == "auto" and world > 1 and reduce_op in GATHERED_OPS:
            # Every rank takes part, known rows or not, so nobody waits alone: rows and distinct rows in
            # one exchange; the largest of each (distinct rows only where every rank knows its own).
            everyone = self.agree(f"rows/{name}", (UNKNOWN if local_rows is None else local_rows,
                                                   UNKNOWN if local_distinct is None else local_distinct),
                                  process_set)
            rows = max(int(r[0]) for r in everyone)
            distinct = None if any(int(r[1]) == UNKNOWN for r in everyone) else max(int(r[1]) for r in everyone)
            shape = None if shape is None or rows == UNKNOWN else replace(shape, rows_per_rank=rows)
            if local_distinct is not None:
                shape = None if shape is None else replace(shape, distinct_rows=distinct)
        return decide(self.mode, name, world, shape, self.margin, script_densifies, local_rows, local_distinct,
                      reduce_op=reduce_op)

    def needs_run_time(self, grad: tf.IndexedSlices, var: Any, process_set: Any = None,
                       name: str | None = None) -> bool:
        """``auto`` inside a graph: the distinct rows U (and, for a batch of unknown size, the rows T)
        are only known when the step runs, so the decision is made at the first step, see the hooks;
        unless it was made before the step was traced (:meth:`decide_lookup`)."""
        if name is not None and name in self.decisions:
            return False
        world = _set_size(process_set) if process_set is not None or self.world_size is None else self.world_size()
        return (self.mode == "auto" and world > 1 and not tf.executing_eagerly() and self.fault is None
                and row_shape(grad, var) is not None)

    def decide_lookup(self, name: str, var: Any, ids: np.ndarray[Any, Any]) -> Decision:
        """The decision for an embedding table whose gradient will be the rows ``ids`` looked up (the
        first batch's, every rank its own), made before the step is traced: the gradient has one row
        per id (T = ids.size) and U = the distinct ids, so ``auto`` needs no run-time switch in the
        graph. Every rank must call it, for the same tables in the same order (the agreement)."""
        if name in self.decisions:
            return self.decisions[name]
        ids = np.asarray(ids)
        var_dims = var.shape.as_list()
        row_elements = math.prod(var_dims[1:])
        index_bytes = ids.dtype.itemsize if ids.dtype in (np.int32, np.int64) else 4  # Keras casts others to int32
        shape = SparseGradientShape(rows_per_rank=int(ids.size), row_bytes=row_elements * var.dtype.size,
                                    index_bytes=index_bytes, dense_rows=int(var_dims[0]),
                                    row_elements=row_elements)
        distinct = int(np.unique(ids).size) if self.mode in ("auto", "dedup") else None
        decision = self._decide_shape(name, shape, distinct, False, None)
        note = "; rows and distinct rows from the first batch's ids, before the step was traced"
        decision = replace(decision, reason=decision.reason + note)
        if not decision.densify:
            self._keep_gathered(name, var)
        self.decisions[name] = decision
        if self.on_decision is not None:
            self.on_decision(decision)
        return decision

    def _keep_gathered(self, name: str, var: Any) -> None:
        """``auto`` keeps ``var``'s gradient gathered (as IndexedSlices): an optimizer whose sparse update
        holds more than its dense one takes it dense (:mod:`memdiag.optimizer_input`)."""
        if self.mode == "auto" and var is not None:
            optimizer_input.shared().keep(var, name, self._optimizer_takes_dense)

    def _optimizer_takes_dense(self, name: str, optimizer: str) -> None:
        """The optimizer ``optimizer`` took ``name``'s gathered rows dense: the decision says so (a second
        policy record where it was already made; the first step's, at run time, says so itself)."""
        self._dense_update[name] = optimizer
        decision = self.decisions.get(name)
        if decision is not None and decision.dense_update_by is None:
            self.decisions[name] = decision = self._noted(decision)
            if self.on_decision is not None:
                self.on_decision(decision)

    def _noted(self, decision: Decision) -> Decision:
        by = self._dense_update.get(decision.name)
        if by is None or decision.dense_update_by is not None:
            return decision
        return replace(decision, dense_update_by=by, reason=decision.reason + (
            f"; the gathered rows are summed into a dense gradient before {by}'s update, whose update with "
            "the rows holds more than with a dense gradient (measured: memdiag.optimizer_input)"))

    def decide_rows(self, name: str, shape: SparseGradientShape, local_rows: int, agreed_rows: int,
                    script_densifies: bool, world: int, local_distinct: int | None = None,
                    agreed_distinct: int | None = None, dense_output: bool = False) -> Decision:
        """The decision for a tensor whose rows (and distinct rows) were measured when the step ran,
        and agreed."""
        if name not in self.decisions:
            shape = replace(shape, rows_per_rank=agreed_rows, distinct_rows=agreed_distinct)
            decision = decide(self.mode, name, world, shape, self.margin, script_densifies, local_rows,
                              local_distinct)
            note = "; rows measured when the first step ran"
            if dense_output and decision.reduction != "dense":
                note += ("; the gathered rows are summed into a dense gradient for the optimizer (the step "
                         "was traced for a dense one)")
            decision = self._noted(replace(decision, reason=decision.reason + note))
            self.decisions[name] = decision
            if self.on_decision is not None:
                self.on_decision(decision)
        return self.decisions[name]

    def densify(self, grad: tf.IndexedSlices) -> tf.Tensor:
        dense = tf.convert_to_tensor(grad)
        if self.fault == "sum-densified":
            # Deliberately wrong (tests of the verification): the average becomes a sum.
            world = self.world_size() if self.world_size is not None else 1
            dense = dense * tf.cast(world, dense.dtype)
        return dense

    def reduce_at_run_time(self, name: str, grad: tf.IndexedSlices, var: Any, script_densifies: bool, world: int,
                           process_set: Any, allreduce: Callable[[Any, str], Any],
                           merge: Callable[[tf.IndexedSlices], tf.IndexedSlices] | None = None,
                           count: Callable[[tf.IndexedSlices], None] | None = None) -> Any:
        """``auto`` in a graph, where the distinct rows U (and for a batch of unknown size the rows T)
        are only known when the step runs: at the first step every rank measures T and U, they agree
        on the largest of each (one max-allreduce of the pair in the graph, on the gradient's process set:
        :func:`memdiag.agreement.horovod_max_in_graph`), the
        policy decides, and the decision, kept in a variable, picks the branch of a ``tf.switch_case``
        at every step: allgather, merge then allgather, or dense allreduce. Every rank takes the same
        branch. ``allreduce(tensor, reduction)`` is the caller's reduction (Horovod's, with the job's op
        and compression); ``merge`` and ``count`` let the caller record U.

        The branches return one type, chosen when the step is traced. Where the rows T are known then
        (a static batch), every rank agrees on the largest T and the two-way choice of T alone decides
        it: when the dense allreduce beats the allgather of every row, the branches return a dense
        gradient (the merged rows, if merging wins at run time, are summed into one), so the optimizer
        takes the same update as under ``sparse_as_dense``; otherwise dense cannot win at run time
        (merging never gathers more than every row) and the branches return IndexedSlices. Where T is
        unknown until the step runs, a dense choice reaches the optimizer as IndexedSlices over every
        row."""
        from memdiag.policy import REDUCTIONS

        shape = row_shape(grad, var)
        assert shape is not None, "needs_run_time() is true only for rows of known width"
        flag = self._flags.get(name)
        if flag is None:
            with tf.init_scope():
                flag = tf.Variable(-1, dtype=tf.int64, trainable=False, name="memdiag_decision")
            self._flags[name] = flag

        dense_output = False
        static = sparse_shape(grad, var)
        if static is not None:
            rows = max(int(r[0]) for r in self.agree(f"traced/{name}", (static.rows_per_rank,), process_set))
            dense_output = decide(self.mode, name, world, replace(static, rows_per_rank=rows, distinct_rows=None),
                                  self.margin, script_densifies).densify

        def decide_now(local: Any, agreed: Any) -> Any:
            mine, most = np.asarray(local).tolist(), np.asarray(agreed).tolist()
            decision = self.decide_rows(name, shape, mine[0], most[0], script_densifies, world, mine[1], most[1],
                                        dense_output=dense_output)
            return np.int64(REDUCTIONS.index(decision.reduction))

        def first_step() -> Any:
            rows = tf.stack([tf.shape(grad.values, out_type=tf.int64)[0],
                             tf.cast(distinct_rows(grad.indices), tf.int64)])
            agreed = agreement.horovod_max_in_graph(f"run/{name}", rows, process_set)
            chosen = host_call(decide_now, [rows, agreed], Tout=tf.int64, name="memdiag_decide")
            chosen.set_shape([])
            return flag.assign(chosen, read_value=True)

        choice = tf.cond(flag < 0, first_step, flag.read_value)
        if not dense_output:
            self._keep_gathered(name, var)

        def output(reduced: Any) -> Any:
            return tf.convert_to_tensor(reduced) if dense_output else reduced

        def dense() -> Any:
            if count is not None:
                count(grad)
            reduced = allreduce(self.densify(grad), "dense")
            if dense_output:
                return reduced
            rows = tf.range(tf.shape(reduced, out_type=grad.indices.dtype)[0])
            return tf.IndexedSlices(reduced, rows, grad.dense_shape)

        def merged() -> Any:
            return output(allreduce((merge or self.merge)(grad), "dedup"))

        def sparse() -> Any:
            if count is not None:
                count(grad)
            return output(allreduce(grad, "sparse"))

        branches = {"sparse": sparse, "dedup": merged, "dense": dense}
        return tf.switch_case(tf.cast(choice, tf.int32), [branches[r] for r in REDUCTIONS])

    def merge(self, grad: tf.IndexedSlices) -> tf.IndexedSlices:
        return merge_duplicates(grad, drop=self.fault == "drop-duplicates")

    def reduce(self, grad: tf.IndexedSlices, decision: Decision) -> Any:
        """The gradient as the decision hands it to Horovod: densified, merged, or as it is."""
        if decision.densify:
            return self.densify(grad)
        if decision.merge:
            return self.merge(grad)
        return grad

    def apply(self, grads: list[Any], variables: list[Any] | None, process_set: Any = None,
              script_densifies: bool = False, reduce_op: str | None = None) -> list[Any]:
        """Gradients with every IndexedSlices converted as the policy decides: densified, merged or kept.
        ``reduce_op``: the reduction Horovod will apply (None: its default, average); under any but
        average and sum, Horovod has no allgather path, and ``auto`` densifies."""
        out = list(grads)
        items = [(getattr(var, "name", None) or f"grad_{i}", grad, var)
                 for i, (grad, var) in enumerate(paired(out, list(variables) if variables is not None
                                                         else [None] * len(out)))]
        self.decide_in_name_order(items, script_densifies, process_set, run_time_ok=False, reduce_op=reduce_op)
        for i, (name, grad, var) in enumerate(items):
            if isinstance(grad, tf.IndexedSlices):
                out[i] = self.reduce(grad, self.decide(name, grad, var, script_densifies, process_set, reduce_op))
        return out


def agree_horovod(key: str, values: tuple[int, ...], process_set: Any) -> Sequence[Sequence[int]]:
    """Every rank's ``values`` over ``process_set`` (Horovod's global set for None), through the set's
    :class:`memdiag.agreement.Agreement`."""
    return agreement.for_horovod(process_set).gather(key, values)


def process_set_size(process_set: Any) -> int | None:
    """The number of ranks of a Horovod process set; None for no set, or for one whose size is not
    known yet (a set not initialised by ``hvd.init`` or ``hvd.add_process_set`` raises on ``size()``)."""
    if process_set is None:
        return None
    try:
        size = process_set.size
        size = size() if callable(size) else size
    except Exception:  # noqa: BLE001 - a process set not initialised yet has no size
        return None
    return None if size is None else int(size)


def _set_size(process_set: Any) -> int:
    """The size of a process set that a decision needs: an error if it is not known."""
    size = process_set_size(process_set)
    if size is None:
        raise ValueError(f"the size of Horovod process set {process_set!r} is not known: initialise it first")
    return size


def row_shape(grad: tf.IndexedSlices, var: Any) -> SparseGradientShape | None:
    """The formula's sizes but the row count (0 here): what a graph knows of a batch of unknown size."""
    values_shape = grad.values.shape
    if not values_shape.rank or not values_shape[1:].is_fully_defined():
        return None
    probe = tf.IndexedSlices(tf.zeros([0, *values_shape.as_list()[1:]], grad.values.dtype),
                             tf.zeros([0], grad.indices.dtype), grad.dense_shape)
    return sparse_shape(probe, var)


def sparse_shape(grad: tf.IndexedSlices, var: Any) -> SparseGradientShape | None:
    """Sizes the formula needs, from static shapes (or concrete ones in eager code)."""
    # as_list(): under TF1's shape behaviour (disable_v2_behavior) indexing a shape gives Dimension
    # objects, whose unknown size is not None.
    values_shape = grad.values.shape
    dims = values_shape.as_list() if values_shape.rank else None
    rows = dims[0] if dims else None
    row_elements = math.prod(dims[1:]) if dims and None not in dims[1:] else None
    dense_rows = None
    if grad.dense_shape is not None:
        static = tf.get_static_value(grad.dense_shape)
        if static is not None:
            dense_rows = int(static[0])
    if dense_rows is None and var is not None and var.shape.rank:
        dense_rows = var.shape.as_list()[0]
    if rows is None or row_elements is None or dense_rows is None:
        return None
    return SparseGradientShape(
        rows_per_rank=int(rows),
        row_bytes=int(row_elements) * tf.as_dtype(grad.values.dtype).size,
        index_bytes=tf.as_dtype(grad.indices.dtype).size,
        dense_rows=int(dense_rows),
        row_elements=int(row_elements),
    )
