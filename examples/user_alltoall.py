"""A user's own training script: hvd.alltoall(tensor, splits=...) inside the training step.

Each rank embeds its own batch of sequences, then exchanges rows of pooled features with every other
rank through an uneven hvd.alltoall (rank r sends a rotated split pattern, so send and receive splits
differ); the labels travel with the same splits. Each rank computes the loss on the rows it received.
hvd.alltoall is differentiable: the backward pass sends the feature gradients home with a second
alltoall. Then gradients are reduced as usual with DistributedGradientTape (IndexedSlices allgather
for the embedding, allreduce for the head). In Horovod 0.28.1 alltoall with splits returns
(output, received_splits). Eager custom loop; variables broadcast from rank 0 before training.

    mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 .venv/bin/python examples/user_alltoall.py --steps 4
"""

import argparse
import hashlib

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

SEED = 707


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
    parser.add_argument("--rows", type=int, default=24, help="sequences per rank per step")
    args = parser.parse_args()

    hvd.init()
    tf.keras.utils.set_random_seed(SEED)
    seq = 12
    size, rank = hvd.size(), hvd.rank()
    embedding = tf.keras.layers.Embedding(args.vocab, args.width, name="words")
    head = tf.keras.layers.Dense(4, name="head")
    head(tf.reduce_mean(embedding(tf.zeros((1, seq), tf.int32)), axis=1))  # build the layers
    variables = embedding.trainable_variables + head.trainable_variables
    hvd.broadcast_variables(variables, root_rank=0)
    optimizer = tf.keras.optimizers.SGD(0.1 * size)
    rng = np.random.default_rng(SEED + rank)

    # Uneven split pattern summing to --rows, rotated by rank: rank r sends splits[j] rows to rank j.
    small = args.rows // (2 * size)
    pattern = np.array([args.rows - small * (size - 1)] + [small] * (size - 1), dtype=np.int32)
    splits = tf.constant(np.roll(pattern, rank))

    for step in range(args.steps):
        tokens = rng.integers(0, args.vocab, size=(args.rows, seq))
        labels = rng.integers(0, 4, size=(args.rows,)).astype(np.int32)
        with tf.GradientTape() as tape:
            pooled = tf.reduce_mean(embedding(tokens), axis=1)
            received, received_splits = hvd.alltoall(pooled, splits=splits, name="features")
            received_labels, _ = hvd.alltoall(tf.constant(labels), splits=splits, name="labels")
            logits = head(received)
            loss = tf.reduce_mean(
                tf.keras.losses.sparse_categorical_crossentropy(received_labels, logits, from_logits=True))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, variables)
        optimizer.apply_gradients(zip(grads, variables))
        if rank == 0:
            print(f"step {step} loss {loss.numpy():.6f}", flush=True)

    if rank == 0:
        print(f"final {digest(variables)}", flush=True)


if __name__ == "__main__":
    main()
