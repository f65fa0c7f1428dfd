"""The reduction check (--check-reduction): a gradient reduced sparse, dense and merged, the results compared.

Both engines' hooks share the comparison (:func:`compare_reduced`): a gathered IndexedSlices (every
rank's rows, after the op's scaling) against dense results of the same rows, one ``reduction_check``
record each.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from memdiag.agent.choices import ScriptChoices
from memdiag.densify import DensifyPolicy
from memdiag.format.records import ReductionCheckRecord
from memdiag.graphcalls import host_call
from memdiag.rounding import gamma


def rounding_bound_ratio(diff: Any, reference: Any, terms: Any, magnitude: Any, unit: float) -> float:
    """The largest |a - b| of two reductions of the same rows as a fraction of float rounding's bound.

    Summing n terms in any order is off the exact sum by at most gamma(n - 1) x the sum of their
    magnitudes, gamma(k) = k u / (1 - k u), u the unit roundoff (2**-24 for float32); dividing each term
    first (Horovod's sparse average) rounds each once more, so gamma(n) bounds either path. Two orders
    differ by at most twice that, and a final scaling (the dense average) rounds once more (2 u |a|).
    ``terms`` is per row, ``magnitude`` per element. 1 or less: the two agree as closely as float
    arithmetic lets any two summation orders agree."""
    n = np.asarray(terms, dtype=np.float64).reshape((-1,) + (1,) * (diff.ndim - 1))
    bound = 2 * gamma(n, unit) * magnitude + 2 * unit * abs(reference)
    over = np.where(bound > 0, diff / np.where(bound > 0, bound, 1), np.where(diff > 0, np.inf, 0.0))
    return float(over.max(initial=0.0))


def compare_reductions(tracer: Any, policy: DensifyPolicy, choices: ScriptChoices,
                       plain: Callable[..., Any] | None, name: str, grad: tf.IndexedSlices, op: Any,
                       compression: Any, process_set: Any) -> None:
    """Reduce the same gradient three ways, with the script's op, compression and process set:
    allgather, dense allreduce, and merge-then-allgather; record how far the dense and the merged
    results differ from the allgather's (``against``: dense or dedup). ``plain``: Horovod's own
    allreduce, unhooked."""
    writer = tracer.writer
    reduce_op = choices.op_name(op)
    base = ReductionCheckRecord(type="reduction_check", name=name, reduce_op=reduce_op,
                                compression=choices.describe("compression", compression))
    if reduce_op not in ("average", "sum"):
        # Horovod reduces IndexedSlices with Sum or Average only: there is no sparse path to compare.
        skipped = base.copy()
        skipped["step"], skipped["skipped"] = tracer.step, f"op {reduce_op} has no allgather path"
        writer.add(skipped)
        return
    kwargs: dict[str, Any] = {"op": op}
    if compression is not None:
        kwargs["compression"] = compression
    if process_set is not None:
        kwargs["process_set"] = process_set
    assert plain is not None, "install() keeps Horovod's own allreduce"
    slices = plain(grad, **kwargs)
    reduced = plain(policy.densify(grad), **kwargs)
    merged = tf.convert_to_tensor(plain(policy.merge(grad), **kwargs))
    compare_reduced(tracer, base, slices, [(reduced, "dense"), (merged, "dedup")])


def compare_reduced(tracer: Any, base: ReductionCheckRecord, slices: tf.IndexedSlices,
                    others: Sequence[tuple[Any, str]]) -> None:
    """Record how far each dense result in ``others`` (``(tensor, against)``: dense, or dedup where
    the engine merges) differs from ``slices``, the gathered reduction of the same gradient (every
    rank's rows, after the op's scaling, no padding): one ``reduction_check`` record each, from
    ``base`` (name, reduce_op, compression), with float rounding's bound where it applies."""
    writer = tracer.writer
    # Only the rows some rank looked up can differ from zero: the results are compared on those (as
    # float64 in numpy) and a dense result must be zero everywhere else. A table-sized float64 copy
    # of each result would cost a verification run several times the job's memory.
    touched, position = tf.unique(slices.indices)
    count = tf.shape(touched, out_type=slices.indices.dtype)[0]
    # The gathered rows summed per index: the same additions, in the same order, as the dense
    # conversion the optimizer's sparse update amounts to.
    gathered = tf.math.unsorted_segment_sum(slices.values, position, count)
    # What each row sums, from the gathered rows themselves (every rank's, after the op's scaling):
    # the number of terms and the sum of their magnitudes, for float rounding's bound. The
    # magnitudes are summed in float32 (n terms: at most gamma(n - 1) below the exact sum, all
    # terms being positive), then raised by 1 / (1 - gamma(n)) to stay an upper bound.
    terms = tf.math.unsorted_segment_sum(tf.ones_like(slices.indices, tf.float64), position, count)
    magnitude = tf.math.unsorted_segment_sum(tf.abs(slices.values), position, count)
    unit = float(np.finfo(slices.values.dtype.as_numpy_dtype).eps) / 2

    def on_touched(dense: Any) -> tuple[Any, Any]:
        rows = tf.gather(dense, touched)
        elsewhere = tf.math.count_nonzero(dense, dtype=tf.int64) - tf.math.count_nonzero(rows, dtype=tf.int64)
        return rows, elsewhere

    def emit(a: Any, b: Any, elsewhere: Any, n: Any, total: Any, against: str) -> list[Any]:
        a, b, n = np.asarray(a, "float64"), np.asarray(b, "float64"), np.asarray(n)
        total = np.asarray(total, "float64") / np.maximum(1 - gamma(n, unit), unit).reshape((-1,) + (1,) * (a.ndim - 1))
        diff = abs(a - b)
        scale = float(abs(a).max(initial=0.0))
        record = base.copy()
        record["step"], record["against"], record["scale"] = tracer.step, against, scale
        record["max_abs_diff"] = float(diff.max(initial=0.0))
        record["max_rel_diff"] = float(diff.max(initial=0.0)) / scale if scale else 0.0
        record["rows_compared"] = int(a.shape[0])
        outside = int(np.asarray(elsewhere))
        if outside:
            # Elements no rank looked up, yet nonzero in this reduction: no summation order explains it.
            record["max_abs_diff"] = record["max_rel_diff"] = float("inf")
            record["nonzero_elsewhere"] = outside
        if against == "dedup" or record.get("compression") in (None, "NoneCompressor"):
            record["rounding_bound_ratio"] = (float("inf") if outside else
                                              rounding_bound_ratio(diff, a, n, total, unit))
            record["terms_max"] = int(n.max(initial=0))
        writer.add(record)
        return []

    for other, against in others:
        rows, elsewhere = on_touched(other)
        if tf.executing_eagerly():
            emit(gathered, rows, elsewhere, terms, magnitude, against)
        else:
            host_call(lambda a, b, e, n, total, against=against: emit(a, b, e, n, total, against),
                      [gathered, rows, elsewhere, terms, magnitude], name="memdiag_reduction_check")
