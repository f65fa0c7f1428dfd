"""A user's own training script: a large embedding table looked up with heavily repeated ids.

A bag-of-words classifier over a vocabulary of a million ids whose lookups follow a Zipf law (a few
ids make most of the text, as words do). The train step is a @tf.function with
hvd.DistributedGradientTape at its default options, so the table's IndexedSlices gradient (one row
per token: 196,608 rows per rank) is reduced with two allgathers, while those rows hold only about
41,000 distinct ids (U/T = 0.21). Plain SGD from tf.keras.optimizers.legacy (no slots; its sparse
update scatters into the table in place), so the table, its gradient and the gathered rows are the memory
that matters. Initial state is broadcast from rank 0 after the first step.

    mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 .venv/bin/python examples/user_repetitive_lookups.py --steps 4
"""

import argparse
import hashlib

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

SEED = 211


def digest(variables) -> str:
    h = hashlib.blake2b(digest_size=8)
    for v in variables:
        h.update(v.numpy().tobytes())
    return h.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=1_000_000)
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=196_608, help="tokens per rank per step")
    parser.add_argument("--zipf", type=float, default=1.1, help="exponent of the ids' Zipf law")
    args = parser.parse_args()

    hvd.init()
    tf.keras.utils.set_random_seed(SEED)
    # The sparse update sums a few thousand duplicate rows per id; without this, TensorFlow sums them
    # in an order that varies from run to run, and the final parameters with it.
    tf.config.experimental.enable_op_determinism()
    embedding = tf.keras.layers.Embedding(args.vocab, args.width, name="ids")
    head = tf.keras.layers.Dense(4, name="head")
    optimizer = tf.keras.optimizers.legacy.SGD(0.5 * hvd.size())
    rng = np.random.default_rng(SEED + hvd.rank())
    weights = 1.0 / np.arange(1, args.vocab + 1, dtype=np.float64) ** args.zipf
    weights /= weights.sum()

    def trainable():
        return embedding.trainable_variables + head.trainable_variables

    @tf.function
    def train_step(tokens, labels, first_batch):
        with tf.GradientTape() as tape:
            features = tf.reduce_mean(embedding(tokens), axis=1)
            logits = head(features)
            loss = tf.reduce_mean(
                tf.keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True))
        tape = hvd.DistributedGradientTape(tape)
        variables = trainable()
        grads = tape.gradient(loss, variables)
        optimizer.apply_gradients(zip(grads, variables))
        if first_batch:
            hvd.broadcast_variables(variables, root_rank=0)
            hvd.broadcast_variables(optimizer.variables(), root_rank=0)
        return loss

    seq = 64
    for step in range(args.steps):
        tokens = rng.choice(args.vocab, size=(args.tokens // seq, seq), p=weights)
        labels = (tokens[:, 0] % 4).astype(np.int64)
        loss = train_step(tf.constant(tokens), tf.constant(labels), step == 0)
        if hvd.rank() == 0:
            print(f"step {step} loss {loss.numpy():.6f}", flush=True)

    if hvd.rank() == 0:
        print(f"final {digest(trainable())}", flush=True)


if __name__ == "__main__":
    main()
