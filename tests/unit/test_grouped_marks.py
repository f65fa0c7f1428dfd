"""Native marks that stand for several collectives: a function graph's broadcasts (one begin and one end
mark for all of them), one op of many tensors (one begin and one end mark per op) and a function graph's
all-reduces in Horovod's conds (a begin mark each, or one for those under 64 KiB, and one end mark for
all), each collective still recorded
on its own, as one mark per collective recorded it."""

from __future__ import annotations

from pathlib import Path

import pytest

from memdiag import nativemarks
from memdiag.agent import replay
from memdiag.agent.naming import Origin
from memdiag.agent.sampler import MemorySampler
from memdiag.agent.tracer import Tracer
from memdiag.format.writer import RecordWriter
from tests.helpers import native_marks, read_records

tf = pytest.importorskip("tensorflow")


@pytest.fixture(scope="module")
def marks(tmp_path_factory) -> nativemarks.Marks:
    return native_marks(tmp_path_factory)


class Traced:
    """A tracer writing to a file, memdiag's hooks on it, with native marks (and their keys file)."""

    def __init__(self, tmp_path: Path, marks: nativemarks.Marks | None, name: str = "rank") -> None:
        from memdiag.agent.hooks import CollectiveHooks

        self.path = tmp_path / f"{name}.jsonl"
        self.writer = RecordWriter(str(self.path), 0)
        self.tracer = Tracer(self.writer, MemorySampler(0.005), rank=0, auto_steps=True)
        self.hooks = CollectiveHooks(self.tracer, "as-written", 1.0, lambda: 2, lambda d: None)
        self.keys = tmp_path / f"{name}.keys"
        self.uninstall = []
        if marks is not None:
            self.hooks.use_native(marks, keys=replay.KeysFile(str(self.keys)))
        from memdiag import graphcalls

        self.uninstall = graphcalls.install()

    def records(self) -> list[dict]:
        self.tracer.finish()
        self.writer.close()
        for owner, attr, original in self.uninstall:
            setattr(owner, attr, original)
        self.hooks.stop_native()
        assert self.hooks.failures.counts() == {}
        return read_records(self.path)


def _broadcast(hooks, name: str, variable):
    """A stand-in for Horovod's broadcast of one variable, through memdiag's begin and record, as the
    op-level wrapper puts them around Horovod's op."""
    origin = Origin(name)
    with tf.control_dependencies(hooks._begin("broadcast", [(origin, variable)])):
        output = tf.identity(variable)
    return variable.assign(hooks._record("broadcast", origin, variable, output, grouped=False))


def _collectives(records: list[dict]) -> list[tuple]:
    return sorted((r["step"], r["op"], r["name"], tuple(r["shape_in"]), tuple(r["shape_out"]))
                  for r in records if r["type"] == "collective")


def test_a_function_graphs_broadcasts_are_two_marks_and_each_is_still_recorded(marks, tmp_path):
    # GIVEN six variables broadcast inside a tf.function, as broadcast_variables does, with native marks
    variables = [tf.Variable(tf.ones([3 + i, 2])) for i in range(6)]
    traced = Traced(tmp_path, marks)
    made = marks.ops_made

    @tf.function(autograph=False)  # memdiag's wrappers run its hooks unconverted
    def set_up():
        for i, v in enumerate(variables):
            _broadcast(traced.hooks, f"var_{i}", v)

    set_up()
    traced.hooks.drain()
    # THEN two mark ops stand for the six broadcasts: a begin they all wait for and an end after them all
    assert marks.ops_made - made == 2
    graph = set_up.get_concrete_function().graph
    kinds = sorted(op.get_attr("kind") for op in graph.get_operations() if op.type == "MemdiagMark")
    assert kinds == [nativemarks.BEGIN, nativemarks.END]
    # AND the end mark waits for every broadcast's output
    [end] = [op for op in graph.get_operations() if op.type == "MemdiagMark" and op.get_attr("kind") == nativemarks.END]
    assert len(end.control_inputs) == 6
    # AND each broadcast is recorded on its own, with its shapes, none left in flight
    assert traced.tracer.in_flight() is None
    records = traced.records()
    assert [(op, name, shape_in, shape_out) for _, op, name, shape_in, shape_out in _collectives(records)] == [
        ("broadcast", f"var_{i}", (3 + i, 2), (3 + i, 2)) for i in range(6)]
    # AND the keys file, read back as a killed rank's replay reads it, gives the same group and members
    marked = replay.read_keys(str(traced.keys))
    groups = [key for key, (op, _, _, _) in enumerate(marked) if op == replay.GROUP]
    assert [len(replay.group_members(marked, key)) for key in groups] == [6, 6]
    assert [marked[m][1]["name"] for m in replay.group_members(marked, groups[1])] == [f"var_{i}" for i in range(6)]


