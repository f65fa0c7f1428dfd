"""A user's script whose ranks reduce the same gradients in different orders: each rank calls
``hvd.allreduce`` on its two embedding tables' gradients, named after the table, rotated by its rank
(rank 0: first, second; rank 1: second, first). The step is a ``tf.function``: Horovod's ops in a graph
start as they are reached and Horovod pairs the ranks' collectives by name, so the job runs as written
under plain mpirun. With ``--same-order --extra`` every rank reduces them in the same order, and the
last rank also reduces a third table's gradient that the others never do (its own tape): under plain
Horovod that rank's allgather waits for partners that never come.

    mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 .venv/bin/python tests/order_script.py
"""

import argparse

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

SEED = 11


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--same-order", action="store_true", help="every rank reduces first, then second")
    parser.add_argument("--extra", action="store_true",
                        help="the last rank reduces one more table's gradient through the tape (only it)")
    args = parser.parse_args()

    hvd.init()
    tf.random.set_seed(SEED)
    first = tf.Variable(tf.random.normal([3000, 64], stddev=0.05, seed=SEED), name="first")
    second = tf.Variable(tf.random.normal([50, 64], stddev=0.05, seed=SEED + 1), name="second")
    tables = [first, second]
    turn = 0 if args.same_order else hvd.rank() % 2
    mine = tables[turn:] + tables[:turn]  # this rank's order
    extra = tf.Variable(tf.random.normal([100, 64], stddev=0.05, seed=SEED + 2), name="zzz_extra")
    optimizer = tf.keras.optimizers.SGD(0.01)
    rng = np.random.default_rng(SEED + hvd.rank())

    @tf.function
    def step(ids):
        with tf.GradientTape() as tape:
            loss = tf.add_n([tf.reduce_sum(tf.square(tf.gather(t, ids % t.shape[0]))) for t in tables])
        grads = tape.gradient(loss, mine)
        reduced = [hvd.allreduce(g, name=t.name.split(":")[0]) for g, t in zip(grads, mine)]
        if args.extra and hvd.rank() == hvd.size() - 1:
            with tf.GradientTape() as tape:
                penalty = tf.reduce_sum(tf.gather(extra, ids % 100))
            [grad] = hvd.DistributedGradientTape(tape).gradient(penalty, [extra])
            optimizer.apply_gradients([(grad, extra)])
        optimizer.apply_gradients(zip(reduced, mine))
        return loss

    hvd.broadcast_variables(tables, root_rank=0)
    for k in range(args.steps):
        loss = step(tf.constant(rng.integers(0, 3000, size=600, dtype=np.int64)))
        if hvd.rank() == 0:
            print(f"step {k} loss {loss.numpy():.6f}", flush=True)


if __name__ == "__main__":
    main()
