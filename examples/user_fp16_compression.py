"""A user's own training script: hvd.DistributedGradientTape(tape, compression=hvd.Compression.fp16).

Dense float32 gradients are cast to float16 before the allreduce and back afterwards (half the bytes
on the wire). Horovod applies compression only on the dense allreduce path: the embedding's
IndexedSlices gradient is still allgathered in float32. Eager custom loop; initial state broadcast
from rank 0 after the first step.

    mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 .venv/bin/python examples/user_fp16_compression.py --steps 4
"""

import argparse
import hashlib

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

SEED = 505


def digest(variables) -> str:
    h = hashlib.blake2b(digest_size=8)
    for v in variables:
        h.update(v.numpy().tobytes())
    return h.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=1000)
    parser.add_argument("--width", type=int, default=48)
    parser.add_argument("--tokens", type=int, default=256, help="tokens per rank per step")
    args = parser.parse_args()

    hvd.init()
    tf.keras.utils.set_random_seed(SEED)
    embedding = tf.keras.layers.Embedding(args.vocab, args.width, name="words")
    hidden = tf.keras.layers.Dense(64, activation="tanh", name="hidden")
    head = tf.keras.layers.Dense(2, name="head")
    optimizer = tf.keras.optimizers.SGD(0.05 * hvd.size(), momentum=0.5)
    rng = np.random.default_rng(SEED + hvd.rank())
    seq = 16

    for step in range(args.steps):
        tokens = rng.integers(0, args.vocab, size=(args.tokens // seq, seq))
        labels = rng.integers(0, 2, size=(args.tokens // seq,))
        with tf.GradientTape() as tape:
            logits = head(hidden(tf.reduce_mean(embedding(tokens), axis=1)))
            loss = tf.reduce_mean(
                tf.keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True))
        tape = hvd.DistributedGradientTape(tape, compression=hvd.Compression.fp16)
        variables = embedding.trainable_variables + hidden.trainable_variables + head.trainable_variables
        grads = tape.gradient(loss, variables)
        optimizer.apply_gradients(zip(grads, variables))
        if step == 0:
            hvd.broadcast_variables(variables, root_rank=0)
            hvd.broadcast_variables(optimizer.variables(), root_rank=0)
        if hvd.rank() == 0:
            print(f"step {step} loss {loss.numpy():.6f}", flush=True)

    if hvd.rank() == 0:
        trainable = embedding.trainable_variables + hidden.trainable_variables + head.trainable_variables
        print(f"final {digest(trainable)}", flush=True)


if __name__ == "__main__":
    main()
