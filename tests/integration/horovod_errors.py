"""A script that calls Horovod wrongly on purpose, in eager code, in a tf.function and in a TF1 graph
with a session, and prints what Horovod answered each call: what came back, or the error it raised.

Under memdiag (as written) every line must be the same as under plain mpirun: memdiag's hooks pass
Horovod's own errors through unchanged. It also trains a tiny model in a graph that then goes out of
scope, so that memdiag has variables it can no longer read when the script ends.

    mpirun -np 2 python tests/integration/horovod_errors.py
"""

from __future__ import annotations

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf


def answer(name: str, call) -> None:
    try:
        result = call()
        if isinstance(result, (list, tuple)):
            shapes = [list(np.shape(r.values if isinstance(r, tf.IndexedSlices) else r)) for r in result]
        else:
            shapes = list(np.shape(result.values if isinstance(result, tf.IndexedSlices) else result))
        text = f"returned {shapes}"
    except Exception as exc:  # noqa: BLE001 - the point is to print what Horovod raised
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        text = f"raised {type(exc).__name__}: {first[:120]}"
    if hvd.rank() == 0:
        print(f"{name}: {text}", flush=True)


def slices() -> tf.IndexedSlices:
    return tf.IndexedSlices(tf.ones([3, 4]), tf.constant([0, 2, 5], tf.int64), tf.constant([8, 4], tf.int64))


def eager_cases() -> None:
    answer("eager allreduce IndexedSlices op=Max", lambda: hvd.allreduce(slices(), op=hvd.Max))
    answer("eager allreduce IndexedSlices op=Adasum", lambda: hvd.allreduce(slices(), op=hvd.Adasum))
    answer("eager allreduce IndexedSlices prescale", lambda: hvd.allreduce(slices(), prescale_factor=2.0))
    answer("eager grouped_allreduce IndexedSlices op=Max",
           lambda: hvd.grouped_allreduce([slices(), slices()], op=hvd.Max))
    answer("eager grouped_allreduce mixed op=Min",
           lambda: hvd.grouped_allreduce([slices(), tf.ones([4])], op=hvd.Min))
    # as Horovod's own test file builds them: an IndexedSlices whose values are a Python list of tensors
    listed = [tf.IndexedSlices([tf.ones([1, 3])], tf.convert_to_tensor([hvd.rank()])), tf.ones([1, 3])]
    answer("eager grouped_allreduce list-valued IndexedSlices op=Min",
           lambda: hvd.grouped_allreduce(listed, op=hvd.Min))
    answer("eager allreduce list-valued IndexedSlices op=Max", lambda: hvd.allreduce(listed[0], op=hvd.Max))
    answer("eager allreduce of a list", lambda: hvd.allreduce([1.0, 2.0]))
    answer("eager grouped_allreduce empty", lambda: hvd.grouped_allreduce([]))
    answer("eager allgather", lambda: hvd.allgather(tf.ones([2 + hvd.rank(), 3])))
    answer("eager allreduce shapes differing by rank", lambda: hvd.allreduce(tf.ones([2 + hvd.rank()])))
    answer("eager broadcast roots differing by rank", lambda: hvd.broadcast(tf.ones([2]), root_rank=hvd.rank()))
    answer("eager allreduce IndexedSlices", lambda: hvd.allreduce(slices()))


def function_cases() -> None:
    @tf.function
    def grouped_max():
        return hvd.grouped_allreduce([slices(), slices()], op=hvd.Max)

    @tf.function
    def gather():
        return hvd.allgather(tf.ones([2, 3]) * tf.cast(hvd.rank(), tf.float32))

    answer("function grouped_allreduce IndexedSlices op=Max", grouped_max)
    answer("function allgather", gather)


def graph_cases() -> None:
    with tf.Graph().as_default():
        answer("graph allreduce IndexedSlices op=Max", lambda: hvd.allreduce(slices(), op=hvd.Max))
        answer("graph grouped_allreduce IndexedSlices op=Product",
               lambda: hvd.grouped_allreduce([slices()], op=hvd.Product))
        # A tiny model trained in this graph, through a session; the graph then goes out of scope.
        table = tf.compat.v1.get_variable("table", [16, 4], initializer=tf.compat.v1.ones_initializer())
        ids = tf.constant([1, 3, 3, 7], tf.int64)
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.gather(table, ids) ** 2)
        tape = hvd.DistributedGradientTape(tape)
        [grad] = tape.gradient(loss, [table])
        train = table.assign_sub(0.1 * tf.convert_to_tensor(grad))
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            for _ in range(2):
                session.run(train)
            total = session.run(tf.reduce_sum(table))
        if hvd.rank() == 0:
            print(f"graph training: table sum {total:.6f}", flush=True)


def main() -> None:
    hvd.init()
    eager_cases()
    function_cases()
    graph_cases()
    if hvd.rank() == 0:
        print("done", flush=True)


if __name__ == "__main__":
    main()