def test_broadcasts_of_shapes_known_only_when_run_keep_a_mark_each(marks, tmp_path):
    # GIVEN broadcasts of tensors whose shape is known only when the function runs
    traced = Traced(tmp_path, marks)
    made = marks.ops_made

    @tf.function(input_signature=[tf.TensorSpec([None])], autograph=False)
    def set_up(x):
        outputs = []
        for i in range(3):
            origin = Origin(f"t_{i}")
            with tf.control_dependencies(traced.hooks._begin("broadcast", [(origin, x)])):
                output = tf.identity(x) + float(i)
            outputs.append(traced.hooks._record("broadcast", origin, x, output, grouped=False))
        return tf.add_n(outputs)

    set_up(tf.ones([5]))
    traced.hooks.drain()
    # THEN each keeps its own begin and end (their shapes are the marks' inputs)
    assert marks.ops_made - made == 6
    assert [shape_out for *_, shape_out in _collectives(traced.records())] == [(5,)] * 3


def test_one_op_of_many_tensors_is_two_marks_per_call_and_each_tensor_is_recorded(marks, tmp_path):
    # GIVEN a grouped all-reduce stand-in of three gradients in a step, run three times
    traced = Traced(tmp_path, marks)
    made = marks.ops_made

    @tf.function(autograph=False)  # memdiag's wrappers run its hooks unconverted
    def step(x):
        tensors = [tf.reshape(x, [4, 2]) * float(i + 1) for i in range(3)]
        tensors.append(tf.reshape(x, [8]))
        origins = [Origin(f"grad_{i}", gradient=True, reduce_op="average") for i in range(4)]
        with tf.control_dependencies(traced.hooks._begin("allreduce", list(zip(origins, tensors)))):
            outputs = [tf.identity(t) for t in tensors]
        outputs = traced.hooks._record_all("allreduce", origins, tensors, outputs)
        return tf.add_n([tf.reduce_sum(o) for o in outputs])

    for i in range(3):
        step(tf.fill([8], float(i)))
    traced.hooks.drain()
    # THEN one begin and one end mark stand for the op's four tensors
    assert marks.ops_made - made == 2
    records = traced.records()
    collectives = _collectives(records)
    # AND each tensor of each call is recorded, grouped, with its shapes, and the calls are steps of their own
    assert len(collectives) == 12
    assert {(name, shape_in) for _, _, name, shape_in, _ in collectives} == {
        ("grad_0", (4, 2)), ("grad_1", (4, 2)), ("grad_2", (4, 2)), ("grad_3", (8,))}
    assert all(r["grouped"] for r in records if r["type"] == "collective")
    assert sorted({step for step, *_ in collectives}) == [0, 1, 2]
    # AND the four tensors of a call complete at the one time the end mark was reached
    times = {}
    for r in records:
        if r["type"] == "collective" and "t" in r:
            times.setdefault(r["step"], set()).add(r["t"])
    assert times and all(len(ts) == 1 for ts in times.values())


def test_a_tf1_graphs_broadcasts_keep_a_mark_each_and_run_when_fetched(marks, tmp_path):
    # GIVEN broadcasts in a TF1 graph (no function: a session runs only what it fetches)
    traced = Traced(tmp_path, marks)
    made = marks.ops_made
    graph = tf.Graph()
    with graph.as_default():
        variables = [tf.compat.v1.Variable(tf.ones([2, 2]), use_resource=True) for _ in range(3)]
        assigns = tf.group(*[_broadcast(traced.hooks, f"var_{i}", v) for i, v in enumerate(variables)])
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(assigns)
    traced.hooks.drain()
    # THEN each broadcast has its own begin and end, and each is recorded
    assert marks.ops_made - made == 6
    assert [name for _, _, name, _, _ in _collectives(traced.records())] == ["var_0", "var_1", "var_2"]


