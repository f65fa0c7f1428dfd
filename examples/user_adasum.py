"""A user's own training script: hvd.DistributedGradientTape(tape, op=hvd.Adasum, sparse_as_dense=True).

Adasum combines gradients adaptively instead of averaging them. Horovod 0.28.1 raises
NotImplementedError for an IndexedSlices gradient under Adasum, so the embedding's gradient is
densified with sparse_as_dense=True; Adasum also needs a power-of-two rank count (1, 2, 4, ...). As
Horovod's Adasum guide recommends for CPU runs, the learning rate is not scaled by hvd.size().
Train step is a @tf.function; initial state broadcast from rank 0 after the first step.

    mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 .venv/bin/python examples/user_adasum.py --steps 4
"""

import argparse
import hashlib

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

SEED = 404


def digest(variables) -> str:
    h = hashlib.blake2b(digest_size=8)
    for v in variables:
        h.update(v.numpy().tobytes())
    return h.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=600)
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=256, help="tokens per rank per step")
    args = parser.parse_args()

    hvd.init()
    tf.keras.utils.set_random_seed(SEED)
    embedding = tf.keras.layers.Embedding(args.vocab, args.width, name="words")
    head = tf.keras.layers.Dense(5, name="head")
    optimizer = tf.keras.optimizers.Adam(1e-2)
    rng = np.random.default_rng(SEED + hvd.rank())

    def trainable():
        return embedding.trainable_variables + head.trainable_variables

    @tf.function
    def train_step(tokens, labels, first_batch):
        with tf.GradientTape() as tape:
            logits = head(tf.reduce_mean(embedding(tokens), axis=1))
            loss = tf.reduce_mean(
                tf.keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True))
        tape = hvd.DistributedGradientTape(tape, op=hvd.Adasum, sparse_as_dense=True)
        variables = trainable()
        grads = tape.gradient(loss, variables)
        optimizer.apply_gradients(zip(grads, variables))
        if first_batch:
            hvd.broadcast_variables(variables, root_rank=0)
            hvd.broadcast_variables(optimizer.variables(), root_rank=0)
        return loss

    seq = 16
    for step in range(args.steps):
        tokens = rng.integers(0, args.vocab, size=(args.tokens // seq, seq))
        labels = rng.integers(0, 5, size=(args.tokens // seq,))
        loss = train_step(tf.constant(tokens), tf.constant(labels), step == 0)
        if hvd.rank() == 0:
            print(f"step {step} loss {loss.numpy():.6f}", flush=True)

    if hvd.rank() == 0:
        print(f"final {digest(trainable())}", flush=True)


if __name__ == "__main__":
    main()
