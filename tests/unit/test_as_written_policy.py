"""The job as written: decisions follow the script unless a mode overrides it; auto agrees across ranks."""

from __future__ import annotations

import pytest

from memdiag.agent.sampler import MAX_SAMPLES_PER_STEP, MemorySampler
from memdiag.format.layout import decimate
from memdiag.formula import SparseGradientShape
from memdiag.policy import decide

SHAPE = SparseGradientShape(rows_per_rank=4096, row_bytes=512, index_bytes=8, dense_rows=2048)


@pytest.mark.parametrize("asked", [False, True])
def test_as_written_does_what_the_script_asked_and_overrides_nothing(asked):
    d = decide("as-written", "emb", 4, SHAPE, script_densifies=asked)
    assert d.densify is asked and not d.overridden
    assert f"sparse_as_dense={asked}" in d.reason


def test_an_explicit_mode_that_differs_from_the_script_is_marked_overridden():
    d = decide("sparse", "emb", 4, SHAPE, script_densifies=True)
    assert not d.densify and d.overridden
    assert "the script asked for sparse_as_dense=True" in d.reason
    assert d.as_record()["overridden"] is True and d.as_record()["script_sparse_as_dense"] is True


def test_auto_without_known_rows_keeps_the_scripts_choice():
    assert decide("auto", "emb", 4, None, script_densifies=True).densify
    assert not decide("auto", "emb", 4, None, script_densifies=False).densify


def _slices(rows: int, width: int = 8, vocab: int = 64):
    tf = pytest.importorskip("tensorflow")
    return tf.IndexedSlices(tf.zeros([rows, width]), tf.zeros([rows], tf.int32), tf.constant([vocab, width]))


class _Ranks:
    """Stands in for the exchange across ranks (DensifyPolicy's ``agree``): every rank's row count is
    known to the test, and each is taken to have no duplicate rows (distinct rows = rows)."""

    def __init__(self, rows_of_every_rank: list[int]) -> None:
        self.rows = rows_of_every_rank
        self.calls: list[tuple[tuple[int, ...], str]] = []

    def __call__(self, key: str, values: tuple[int, ...], process_set) -> list[tuple[int, ...]]:
        self.calls.append((values, key))
        return [(rows, rows) for rows in self.rows]


def test_auto_decides_from_the_largest_row_count_of_any_rank_and_only_once():
    from memdiag.densify import DensifyPolicy

    # GIVEN two ranks straddling the crossover: 64 x 8 floats dense = 2048 B;
    # gathered at N=2: 2 x rows x (32 + 4) B -> 28 rows gather 2016 B (sparse), 29 rows 2088 B (dense)
    ranks = _Ranks([28, 29])
    policies = [DensifyPolicy("auto", 1.0, lambda: 2, agree=ranks) for _ in range(2)]
    # WHEN each rank decides from its own gradient
    decisions = [policy.decide("emb", _slices(rows)) for policy, rows in zip(policies, (28, 29))]
    # THEN both take the dense path, from the agreed 29 rows, whatever their own count
    assert [d.densify for d in decisions] == [True, True]
    assert [d.shape.rows_per_rank for d in decisions] == [29, 29]
    assert [d.local_rows for d in decisions] == [28, 29]
    # AND a later step (other rows) reuses the decision without a new agreement
    assert policies[0].decide("emb", _slices(5)).densify
    assert [name for _, name in ranks.calls] == ["rows/emb"] * 2  # rows and distinct rows: one exchange


def test_reduction_order_follows_horovods_groups_rule():
    from memdiag.agent.naming import reduction_order

    class Var:
        def __init__(self, name):
            self.name = name

    a, b, c, d = (Var(n) for n in "abcd")
    grads = ["ga", None, "gc", "gd"]
    assert reduction_order(grads, [a, b, c, d], None) == [0, 2, 3]
    assert reduction_order(grads, [a, b, c, d], 2) == [0, 2, 3]
    # groups of variables: those groups first, in their order, then the rest in variable order
    assert reduction_order(grads, [a, b, c, d], [[d, b], [c]]) == [3, 2, 0]


