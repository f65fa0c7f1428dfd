"""A user's script whose ranks look up different numbers of ids: rank r gathers ``rows + step x r`` rows.

An embedding table (``--vocab`` x ``--width`` float32, a ``tf.Variable`` looked up with ``tf.gather`` and
int64 ids, so its gradient is an IndexedSlices with 8-byte indices) feeds a dense head; the train step is a
``tf.function`` with Horovod's DistributedGradientTape at its defaults, so Horovod reduces the table's
gradient by allgather: every rank receives the sum of all ranks' rows. With ``--unknown-rows`` the step
is traced for ids of any length (the rows are known only when the step runs).

    mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 .venv/bin/python tests/uneven_rows_script.py
"""

import argparse

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

SEED = 5


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=4000)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--rows", type=int, default=2000, help="ids rank 0 looks up per step")
    parser.add_argument("--step", type=int, default=3000, help="ids each further rank looks up more")
    parser.add_argument("--unknown-rows", action="store_true", help="trace the step for ids of any length")
    args = parser.parse_args()

    hvd.init()
    tf.random.set_seed(SEED)
    table = tf.Variable(tf.random.normal([args.vocab, args.width], stddev=0.05, seed=SEED), name="table")
    head = tf.Variable(tf.random.normal([args.width, 1], stddev=0.05, seed=SEED + 1), name="head")
    optimizer = tf.keras.optimizers.SGD(0.1)
    rows = args.rows + args.step * hvd.rank()
    rng = np.random.default_rng(SEED + hvd.rank())

    def step(ids, targets):
        with tf.GradientTape() as tape:
            predicted = tf.matmul(tf.gather(table, ids), head)
            loss = tf.reduce_mean(tf.square(predicted[:, 0] - targets))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, [table, head])
        optimizer.apply_gradients(zip(grads, [table, head]))
        return loss

    signature = [tf.TensorSpec([None] if args.unknown_rows else [rows], tf.int64),
                 tf.TensorSpec([None] if args.unknown_rows else [rows], tf.float32)]
    train_step = tf.function(step, input_signature=signature)
    hvd.broadcast_variables([table, head], root_rank=0)
    for k in range(args.steps):
        ids = rng.integers(0, args.vocab, size=rows, dtype=np.int64)
        targets = rng.standard_normal(rows).astype(np.float32)
        loss = train_step(tf.constant(ids), tf.constant(targets))
        if hvd.rank() == 0:
            print(f"step {k} loss {loss.numpy():.6f}", flush=True)


if __name__ == "__main__":
    main()
