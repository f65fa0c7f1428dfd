"""Parameters are read where they can be read: eagerly, or through a TF1 graph's session; never raising."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from memdiag.agent.parameters import ParameterCapture, digest, digest_and_save


def capture() -> tuple[ParameterCapture, list[tuple[str, BaseException]]]:
    failures: list[tuple[str, BaseException]] = []
    return ParameterCapture(lambda what, exc: failures.append((what, exc))), failures


def test_eager_variables_are_read_at_once_and_at_the_end():
    params, failures = capture()
    a = tf.Variable([1.0, 2.0], name="a")
    params.add("a:0", a)
    initial: list[dict] = []
    params.initial(lambda values: initial.append(dict(values)))
    a.assign([5.0, 6.0])
    assert [list(v) for v in initial[0].values()] == [[1.0, 2.0]]
    np.testing.assert_array_equal(params.final()["a:0"], [5.0, 6.0])
    assert not failures


def test_an_eager_variable_is_read_at_the_end_after_the_scripts_references_are_gone():
    params, _ = capture()

    def script() -> None:
        table = tf.Variable([[1.0, 2.0]], name="table")
        params.add("table:0", table)
        table.assign([[3.0, 4.0]])

    script()
    np.testing.assert_array_equal(params.final()["table:0"], [[3.0, 4.0]])


def test_a_graphs_variables_are_read_through_its_session_after_initialisation_and_at_close():
    params, failures = capture()
    initial: list[dict] = []
    try:
        with tf.Graph().as_default():
            v = tf.compat.v1.get_variable("v", [3], initializer=tf.compat.v1.ones_initializer())
            params.add("v:0", v)
            params.initial(lambda values: initial.append(dict(values)))
            assert initial == []  # not initialized yet: nothing to read before a session runs
            step = v.assign_add(tf.ones([3]))
            with tf.compat.v1.Session() as session:
                session.run(tf.compat.v1.global_variables_initializer())
                session.run(step)
                session.run(step)
        # GIVEN the graph is gone, THEN its values are those its session left, and nothing raised
        [first] = initial
        np.testing.assert_array_equal(first["v:0"], [1.0, 1.0, 1.0])
        np.testing.assert_array_equal(params.final()["v:0"], [3.0, 3.0, 3.0])
        assert not failures
    finally:
        params.uninstall()
    # the session's methods are TensorFlow's own again
    from tensorflow.python.client import session as tf_session

    assert not hasattr(tf_session.BaseSession.run, "__wrapped__")


def test_a_variable_no_session_initialized_is_left_out_without_an_error():
    params, failures = capture()
    try:
        with tf.Graph().as_default():
            v = tf.compat.v1.get_variable("never", [2])
            params.add("never:0", v)
            with tf.compat.v1.Session():
                pass
        assert params.final() == {} and len(params) == 1
        assert not failures
    finally:
        params.uninstall()


def test_the_digest_is_exact_and_in_name_order():
    one = {"b": np.array([1.0], np.float32), "a": np.array([2.0], np.float32)}
    other = {"a": np.array([2.0], np.float32), "b": np.array([1.0], np.float32)}
    assert digest(one) == digest(other)
    assert digest({**one, "b": np.array([1.0000001], np.float32)}) != digest(one)
    assert digest({}) is None


def test_values_are_hashed_and_saved_one_at_a_time_as_digest_and_save_give_them(tmp_path):
    # GIVEN three variables' values, read lazily as the saver reaches each
    from memdiag.analyze.verify import load_parameters

    arrays = {"a:0": np.arange(6, dtype=np.float32).reshape(2, 3), "b:0": np.float32(7.0),
              "c:0": np.ones([4], dtype=np.int64)}
    alive: list[int] = []
    import weakref

    def lazily():
        refs = []
        for name in sorted(arrays):
            alive.append(sum(ref() is not None for ref in refs))  # earlier copies still held when this is read
            value = np.array(arrays[name])  # a copy of its own, as a variable's read is
            refs.append(weakref.ref(value))
            yield name, value
            del value

    path = tmp_path / "params.npz"
    got, count = digest_and_save(str(path), lazily())
    # THEN no earlier value is held when the next is read
    assert alive == [0, 0, 0]
    # AND the digest is the one of all the values at once, the file holds them all under their names
    assert (got, count) == (digest({k: np.asarray(v) for k, v in arrays.items()}), 3)
    loaded = load_parameters(str(path))
    assert sorted(loaded) == ["a:0", "b:0", "c:0"]
    np.testing.assert_array_equal(loaded["a:0"], arrays["a:0"])
    np.testing.assert_array_equal(loaded["b:0"], arrays["b:0"])
    # AND with no values, no digest and no file
    assert digest_and_save(str(tmp_path / "none.npz"), iter([])) == (None, 0)
    assert not (tmp_path / "none.npz").exists()


def test_a_scalar_variable_is_saved_with_its_shape(tmp_path):
    from memdiag.analyze.verify import load_parameters

    path = tmp_path / "scalar.npz"
    digest_and_save(str(path), iter([("step:0", np.int64(3)), ("w:0", np.ones([2], np.float32))]))
    assert {name: value.shape for name, value in load_parameters(str(path)).items()} == {"step:0": (), "w:0": (2,)}


def _traced_peak(read) -> int:
    """The most memory Python and NumPy allocated (tracemalloc, which counts NumPy's array data) while
    ``read()`` ran, above where it began."""
    import tracemalloc

    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        read()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak - before


def test_reading_hashing_and_saving_the_parameters_copies_no_value(tmp_path):
    # GIVEN a 16 MiB variable (a copy of its value would be 16 MiB of NumPy data)
    import hashlib

    from memdiag.workloads import loop

    table = tf.Variable(tf.random.uniform([4096, 1024], seed=1), name="table")
    expected = hashlib.blake2b(table.numpy().tobytes(), digest_size=16).hexdigest()
    params, failures = capture()
    params.add("table:0", table)
    # WHEN the built-in loop's digest, the agent's read-hash-and-save and the final save read it
    digests: list[str] = []
    peaks = {
        "digest": _traced_peak(lambda: digests.append(loop.parameter_digest([table]))),
        "read, hash and save": _traced_peak(lambda: digest_and_save(str(tmp_path / "a.npz"), params.each_eager())),
        "save": _traced_peak(lambda: loop.save_parameters(str(tmp_path / "b.npz"), [table])),
    }
    # THEN none of them copies the value (a few KiB of bookkeeping, not 16 MiB), and the bytes are the value's
    assert all(peak < 1 << 20 for peak in peaks.values()), peaks
    assert digests == [expected] and not failures
    for name in ("a.npz", "b.npz"):
        with np.load(tmp_path / name) as saved:
            np.testing.assert_array_equal(saved[saved.files[0]], table.numpy())


def test_a_value_read_without_a_copy_is_the_value_when_read_and_the_variable_still_trains():
    from memdiag.workloads.loop import value_view

    v = tf.Variable([1.0, 2.0, 3.0])
    view = value_view(v)
    v.assign_add([1.0, 1.0, 1.0])  # the job's update while the view is held
    np.testing.assert_array_equal(view, [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(value_view(v), [2.0, 3.0, 4.0])
    np.testing.assert_array_equal(v.numpy(), [2.0, 3.0, 4.0])
