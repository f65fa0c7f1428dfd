"""Merging duplicate rows before the allgather: sums equal indices, keeps the dense result."""

from __future__ import annotations

import pytest

tf = pytest.importorskip("tensorflow")


def _grad():
    # rows for indices 3, 1, 3, 3, 0 of a 5 x 2 table
    values = tf.constant([[1.0, 2.0], [10.0, 20.0], [100.0, 200.0], [1000.0, 2000.0], [5.0, 6.0]])
    return tf.IndexedSlices(values, tf.constant([3, 1, 3, 3, 0]), tf.constant([5, 2]))


def test_duplicates_are_summed_into_one_row_per_distinct_index():
    from memdiag.densify import distinct_rows, merge_duplicates

    merged = merge_duplicates(_grad())
    # order of first appearance: 3, 1, 0; index 3 sums 1 + 100 + 1000 and 2 + 200 + 2000
    assert merged.indices.numpy().tolist() == [3, 1, 0]
    assert merged.values.numpy().tolist() == [[1101.0, 2202.0], [10.0, 20.0], [5.0, 6.0]]
    assert int(distinct_rows(_grad().indices)) == 3
    # the same dense gradient, hence the same update
    assert tf.convert_to_tensor(merged).numpy().tolist() == tf.convert_to_tensor(_grad()).numpy().tolist()


def test_the_injected_fault_keeps_the_first_row_and_changes_the_gradient():
    from memdiag.densify import merge_duplicates

    dropped = merge_duplicates(_grad(), drop=True)
    assert dropped.indices.numpy().tolist() == [3, 1, 0]
    assert dropped.values.numpy().tolist() == [[1.0, 2.0], [10.0, 20.0], [5.0, 6.0]]


def test_the_policy_merges_in_mode_dedup_and_records_u():
    from memdiag.densify import DensifyPolicy

    policy = DensifyPolicy("dedup", 1.0, lambda: 2)
    [out] = policy.apply([_grad()], None)
    assert out.indices.numpy().tolist() == [3, 1, 0]
    d = policy.decisions["grad_0"]
    assert d.reduction == "dedup" and d.local_distinct_rows == 3 and d.shape.distinct_rows == 3
