"""A short-step Horovod script (tf.function step, DistributedGradientTape with an embedding's sparse
gradient) one of whose ranks kills itself outright (SIGKILL, as the kernel's OOM killer does) before
a given step: what memdiag keeps of a rank that no handler of its own outlives.

    mpirun -np 2 python tests/integration/killed_script.py --steps 40 --die-at 20 --die-rank 1
"""

import argparse
import os
import signal

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--die-at", type=int, default=20, help="the step before which the rank kills itself")
    parser.add_argument("--die-rank", type=int, default=1)
    args = parser.parse_args()

    hvd.init()
    tf.keras.utils.set_random_seed(11)
    embedding = tf.keras.layers.Embedding(500, 16, name="words")
    head = tf.keras.layers.Dense(4, name="head")
    optimizer = tf.keras.optimizers.SGD(0.1)
    rng = np.random.default_rng(11 + hvd.rank())

    @tf.function
    def train_step(tokens, labels):
        with tf.GradientTape() as tape:
            logits = head(tf.reduce_mean(embedding(tokens), axis=1))
            loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True))
        tape = hvd.DistributedGradientTape(tape)
        variables = embedding.trainable_variables + head.trainable_variables
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss

    tokens = rng.integers(0, 500, size=(8, 8))
    embedding(tokens)
    head(tf.zeros([1, 16]))
    hvd.broadcast_variables(embedding.variables + head.variables, root_rank=0)
    for step in range(args.steps):
        if step == args.die_at and hvd.rank() == args.die_rank:
            print(f"rank {hvd.rank()} kills itself before step {step}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        loss = train_step(tf.constant(rng.integers(0, 500, size=(8, 8))), tf.constant(rng.integers(0, 4, size=(8,))))
        if hvd.rank() == 0:
            print(f"step {step} loss {float(loss):.6f}", flush=True)


if __name__ == "__main__":
    main()
