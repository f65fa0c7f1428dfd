"""The comparison both engines' reduction checks share (reduction_check.compare_reduced), eagerly:
a gathered IndexedSlices against dense results of the same rows."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from memdiag.agent import reduction_check


class _Writer:
    def __init__(self) -> None:
        self.records: list[dict] = []

    def add(self, record: dict) -> None:
        self.records.append(record)


class _Tracer:
    step = 0

    def __init__(self) -> None:
        self.writer = _Writer()


def _check(others):
    tracer = _Tracer()
    rng = np.random.default_rng(3)
    # two workers' rows of a 10 x 4 table, every worker's rows gathered (indices repeat across workers)
    values = tf.constant(rng.normal(size=(6, 4)).astype(np.float32))
    indices = tf.constant([1, 3, 3, 1, 7, 3], tf.int32)
    slices = tf.IndexedSlices(values, indices, tf.constant([10, 4]))
    dense = tf.convert_to_tensor(slices)
    base = {"type": "reduction_check", "name": "emb", "reduce_op": "sum", "compression": None}
    reduction_check.compare_reduced(tracer, base, slices, [(f(dense), against) for f, against in others])
    return tracer.writer.records


def test_the_same_rows_summed_densely_are_within_rounding():
    [record] = _check([(lambda d: d, "dense")])
    assert record["rounding_bound_ratio"] <= 1 and record["terms_max"] == 3 and record["rows_compared"] == 3
    assert record["against"] == "dense" and record["reduce_op"] == "sum"


def test_a_dense_result_twice_the_sum_fails_and_a_row_nobody_looked_up_fails_outright():
    twice, elsewhere = _check([(lambda d: d * 2, "dense"),
                               (lambda d: tf.tensor_scatter_nd_update(d, [[0]], [[1.0, 0, 0, 0]]), "dedup")])
    assert twice["rounding_bound_ratio"] > 1e3 and 0.99 < twice["max_rel_diff"] < 1.01
    assert elsewhere["nonzero_elsewhere"] == 1 and elsewhere["rounding_bound_ratio"] == float("inf")
