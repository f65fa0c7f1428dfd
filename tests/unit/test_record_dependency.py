"""Where memdiag's record of a collective sits in the graph: beside the collective's consumers in a
``tf.function`` (which runs every stateful op), on the output's path only in a TF1 graph (which runs
what a session fetches). An identity on the path inside a ``tf.function`` delayed Horovod's average of
an allgather's values and let TensorFlow reuse the buffer in place: 256 MiB less at a rank's peak than
under plain Horovod (tests/integration/test_memray_trace.py)."""

from __future__ import annotations

import tensorflow as tf

from memdiag.agent.collective_records import after


def _marker(calls: list[int]) -> tf.Operation:
    def mark() -> list:
        calls.append(1)
        return []
    return tf.py_function(mark, [], Tout=[])


def test_inside_a_tf_function_the_output_is_handed_on_unchanged():
    seen: list[tuple[object, object]] = []

    @tf.function
    def step(x):
        y = x * 2.0
        seen.append((y, after(y, _marker([]))))

        def branch():
            z = x + 1.0
            seen.append((z, after(z, _marker([]))))
            return z

        return tf.cond(x[0] > 0, branch, lambda: x)

    step(tf.constant([1.0]))
    assert len(seen) == 2
    for before, handed_on in seen:
        assert handed_on is before


def test_in_a_tf1_graph_the_output_waits_for_the_record_and_fetching_it_runs_the_record():
    calls: list[int] = []
    with tf.Graph().as_default() as graph:
        x = tf.constant([1.0, 2.0])
        y = x * 2.0
        marked = after(y, _marker(calls))
        assert marked is not y and marked.op.type == "Identity"
        total = tf.reduce_sum(marked)
        with tf.compat.v1.Session(graph=graph) as session:
            assert session.run(total) == 6.0
    assert calls == [1]
