"""A plain Horovod training script with short steps, for measuring what memdiag costs a real job.

A user's script in the usual style: a ``tf.function`` train step, ``hvd.DistributedGradientTape``
with ``sparse_as_dense=True`` (the embedding's gradient reduced densely), a small MLP head, Adam.
Each step takes about 50 ms on 2 ranks of a 2-core machine (``--hidden`` sets it). It prints, with
``--phases``, the wall-clock time (``time.time()``) of its own milestones, so that a probe can tell
where a run's time goes under plain mpirun and under ``memdiag run``::

    phase script_start T      first line of the script, before TensorFlow is imported
    phase init T              after hvd.init()
    phase first_step T        when the first step starts
    phase first_step_end T    when the first step (which traces the graph) has ended
    phase last_step_end T     when the last step has ended (its loss read)
    phase script_end T        the script's last line

Under plain mpirun: ``mpirun -np 2 python probes/short_step_script.py --steps 30 --phases``.
"""
from __future__ import annotations

import time

SCRIPT_START = time.time()

import argparse  # noqa: E402 - the script's start time is taken before its imports

import horovod.tensorflow as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--vocab", type=int, default=20000)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=4096, help="tokens per rank per step")
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--phases", action="store_true", help="print the milestones' wall-clock times")
    args = parser.parse_args()

    def phase(name: str, t: float | None = None) -> None:
        if args.phases and hvd.rank() == 0:
            print(f"phase {name} {time.time() if t is None else t:.6f}", flush=True)

    hvd.init()
    phase("script_start", SCRIPT_START)
    phase("init")
    tf.keras.utils.set_random_seed(7)
    embedding = tf.keras.layers.Embedding(args.vocab, args.width, name="tokens")
    hidden = tf.keras.layers.Dense(args.hidden, activation="relu", name="hidden")
    head = tf.keras.layers.Dense(16, name="head")
    optimizer = tf.keras.optimizers.Adam(1e-3)
    rng = np.random.default_rng(7 + hvd.rank())

    @tf.function
    def train_step(tokens, labels, first):
        with tf.GradientTape() as tape:
            features = tf.reshape(embedding(tokens), [-1, 16 * args.width])
            logits = head(hidden(features))
            loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True))
        tape = hvd.DistributedGradientTape(tape, sparse_as_dense=True)
        variables = embedding.trainable_variables + hidden.trainable_variables + head.trainable_variables
        grads = tape.gradient(loss, variables)
        optimizer.apply_gradients(zip(grads, variables))
        if first:
            hvd.broadcast_variables(variables + optimizer.variables, root_rank=0)
        return loss

    rows = args.tokens // 16
    for step in range(args.steps):
        tokens = tf.constant(rng.integers(0, args.vocab, size=(rows, 16)), dtype=tf.int32)
        labels = tf.constant(rng.integers(0, 16, size=rows), dtype=tf.int32)
        if step == 0:
            phase("first_step")
        loss = float(train_step(tokens, labels, tf.constant(step == 0)))
        if step in (0, args.steps - 1) and hvd.rank() == 0:
            print(f"step {step} loss {loss:.6f}", flush=True)
        if step == 0:
            phase("first_step_end")
    phase("last_step_end")
    phase("script_end")


if __name__ == "__main__":
    main()
