"""A user's own training script: tf.GradientTape + hvd.DistributedGradientTape inside a @tf.function.

A bag-of-words text classifier trained with a custom loop. The train step is a @tf.function (graph
mode); DistributedGradientTape uses its default options, so the embedding's IndexedSlices gradient is
reduced with two allgathers (values, indices) and the dense head's gradients with allreduce. Initial
state is broadcast from rank 0 after the first step, as in Horovod's tensorflow2_mnist.py.

    mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 .venv/bin/python examples/user_tape_function.py --steps 4
"""

import argparse
import hashlib

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

SEED = 101


def digest(variables) -> str:
    h = hashlib.blake2b(digest_size=8)
    for v in variables:
        h.update(v.numpy().tobytes())
    return h.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=1000)
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=256, help="tokens per rank per step")
    args = parser.parse_args()

    hvd.init()
    tf.keras.utils.set_random_seed(SEED)
    embedding = tf.keras.layers.Embedding(args.vocab, args.width, name="words")
    hidden = tf.keras.layers.Dense(args.width, activation="relu", name="hidden")
    head = tf.keras.layers.Dense(4, name="head")
    optimizer = tf.keras.optimizers.SGD(0.05 * hvd.size(), momentum=0.9)
    rng = np.random.default_rng(SEED + hvd.rank())

    def trainable():
        return embedding.trainable_variables + hidden.trainable_variables + head.trainable_variables

    @tf.function
    def train_step(tokens, labels, first_batch):
        with tf.GradientTape() as tape:
            features = tf.reduce_mean(embedding(tokens), axis=1)
            logits = head(hidden(features))
            loss = tf.reduce_mean(
                tf.keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True))
        tape = hvd.DistributedGradientTape(tape)
        variables = trainable()
        grads = tape.gradient(loss, variables)
        optimizer.apply_gradients(zip(grads, variables))
        # Horovod: broadcast initial state after the first step so that optimizer slots exist.
        if first_batch:
            hvd.broadcast_variables(variables, root_rank=0)
            hvd.broadcast_variables(optimizer.variables(), root_rank=0)
        return loss

    seq = 16
    for step in range(args.steps):
        tokens = rng.integers(0, args.vocab, size=(args.tokens // seq, seq))
        labels = rng.integers(0, 4, size=(args.tokens // seq,))
        loss = train_step(tf.constant(tokens), tf.constant(labels), step == 0)
        if hvd.rank() == 0:
            print(f"step {step} loss {loss.numpy():.6f}", flush=True)

    if hvd.rank() == 0:
        print(f"final {digest(trainable())}", flush=True)


if __name__ == "__main__":
    main()
