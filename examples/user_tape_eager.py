"""A user's own training script, unchanged by memdiag: eager TF2 with Horovod's DistributedGradientTape.

A bag-of-words text classifier: an embedding lookup (IndexedSlices gradient) and a dense head.
Run it under memdiag with no code change:

    memdiag run examples/user_tape_eager.py -n 2 --mode sparse -- --steps 4 --tokens 512
"""

import argparse

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=2000)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=512, help="tokens per rank per step")
    args = parser.parse_args()

    hvd.init()
    tf.keras.utils.set_random_seed(7)
    embedding = tf.keras.layers.Embedding(args.vocab, args.width)
    head = tf.keras.layers.Dense(2)
    optimizer = tf.keras.optimizers.SGD(0.1 * hvd.size())
    rng = np.random.default_rng(hvd.rank())

    for step in range(args.steps):
        tokens = rng.integers(0, args.vocab, size=(args.tokens // 16, 16))
        labels = rng.integers(0, 2, size=(args.tokens // 16,))
        with tf.GradientTape() as tape:
            logits = head(tf.reduce_mean(embedding(tokens), axis=1))
            loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True))
        tape = hvd.DistributedGradientTape(tape)
        variables = embedding.trainable_variables + head.trainable_variables
        grads = tape.gradient(loss, variables)
        optimizer.apply_gradients(zip(grads, variables))
        if step == 0:
            hvd.broadcast_variables(variables, root_rank=0)
            hvd.broadcast_variables(optimizer.variables(), root_rank=0)
        if hvd.rank() == 0:
            print(f"step {step} loss {loss.numpy():.4f}", flush=True)


if __name__ == "__main__":
    main()
