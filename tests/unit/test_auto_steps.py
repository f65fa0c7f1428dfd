"""A script's steps found from its collectives (memdiag.agent.tracer), whatever order they start in.

Called eagerly, collectives start in the script's order and the first one's return starts a step.
Inside a graph they start as their inputs are ready, in an order that changes from step to step
(memdiag.graphcalls leaves them unordered, as plain Horovod does): a step starts when a collective
that has started already in the current step starts again, whichever it is.
"""

from __future__ import annotations

import random
from pathlib import Path

from memdiag.agent.sampler import MemorySampler
from memdiag.agent.tracer import Tracer
from memdiag.format.reader import read_rank_file
from memdiag.format.writer import RecordWriter
from tests.unit.fake_run import meta

GRADIENTS = ["emb:0", "kernel:0", "bias:0", "head:0"]


def _gradient(name: str) -> dict:
    return {**meta("allreduce", name), "gradient": True, "reduce_op": "average"}


def _run(tmp_path: Path, in_graph: bool, orders: list[list[str]], extra: list[str] = ()) -> dict[int, list[str]]:
    """Start and complete the collectives of each step in the order given; the records' steps."""
    writer = RecordWriter(str(tmp_path / "rank-0.jsonl"), 0)
    tracer = Tracer(writer, MemorySampler(1.0), 0, auto_steps=True)
    tracer.begin_collective(meta("broadcast", "emb:0"), 0, in_graph=in_graph)  # set-up
    tracer.collective(meta("broadcast", "emb:0"), [8], [8])
    for order in orders:
        for name in order:
            tracer.begin_collective(_gradient(name), 0, in_graph=in_graph)
        for name in [*order, *extra]:
            if name in extra:
                tracer.begin_collective(meta("allreduce", name), 0, in_graph=in_graph)
                tracer.collective(meta("allreduce", name), [1], [1])
            else:
                tracer.collective(_gradient(name), [8], [8])
    tracer.finish()
    writer.close()
    steps: dict[int, list[str]] = {}
    for record in read_rank_file(str(tmp_path / "rank-0.jsonl"), 0).collectives:
        steps.setdefault(record["step"], []).append(record["name"])
    return steps


def test_in_a_graph_each_step_holds_its_own_collectives_whatever_order_they_start_in(tmp_path):
    rng = random.Random(4)
    orders = [rng.sample(GRADIENTS, len(GRADIENTS)) for _ in range(6)]
    assert len({tuple(o) for o in orders}) > 1  # the order changes from step to step
    steps = _run(tmp_path, in_graph=True, orders=orders, extra=["metric:0"])
    assert sorted(steps) == [-1, 0, 1, 2, 3, 4, 5]
    for step in range(6):
        assert sorted(steps[step]) == sorted([*GRADIENTS, "metric:0"]), step


def test_eagerly_a_step_starts_where_the_first_collective_starts_again(tmp_path):
    orders = [GRADIENTS] * 4
    steps = _run(tmp_path, in_graph=False, orders=orders)
    assert sorted(steps) == [-1, 0, 1, 2, 3]
    assert all(steps[step] == GRADIENTS for step in range(4))


def test_the_anchor_rule_alone_splits_a_graphs_steps_where_the_order_changes(tmp_path):
    # the control case: with the eager rule, a step whose first collective is not the anchor lends its
    # earlier collectives to the step before
    orders = [GRADIENTS, [GRADIENTS[1], GRADIENTS[0], *GRADIENTS[2:]]]
    steps = _run(tmp_path, in_graph=False, orders=orders)
    assert steps[0] != GRADIENTS or steps[1] != GRADIENTS
    (tmp_path / "graph").mkdir()
    assert _run(tmp_path / "graph", in_graph=True, orders=orders)[1] == orders[1]