def _cond_step(hooks, runs: bool, tensors: int = 1, elements: int = 8):
    """A step whose gradients are each reduced in a tf.cond of their own, as Horovod's _allreduce_cond
    builds it (the stand-in all-reduce an identity with memdiag's begin and record around it), through
    memdiag's placement of the marks around the cond; each gradient a float32 tensor of ``elements``."""

    def reduce(i: int, grad):
        origins = [Origin(f"grad_{i}_{j}", gradient=True, reduce_op="average") for j in range(tensors)]
        grads = [grad * float(j + 1) for j in range(tensors)]

        def branch():
            with tf.control_dependencies(hooks._begin("allreduce", list(zip(origins, grads)))):
                outputs = [tf.identity(g) for g in grads]
            if tensors == 1:
                return hooks._record("allreduce", origins[0], grads[0], outputs[0], grouped=False)
            return hooks._record_all("allreduce", origins, grads, outputs)

        return hooks._outside_cond(lambda: tf.cond(tf.constant(runs), branch, lambda: grads[0] if tensors == 1 else grads),
                                   grads, runs)

    @tf.function(autograph=False)  # memdiag's wrappers run its hooks unconverted
    def step(x):
        reduced = [reduce(i, tf.reshape(x, [2, elements // 2]) + float(i)) for i in range(3)]
        return tf.add_n([tf.reduce_sum(r) for r in tf.nest.flatten(reduced)])

    return step


@pytest.mark.parametrize(("tensors", "elements"), [(1, 8), (2, 8), (1, 16384), (2, 16384)])
def test_a_horovod_conds_all_reduces_are_marked_around_it_and_the_cond_stays_stateless(marks, tmp_path, tensors,
                                                                                       elements):
    # GIVEN three gradients each reduced in a cond of its own (two tensors a cond: a grouped all-reduce),
    # of 32 bytes each or of 64 KiB each
    traced = Traced(tmp_path, marks)
    step = _cond_step(traced.hooks, runs=True, tensors=tensors, elements=elements)
    graph = step.get_concrete_function(tf.TensorSpec([elements])).graph
    # THEN no mark is inside a cond: each cond is stateless, as plain Horovod builds it
    ifs = [op for op in graph.get_operations() if op.type in ("If", "StatelessIf")]
    assert [op.type for op in ifs] == ["StatelessIf"] * 3
    for op in ifs:
        assert not [o for o in op._true_graph.get_operations() if o.type == "MemdiagMark"]
    # AND a cond of 64 KiB of inputs has a begin mark of its own beside it, which waits for its inputs;
    # smaller conds share one begin mark, which waits for all their inputs
    outer = [op for op in graph.get_operations() if op.type == "MemdiagMark"]
    begins = [op for op in outer if op.get_attr("kind") == nativemarks.BEGIN]
    large = elements * 4 >= 64 * 1024
    assert len(begins) == (3 if large else 1)
    assert traced.hooks.begins_shared == (0 if large else 3 * tensors)
    cond_inputs = [{t.op for t in op.inputs[1:]} for op in ifs]  # each cond's inputs, its predicate left out
    waited = [{o.inputs[0].op if o.type == "Identity" else o for o in b.control_inputs} for b in begins]
    if large:
        assert sorted(map(sorted_names, waited)) == sorted(map(sorted_names, cond_inputs))
    else:
        assert waited == [set().union(*cond_inputs)]
    # AND one end mark for the graph's conds, after every cond's outputs and every begin
    ends = [op for op in outer if op.get_attr("kind") == nativemarks.END]
    assert len(ends) == 1
    waits = {o if o.type != "Identity" else o.inputs[0].op for o in ends[0].control_inputs}  # cond_v2's outputs
    assert waits == set(ifs) | set(begins)
    # AND nothing waits for a mark: the conds run as they would unmarked
    assert not any(op.control_inputs and any(c.type == "MemdiagMark" for c in op.control_inputs)
                   for op in graph.get_operations() if op.type != "MemdiagMark" and op.type != "NoOp")
    # AND each all-reduce is recorded step by step, with its shapes
    for i in range(2):
        step(tf.fill([elements], float(i)))
    traced.hooks.drain()
    assert traced.tracer.in_flight() is None
    collectives = _collectives(traced.records())
    assert len(collectives) == 2 * 3 * tensors
    assert {(name, shape_in) for _, _, name, shape_in, _ in collectives} == {
        (f"grad_{i}_{j}", (2, elements // 2)) for i in range(3) for j in range(tensors)}
    assert sorted({s for s, *_ in collectives}) == [0, 1]


def sorted_names(ops) -> list[str]:
    return sorted(op.name for op in ops)


def test_a_cond_whose_branch_never_runs_is_not_marked_nor_recorded(marks, tmp_path):
    # GIVEN Horovod's cond with a predicate false when the graph is built (a process set of one)
    traced = Traced(tmp_path, marks)
    made = marks.ops_made
    step = _cond_step(traced.hooks, runs=False)
    step(tf.fill([8], 1.0))
    traced.hooks.drain()
    # THEN no mark is made and no collective recorded: none ran
    assert marks.ops_made == made
    assert _collectives(traced.records()) == []