def test_the_sampler_keeps_a_bounded_series_and_never_loses_the_peak():
    times = [float(i) for i in range(9)]
    rss = [1, 5, 2, 2, 9, 3, 0, 4, 7]
    kept_t, kept_r = decimate(times, rss)
    assert kept_r == [5, 2, 9, 4, 7] and kept_t == [1.0, 2.0, 4.0, 7.0, 8.0]
    sampler = MemorySampler()
    for _ in range(3 * MAX_SAMPLES_PER_STEP):
        sampler.sample()
    peak, series_t, series_r = sampler.take_step()
    assert len(series_r) <= MAX_SAMPLES_PER_STEP + 1 and peak == max(series_r)


def test_ranks_that_list_the_same_sparse_gradients_in_other_orders_decide_alike():
    from memdiag.densify import DensifyPolicy
    from tests.helpers import run_ranks

    # GIVEN two tables whose gradients the ranks list in opposite orders; rank r looks up 20 + 30 r rows
    # of each (64 x 8 float32 tables, int32 indices: 36 B a gathered row; dense 2048 B)
    def slices(rows):
        tf = pytest.importorskip("tensorflow")
        return tf.IndexedSlices(tf.ones([rows, 8]), tf.range(rows), tf.constant([64, 8]))

    def decide(rank, agreement):
        policy = DensifyPolicy("auto", 1.0, lambda: 2, agree=lambda key, values, ps: agreement.gather(key, values))
        items = [(name, slices(20 + 30 * rank), None) for name in ("a", "b")]
        policy.decide_in_name_order(items if rank == 0 else items[::-1])
        return {name: (d.reduction, d.shape.rows_per_rank, d.local_rows) for name, d in policy.decisions.items()}, \
            agreement.keys

    results, _ = run_ranks(2, decide)
    # THEN no error and the same decisions on both ranks, from the larger rank's 50 rows (2 x 50 x 36 = 3600 B
    # gathered > 2048 B dense), each rank's own rows kept beside them
    assert not any(isinstance(r, Exception) for r in results), results
    (mine0, keys0), (mine1, keys1) = results
    assert keys0 == keys1 == ["rows/a", "rows/b"]
    assert mine0 == {"a": ("dense", 50, 20), "b": ("dense", 50, 20)}
    assert mine1 == {"a": ("dense", 50, 50), "b": ("dense", 50, 50)}


@pytest.mark.parametrize("op", ["adasum", "min", "max", "product"])
def test_auto_densifies_under_an_op_horovod_cannot_gather_whatever_the_sizes(op):
    # GIVEN a gradient whose allgather would be far smaller than its dense table: 2 x 10 x 36 B << 64 x 8 x 4 B
    shape = SparseGradientShape(rows_per_rank=10, row_bytes=32, index_bytes=4, dense_rows=64, row_elements=8)
    assert decide("auto", "emb", 2, shape).reduction == "sparse"
    assert decide("auto", "emb", 2, shape, reduce_op="sum").reduction == "sparse"
    # WHEN the script reduces with an op for which Horovod has no allgather path (it raises for IndexedSlices)
    decision = decide("auto", "emb", 2, shape, reduce_op=op)
    # THEN auto densifies and says why; an explicit mode is the user's to choose
    assert decision.reduction == "dense" and f"op {op} has no allgather path" in decision.reason
    assert decide("sparse", "emb", 2, shape, reduce_op=op).reduction == "sparse"


def test_under_such_an_op_auto_asks_the_other_ranks_nothing():
    tf = pytest.importorskip("tensorflow")
    from memdiag.densify import DensifyPolicy

    def agree(key, values, process_set):
        raise AssertionError("no agreement is needed: the op decides")

    policy = DensifyPolicy("auto", 1.0, lambda: 2, agree=agree)
    grad = tf.IndexedSlices(tf.zeros([10, 8]), tf.zeros([10], tf.int32), tf.constant([64, 8]))
    assert policy.decide("emb", grad, reduce_op="adasum").reduction == "dense"
