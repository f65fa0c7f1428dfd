"""What the optimizer takes for a gradient auto kept gathered (memdiag.optimizer_input): dense where the
optimizer's class is one whose sparse update was measured to hold more, as gathered rows otherwise."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from memdiag import optimizer_input
from memdiag.densify import DensifyPolicy
from memdiag.optimizer_input import DENSE_UPDATE, OptimizerInput, dense_update


@pytest.fixture()
def hand():
    hand = OptimizerInput()
    yield hand
    hand.uninstall()


def _rows(table: tf.Variable, ids: list[int]) -> tf.IndexedSlices:
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.gather(table, ids) * 2.0)
    grad = tape.gradient(loss, table)
    assert isinstance(grad, tf.IndexedSlices)
    return grad


def _apply_in_graph(opt, pairs) -> None:
    """``opt.apply_gradients(pairs)`` built inside a tf.function (the gradients passed in as its inputs)."""
    grads = [g for g, _ in pairs]
    variables = [v for _, v in pairs]

    @tf.function
    def step(*flat):
        opt.apply_gradients(zip(list(flat), variables))

    step(*grads)


def _spy(base: type) -> tuple[type, list[type]]:
    """A subclass of ``base`` (as Horovod's DistributedOptimizer is one of the script's optimizer) that
    records the type of each gradient its update takes (a tf.function that makes the optimizer's slots
    is traced twice: each trace records)."""
    seen: list[type] = []

    def update_step(self, gradient, variable, *args):
        seen.append(type(gradient))
        return base.update_step(self, gradient, variable, *args)

    return type(base.__name__, (base,), {"update_step": update_step}), seen


def test_the_table_names_keras_adam_and_not_adagrad():
    # measured (probes/optimizer_update_peak.py): Adam's sparse update rises above its dense one; Adagrad's
    # sparse update is a scatter of the rows only, so it stays out of the table
    assert dense_update(tf.keras.optimizers.Adam()) == "Adam"
    assert dense_update(tf.keras.optimizers.Adagrad()) is None
    assert ("keras.src.optimizers.adam", "Adam") in DENSE_UPDATE


def test_the_table_is_by_how_the_update_is_called():
    # eagerly, Keras's Adam held less with the rows (oneDNN off); the legacy Adam more, both ways
    assert dense_update(tf.keras.optimizers.Adam(), eager=True) is None
    assert dense_update(tf.keras.optimizers.legacy.Adam(), eager=True) == "Adam"
    assert dense_update(tf.keras.optimizers.legacy.Adam(), eager=False) == "Adam"


def test_keras_sgd_is_handed_dense_without_momentum_only():
    # one class: without momentum its graph update scales a table-sized slot (measured); with 0.9, noise
    assert dense_update(tf.keras.optimizers.SGD(0.1)) == "SGD"
    assert dense_update(tf.keras.optimizers.SGD(0.1, momentum=0.9)) is None


def test_a_subclass_counts_as_its_measured_class():
    subclass = type("Adam", (tf.keras.optimizers.Adam,), {})  # as hvd.DistributedOptimizer makes one
    assert dense_update(subclass()) == "Adam"


def test_a_kept_variable_reaches_adam_dense_and_others_as_rows(hand):
    table = tf.Variable(tf.ones([50, 4]), name="kept")
    other = tf.Variable(tf.ones([50, 4]), name="other")
    told = []
    hand.keep(table, "kept", lambda name, by: told.append((name, by)))
    spy, seen = _spy(tf.keras.optimizers.Adam)
    opt = spy(0.1)
    _apply_in_graph(opt, [(_rows(table, [1, 3, 3]), table), (_rows(other, [2]), other)])
    kinds = [issubclass(t, tf.IndexedSlices) for t in seen]
    # per trace, in the order of the variables: the kept one dense, the other IndexedSlices
    assert kinds and kinds == [False, True] * (len(kinds) // 2)
    assert told == [("kept", "Adam")]
    _apply_in_graph(opt, [(_rows(table, [4]), table)])
    assert told == [("kept", "Adam")]  # said once per variable


def test_an_eager_update_takes_the_rows(hand):
    # run eagerly, op by op, Adam's update with the rows held less than with a dense gradient (measured)
    table = tf.Variable(tf.ones([50, 4]), name="kept")
    told = []
    hand.keep(table, "kept", lambda name, by: told.append((name, by)))
    spy, seen = _spy(tf.keras.optimizers.Adam)
    spy(0.1).apply_gradients([(_rows(table, [1, 3]), table)])
    assert len(seen) == 1 and issubclass(seen[0], tf.IndexedSlices) and told == []


def test_an_optimizer_outside_the_table_takes_the_rows(hand):
    table = tf.Variable(tf.ones([50, 4]))
    hand.keep(table, "kept")
    spy, seen = _spy(tf.keras.optimizers.Adagrad)
    _apply_in_graph(spy(0.1), [(_rows(table, [1, 2]), table)])
    assert seen and all(issubclass(t, tf.IndexedSlices) for t in seen)


def test_dense_to_adam_updates_as_a_dense_gradient_does(hand):
    # the expected values come from TensorFlow itself: the same Adam step with the gradient made dense by hand
    start = np.random.default_rng(3).normal(size=(20, 3)).astype(np.float32)
    kept, by_hand = tf.Variable(start), tf.Variable(start)
    hand.keep(kept, "kept")
    _apply_in_graph(tf.keras.optimizers.Adam(0.1), [(_rows(kept, [0, 5, 5]), kept)])
    _apply_in_graph(tf.keras.optimizers.Adam(0.1), [(tf.convert_to_tensor(_rows(by_hand, [0, 5, 5])), by_hand)])
    np.testing.assert_array_equal(kept.numpy(), by_hand.numpy())
    assert not np.array_equal(kept.numpy(), start)


def test_uninstall_gives_back_keras_apply_gradients(hand):
    before = vars(tf.keras.optimizers.Optimizer)["apply_gradients"]
    hand.keep(tf.Variable(tf.ones([3, 2])), "kept")
    assert vars(tf.keras.optimizers.Optimizer)["apply_gradients"] is not before
    hand.uninstall()
    assert vars(tf.keras.optimizers.Optimizer)["apply_gradients"] is before
    assert vars(tf.keras.optimizers.legacy.Optimizer)["apply_gradients"].__name__ == "apply_gradients"
    assert not getattr(vars(tf.keras.optimizers.legacy.Optimizer)["apply_gradients"], "__memdiag__", False)


def _policy(mode: str, told: list) -> DensifyPolicy:
    return DensifyPolicy(mode, 1.0, lambda: 2, on_decision=told.append,
                         agree=lambda key, values, process_set: [values, values])


def test_auto_keeps_a_small_gather_and_adam_takes_it_dense():
    told: list = []
    policy = _policy("auto", told)
    table = tf.Variable(tf.ones([10_000, 8]), name="items")
    try:
        [grad] = policy.apply([_rows(table, [1, 2, 3])], [table])
        assert isinstance(grad, tf.IndexedSlices)  # 3 rows x 2 ranks gathered, far below the table
        _apply_in_graph(tf.keras.optimizers.Adam(0.1), [(grad, table)])
    finally:
        optimizer_input.shared().uninstall()
    assert [d.reduction for d in told] == ["sparse", "sparse"]
    assert told[0].dense_update_by is None and told[1].dense_update_by == "Adam"
    assert "before Adam's update" in told[1].reason
    assert told[1].as_record()["optimizer_input"] == "dense" and "optimizer_input" not in told[0].as_record()


@pytest.mark.parametrize("mode", ["sparse", "dedup"])
def test_fixed_modes_leave_the_optimizer_its_rows(mode):
    told: list = []
    policy = _policy(mode, told)
    table = tf.Variable(tf.ones([10_000, 8]), name="items")
    spy, seen = _spy(tf.keras.optimizers.Adam)
    try:
        [grad] = policy.apply([_rows(table, [1, 2, 3])], [table])
        _apply_in_graph(spy(0.1), [(grad, table)])
    finally:
        optimizer_input.shared().uninstall()
    assert len(told) == 1 and told[0].dense_update_by is None
    assert issubclass(seen[0], tf.IndexedSlices)


def test_a_legacy_adam_takes_a_kept_variable_dense(hand):
    table = tf.Variable(tf.ones([50, 4]))
    hand.keep(table, "kept")
    seen: list[str] = []
    base = tf.keras.optimizers.legacy.Adam

    class Spy(base):  # type: ignore[misc, valid-type]
        def _resource_apply_dense(self, grad, var, apply_state=None):
            seen.append("dense")
            return super()._resource_apply_dense(grad, var, apply_state)

        def _resource_apply_sparse(self, grad, var, indices, apply_state=None):
            seen.append("sparse")
            return super()._resource_apply_sparse(grad, var, indices, apply_state)

    _apply_in_graph(Spy(0.1), [(_rows(table, [1, 2]), table)])
    assert seen and set(seen) == {"dense"}
    seen.clear()
    Spy(0.1).apply_gradients([(_rows(table, [3]), table)])  # eagerly too: measured to hold more both ways
    assert seen == ["dense"]
