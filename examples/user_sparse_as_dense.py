"""A user's own training script: hvd.DistributedGradientTape(tape, sparse_as_dense=True), eager mode.

A bag-of-words text classifier (embedding lookup + dense head) in an eager custom loop. With
sparse_as_dense=True Horovod converts the embedding's IndexedSlices gradient to a dense
(vocab x width) tensor and allreduces it, so no allgather is issued. Initial variables are broadcast
from rank 0 before the first step (the model is built on a dummy batch first).

    mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 .venv/bin/python examples/user_sparse_as_dense.py --steps 4
"""

import argparse
import hashlib

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

SEED = 202


def digest(variables) -> str:
    h = hashlib.blake2b(digest_size=8)
    for v in variables:
        h.update(v.numpy().tobytes())
    return h.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=800)
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=256, help="tokens per rank per step")
    args = parser.parse_args()

    hvd.init()
    tf.keras.utils.set_random_seed(SEED)
    seq = 16
    model = tf.keras.Sequential([
        tf.keras.layers.Embedding(args.vocab, args.width, name="words"),
        tf.keras.layers.GlobalAveragePooling1D(),
        tf.keras.layers.Dense(3, name="head"),
    ])
    model.build((None, seq))
    # Plain SGD has no slot variables, so everything can be broadcast before training.
    optimizer = tf.keras.optimizers.SGD(0.1 * hvd.size())
    hvd.broadcast_variables(model.variables, root_rank=0)
    rng = np.random.default_rng(SEED + hvd.rank())

    for step in range(args.steps):
        tokens = rng.integers(0, args.vocab, size=(args.tokens // seq, seq))
        labels = rng.integers(0, 3, size=(args.tokens // seq,))
        with tf.GradientTape() as tape:
            logits = model(tokens, training=True)
            loss = tf.reduce_mean(
                tf.keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True))
        tape = hvd.DistributedGradientTape(tape, sparse_as_dense=True)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        if hvd.rank() == 0:
            print(f"step {step} loss {loss.numpy():.6f}", flush=True)

    if hvd.rank() == 0:
        print(f"final {digest(model.trainable_variables)}", flush=True)


if __name__ == "__main__":
    main()
