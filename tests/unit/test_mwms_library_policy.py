"""memdiag.tensorflow's policy for MultiWorkerMirroredStrategy (densify_gradients / MirroredPolicy): the
decision from every worker's rows, with a stand-in for the agreement (the coordination service's
key-value store in a real job). Figures worked out by hand: rows 1000 + 500 x worker of a 5000 x 256
float32 table, int32 indices, 1028 B a row gathered; the table is 5000 x 1024 = 5,120,000 B dense."""

from __future__ import annotations

import pytest

tf = pytest.importorskip("tensorflow")

import memdiag.tensorflow as mdt  # noqa: E402

ROWS = {2: [1000, 1500], 4: [1000, 1500, 2000, 2500]}


def _policy(mode, world, rows, margin=1.0):
    calls = []

    def agree(key, local):
        calls.append((key, local))
        return rows

    return mdt.MirroredPolicy(mode, margin, agree=agree, num_replicas=world), calls


def _table():
    return tf.Variable(tf.zeros([5000, 256]), name="embeddings")


def _gradient(rows):
    return tf.IndexedSlices(tf.ones([rows, 256]), tf.zeros([rows], tf.int32), tf.constant([5000, 256]))


@pytest.mark.parametrize("world, densify, gathered, padding", [
    (2, False, 2 * 1500 * 1028, (3000 - 2500) * 1028),    # 3,084,000 <= 5,120,000: keep the gather
    (4, True, 4 * 2500 * 1028, (10000 - 7000) * 1028),    # 10,280,000 > 5,120,000: densify
])
def test_auto_compares_the_padded_gather_of_the_longest_worker_with_the_dense_table(world, densify, gathered,
                                                                                    padding):
    table = _table()
    for local in ROWS[world]:  # every worker, from the same agreed list, decides alike
        policy, calls = _policy("auto", world, ROWS[world])
        [out] = policy.apply([_gradient(local)], [table])
        decision = policy.decisions["embeddings:0"]
        assert decision.densify is densify and isinstance(out, tf.IndexedSlices) is not densify
        assert decision.gathered_bytes == gathered and decision.padding_bytes == padding
        assert decision.dense_bytes == 5_120_000 and decision.local_rows == local
        assert decision.rows_per_worker == tuple(ROWS[world]) and decision.engine == "tf-distribute"
        assert decision.reason.startswith("auto: padded gather") and "dense all-reduce" in decision.reason
        assert [local for _, local in calls] == [local] and "embeddings:0" in calls[0][0]
        # decided once for the whole job: a second step (or a retrace) agrees nothing again
        policy.apply([_gradient(local)], [table])
        assert len(calls) == 1 and policy.decisions["embeddings:0"] is decision


def test_a_densified_table_is_the_dense_sum_of_its_rows_and_other_gradients_pass_unchanged():
    policy, _ = _policy("auto", 4, ROWS[4])
    grad = tf.IndexedSlices(tf.ones([3, 256]), tf.constant([7, 7, 9]), tf.constant([5000, 256]))
    head = tf.ones([256, 1])
    dense, same, none = policy.apply([grad, head, None], [_table(), tf.Variable(head), tf.Variable(1.0)])
    assert dense.shape == (5000, 256) and float(dense[7, 0]) == 2.0 and float(tf.reduce_sum(dense)) == 3 * 256
    assert same is head and none is None


def test_a_margin_keeps_the_gather_until_it_exceeds_dense_by_that_factor():
    policy, _ = _policy("auto", 4, ROWS[4], margin=2.1)  # 10,280,000 <= 2.1 x 5,120,000 = 10,752,000
    policy.apply([_gradient(1000)], [_table()])
    assert not policy.decisions["embeddings:0"].densify and "x 2.1" in policy.decisions["embeddings:0"].reason


def test_rows_unknown_when_traced_are_refused_alike_on_every_worker_after_all_took_part():
    policy, calls = _policy("auto", 2, [-1, 1500])
    table = _table()

    @tf.function(input_signature=[tf.TensorSpec([None, 256]), tf.TensorSpec([None], tf.int32)])
    def step(values, indices):
        return policy.apply([tf.IndexedSlices(values, indices, tf.constant([5000, 256]))], [table])

    with pytest.raises(ValueError, match=r"unknown when the step is traced \(workers \[0\]\).*input_signature"):
        step.get_concrete_function()
    assert [local for _, local in calls] == [-1]  # it published, so that the other worker did not wait alone


def test_dense_and_sparse_need_no_agreement():
    for mode in ("dense", "sparse"):
        policy, calls = _policy(mode, 4, ROWS[4])
        [out] = policy.apply([_gradient(1000)], [_table()])
        assert calls == [] and isinstance(out, tf.IndexedSlices) is (mode == "sparse")
        assert "MultiWorkerMirroredStrategy" in policy.decisions["embeddings:0"].reason


def test_one_replica_keeps_the_indexed_slices_without_agreeing():
    policy, calls = _policy("auto", 1, [1000])
    [out] = policy.apply([_gradient(1000)], [_table()])
    assert calls == [] and isinstance(out, tf.IndexedSlices)


def test_bad_calls_get_a_message_that_says_what_to_do():
    with pytest.raises(ValueError, match="choose one of sparse, dense, auto"):
        mdt.densify_gradients([], [], mode="dedup")
    with pytest.raises(ValueError, match="one replica per worker"):
        _policy("auto", 4, [1000, 1500])[0].apply([_gradient(1000)], [_table()])
    # no MultiWorkerMirroredStrategy: the default strategy has no cluster and no coordination service
    with pytest.raises(ValueError, match="coordination service"):
        mdt.agree_rows_coordination("memdiag/test", 1000)


def test_the_one_call_function_keeps_one_policy_per_mode_and_margin():
    assert mdt.mirrored_policy("auto", 1.0) is mdt.mirrored_policy("auto", 1)
    assert mdt.mirrored_policy("auto", 2.0) is not mdt.mirrored_policy("auto", 1.0)
