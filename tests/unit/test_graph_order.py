"""memdiag's records inside a graph order nothing (memdiag.graphcalls).

A record is a stateful Python call; inside a ``tf.function`` TensorFlow runs stateful ops that use no
resource one after another, and a ``tf.cond`` holding one becomes a stateful ``If``, ordered the same
way. Horovod puts each gradient's all-reduce in a ``tf.cond`` of its own: with ordered records each
all-reduce waited for the previous one's completion and Horovod could fuse none of them. These tests
read the graph: Horovod's conds under memdiag are ordered as under plain Horovod (not at all), and the
records still run on every call.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import tensorflow as tf

from memdiag import graphcalls

ROOT = Path(__file__).resolve().parents[2]


def _conds(graph: tf.Graph) -> dict[str, list[str]]:
    return {op.name: [c.name for c in op.control_inputs] for op in graph.get_operations()
            if op.type in ("If", "StatelessIf")}


def _two_branch_records(calls: list[str]) -> tuple[tf.types.experimental.ConcreteFunction, tf.Graph]:
    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
    def step(x):
        outputs = []
        for tag in ("a", "b"):
            def branch(tag: str = tag) -> tf.Tensor:
                y = x * 2.0
                graphcalls.host_call(lambda shape, tag=tag: calls.append(tag) or [], [tf.shape(y)], name="mark")
                return y
            outputs.append(tf.cond(tf.size(x) > 0, branch, lambda: x))
        return outputs[0] + outputs[1]

    concrete = step.get_concrete_function()
    return concrete, concrete.graph


def test_records_in_two_conds_leave_the_conds_unordered_and_run_on_every_call():
    undo = graphcalls.install()
    try:
        calls: list[str] = []
        concrete, graph = _two_branch_records(calls)
    finally:
        for owner, attr, original in undo:
            setattr(owner, attr, original)
    conds = _conds(graph)
    assert len(conds) == 2 and all(inputs == [] for inputs in conds.values()), conds
    for _ in range(3):
        concrete(tf.constant([1.0, 2.0]))
    assert sorted(calls) == ["a"] * 3 + ["b"] * 3


def test_records_in_switch_cases_and_loops_leave_them_unordered():
    undo = graphcalls.install()
    calls: list[str] = []
    try:
        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
        def step(x):
            def record(tag: str) -> None:
                graphcalls.host_call(lambda shape, tag=tag: calls.append(tag) or [], [tf.shape(x)], name="mark")

            def branch(tag: str):
                def make():
                    record(tag)
                    return x * 2.0
                return make

            a = tf.switch_case(tf.size(x) % 2, [branch("case0"), branch("case1")])
            a += tf.switch_case(tf.size(x) % 2, [branch("again0"), branch("again1")])

            def body(i, y):
                record("loop")
                return i + 1, y + 1.0

            _, b = tf.while_loop(lambda i, y: i < 2, body, [tf.constant(0), x])
            return a + b

        concrete = step.get_concrete_function()
    finally:
        for owner, attr, original in undo:
            setattr(owner, attr, original)
    flow = {op.name: [c.name for c in op.control_inputs] for op in concrete.graph.get_operations()
            if op.type in ("Case", "StatelessCase", "While", "StatelessWhile")}
    assert len(flow) == 3 and all(inputs == [] for inputs in flow.values()), flow
    concrete(tf.constant([1.0, 2.0]))
    assert sorted(calls) == ["again0", "case0", "loop", "loop"]


def test_without_it_tensorflow_orders_the_second_cond_after_the_first():
    # the control case: what memdiag.graphcalls undoes
    _, graph = _two_branch_records([])
    conds = _conds(graph)
    assert sorted(len(inputs) for inputs in conds.values()) == [0, 1], conds


HOROVOD_GRAPH = textwrap.dedent("""
    import sys
    import tensorflow as tf
    import horovod.tensorflow as hvd
    from memdiag import graphcalls
    from memdiag.agent.hooks import CollectiveHooks

    class Writer:
        def add(self, record):
            pass

    class Tracer:
        step = 0
        writer = Writer()

        def begin_collective(self, *args, **kwargs):
            pass

        def collective(self, *args, **kwargs):
            pass

    if sys.argv[1] != "plain":
        if sys.argv[1] == "unordered-off":
            graphcalls.install = lambda: []
        CollectiveHooks(Tracer(), "as-written", 1.0, lambda: 1, lambda decision: None).install()
    hvd.init()
    variables = [tf.Variable(tf.ones([4, 4])), tf.Variable(tf.ones([4])), tf.Variable(tf.ones([4, 2]))]

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.matmul(tf.matmul(x, variables[0]) + variables[1], variables[2]))
        return hvd.DistributedGradientTape(tape).gradient(loss, variables)

    graph = step.get_concrete_function(tf.TensorSpec([None, 4])).graph
    for op in graph.get_operations():
        if op.type in ("If", "StatelessIf"):
            marked = sum(1 for branch in (op._true_graph, op._false_graph) for o in branch.get_operations()
                         if o.type == "PyFunc")
            print("cond", op.name, len(op.control_inputs), marked)
""")


def _horovod_conds(variant: str) -> list[tuple[str, int, int]]:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", HOROVOD_GRAPH, variant], capture_output=True, text=True,
                          env=env, timeout=300, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line.split() for line in done.stdout.splitlines() if line.startswith("cond ")]
    return [(name, int(ordered), int(marked)) for _, name, ordered, marked in rows]


def test_horovods_gradient_conds_are_ordered_as_under_plain_horovod():
    # GIVEN a tf.function step reducing three gradients with Horovod's DistributedGradientTape
    plain = _horovod_conds("plain")
    hooked = _horovod_conds("memdiag")
    off = _horovod_conds("unordered-off")
    # THEN plain Horovod's three conds are unordered; under memdiag they hold the records and are unordered too
    assert [(n, o) for n, o, _ in plain] == [(n, 0) for n, _, _ in plain] and len(plain) == 3
    assert [(n, o) for n, o, _ in hooked] == [(n, o) for n, o, _ in plain]
    assert all(marked >= 2 for _, _, marked in hooked)  # a start mark and a record in each
    # AND without memdiag.graphcalls each cond after the first waits for the one before
    assert [o for _, o, _ in off] == [0, 1, 1]


def test_unnamed_collectives_of_one_call_site_are_numbered_in_each_graph_and_not_eagerly():
    from memdiag.agent.hooks import CollectiveHooks

    class Idle:
        step = 0

    hooks = CollectiveHooks(Idle(), "as-written", 1.0, lambda: 2, lambda decision: None)
    names: list[str] = []

    def step(x):
        for i in range(3):  # one call site, the same shape: a loop over same-shaped tensors
            names.append(hooks.labels.unnamed("allreduce", x + float(i), {}).name)
        return x

    for _ in range(2):
        tf.function(step)(tf.ones([4]))  # the second time another graph: numbered afresh
    step(tf.ones([4]))  # eagerly: one after another in the script's order, unnumbered
    base, eager = names[0], names[-1]
    assert base.startswith("allreduce@") and "test_graph_order.py:" in base and base.endswith("[4]")
    assert names == [base, f"{base}#2", f"{base}#3"] * 2 + [eager] * 3 and "#" not in eager
