"""The native mark on a collective's path in a TF1 graph (MemdiagMarkThrough): a session runs only what it
fetches, so a collective's end was a mark beside the output, an Identity that waited for it, and a Shape
op for each shape not known when the graph was built. One op now hands the outputs on and reads their
shapes itself; the records, the values and the gradients are what they were."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from memdiag import nativemarks
from memdiag.agent.naming import Origin
from memdiag.agent.sampler import MemorySampler
from memdiag.agent.tracer import Tracer
from memdiag.format.writer import RecordWriter
from tests.helpers import native_marks, read_records

tf = pytest.importorskip("tensorflow")


@pytest.fixture(scope="module")
def marks(tmp_path_factory) -> nativemarks.Marks:
    return native_marks(tmp_path_factory)


class _NoThrough:
    """The native marks of a library built before it had the mark that hands tensors on."""

    through = False

    def __init__(self, marks: nativemarks.Marks) -> None:
        self._marks = marks

    def __getattr__(self, name: str):
        return getattr(self._marks, name)


def _hooks(tracer: Tracer, native):
    from memdiag.agent.hooks import CollectiveHooks

    hooks = CollectiveHooks(tracer, "as-written", 1.0, lambda: 2, lambda d: None)
    if native is not None:
        hooks.use_native(native)
    return hooks


def _graph(hooks, grouped: bool):
    """A TF1 graph of stand-ins for collectives (an identity each, ``* 3`` for a grouped op's, as the
    op-level wrappers put memdiag's begin and record around Horovod's op): one on a placeholder whose rows
    are known only when the session runs, and, with ``grouped``, one op of two tensors of known shapes.
    Returns the graph, the placeholder, the loss, and the gradient of the loss by the placeholder."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 8])
        tensor = x * 2.0
        origin = Origin("grad_rows", gradient=True, reduce_op="average")
        if hooks is None:
            output = tf.identity(tensor)
        else:
            with tf.control_dependencies(hooks._begin("allreduce", [(origin, tensor)])):
                output = tf.identity(tensor)
            output = hooks._record("allreduce", origin, tensor, output, grouped=False)
        loss = tf.reduce_sum(output * output)
        if grouped:
            pair = [tf.ones([4, 3]) * tf.reduce_mean(x), tf.ones([5])]
            origins = [Origin("pair_0", gradient=True), Origin("pair_1", gradient=True)]
            if hooks is None:
                outputs = [t * 3.0 for t in pair]
            else:
                with tf.control_dependencies(hooks._begin("allreduce", list(zip(origins, pair)))):
                    outputs = [t * 3.0 for t in pair]
                outputs = hooks._record_all("allreduce", origins, pair, outputs)
            loss += tf.add_n([tf.reduce_sum(t) for t in outputs])
        [gradient] = tf.gradients(loss, x)
    return graph, x, loss, gradient


def _steps(graph, x, loss, gradient) -> list[tuple[float, float]]:
    """Three session runs of 2, 3 and 5 rows: each one's loss and gradient sum."""
    values = []
    with tf.compat.v1.Session(graph=graph) as session:
        for rows in (2, 3, 5):
            batch = np.arange(rows * 8, dtype=np.float32).reshape(rows, 8)
            got_loss, got_gradient = session.run([loss, gradient], {x: batch})
            values.append((float(got_loss), float(np.sum(got_gradient))))
    return values


def _run(tmp_path: Path, name: str, native, grouped: bool = True) -> tuple[list[dict], list, Counter, int]:
    """The graph traced by memdiag's hooks (``native``: the marks, None: Python calls) and run for three
    steps of 2, 3 and 5 rows: the records, each step's loss and gradient sum, the op types memdiag added
    (against the same graph built without the hooks), and the mark ops made."""
    writer = RecordWriter(str(tmp_path / f"{name}.jsonl"), 0)
    tracer = Tracer(writer, MemorySampler(0.005), rank=0, auto_steps=True)
    hooks = _hooks(tracer, native)
    made = native.ops_made if native is not None else 0
    graph, x, loss, gradient = _graph(hooks, grouped)
    made = (native.ops_made if native is not None else 0) - made
    plain, *_ = _graph(None, grouped)
    def built(g) -> Counter:  # the forward ops (a grouped mark's gradient covers all its outputs)
        return Counter(op.type for op in g.get_operations() if not op.name.startswith("gradients/"))

    added = built(graph) - built(plain)
    values = _steps(graph, x, loss, gradient)
    hooks.drain()
    tracer.finish()
    writer.close()
    assert hooks.failures.counts() == {}
    return read_records(tmp_path / f"{name}.jsonl"), values, added, made


def _collectives(records: list[dict]) -> list[tuple]:
    return sorted((r["step"], r["name"], tuple(r["shape_in"]), tuple(r["shape_out"]), r["bytes_out"])
                  for r in records if r["type"] == "collective")


def test_in_a_tf1_graph_one_op_hands_the_output_on_and_records_its_run_time_shape(marks, tmp_path):
    # GIVEN a TF1 graph whose collective's rows are known only when the session runs, and a grouped op
    records, values, added, made = _run(tmp_path, "through", marks)
    python, python_values, _, _ = _run(tmp_path, "python", None)
    # THEN the records are those the Python calls write, step by step, with each step's rows
    assert _collectives(records) == _collectives(python)
    assert ("grad_rows", (5, 8), (5, 8)) in {(name, i, o) for _, name, i, o, _ in _collectives(records)}
    assert {r["step"] for r in records if r["type"] == "collective"} == {0, 1, 2}
    # AND the values and gradients fetched are those of the graph without memdiag's hooks
    assert values == python_values == _steps(*_graph(None, grouped=True))
    # AND memdiag added a begin mark for each collective (the grouped op's: one), one mark that hands the
    # outputs on (the grouped op's: one for both), and one Shape for the rows known only at run time, read
    # by the begin and the end; no Identity, no end mark beside the output
    assert added == Counter({"MemdiagMark": 2, "MemdiagMarkThrough": 2, "Shape": 1}), added
    assert made == 4


def test_a_library_without_the_op_marks_beside_the_output_as_before(marks, tmp_path):
    # GIVEN native marks whose library predates the mark that hands tensors on
    records, values, added, made = _run(tmp_path, "old", _NoThrough(marks))
    python, python_values, _, _ = _run(tmp_path, "python", None)
    # THEN the same records and values, through a mark beside each output and an Identity that waits for it
    # (and a Shape op for the output's rows, which the end mark cannot read itself)
    assert _collectives(records) == _collectives(python)
    assert values == python_values
    assert added == Counter({"MemdiagMark": 4, "Identity": 3, "Shape": 2}), added
    assert made == 4


def test_the_gradient_passes_through_the_mark_unchanged(marks):
    graph = tf.Graph()
    with graph.as_default():
        a = tf.constant([1.0, 2.0, 3.0])
        b = tf.constant([[4.0]])
        ta, tb = marks.mark_through(7, nativemarks.END, [a * a, b * 2.0], [], [0, 1])
        ga, gb = tf.gradients(tf.reduce_sum(ta) + tf.reduce_sum(tb), [a, b])
        assert ta.shape == a.shape and tb.shape == b.shape
        with tf.compat.v1.Session(graph=graph) as session:
            got_a, got_b = session.run([ga, gb])
    np.testing.assert_array_equal(got_a, [2.0, 4.0, 6.0])
    np.testing.assert_array_equal(got_b, [[2.0]])
