"""A user's own training script that does NOT seed TensorFlow (deliberately).

Like user_tape_eager.py: eager TF2, an embedding lookup (IndexedSlices gradient) and a dense head,
hvd.DistributedGradientTape with default options. TensorFlow's global seed is never set, so every
run starts from different initial parameters; within a run, broadcasting rank 0's variables before
training makes the ranks agree. The data come from a seeded NumPy generator, so the only difference
between two runs is the initialisation: loss lines and the final digest change from run to run.
Useful to check that a tool reports "the script does not seed itself".

    mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 .venv/bin/python examples/user_unseeded.py --steps 4
"""

import argparse
import hashlib

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

DATA_SEED = 1212


def digest(variables) -> str:
    h = hashlib.blake2b(digest_size=8)
    for v in variables:
        h.update(v.numpy().tobytes())
    return h.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=2000)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=512, help="tokens per rank per step")
    args = parser.parse_args()

    hvd.init()
    # No tf.keras.utils.set_random_seed / tf.random.set_seed here, on purpose.
    seq = 16
    embedding = tf.keras.layers.Embedding(args.vocab, args.width)
    head = tf.keras.layers.Dense(2)
    head(tf.reduce_mean(embedding(tf.zeros((1, seq), tf.int32)), axis=1))  # build the layers
    variables = embedding.trainable_variables + head.trainable_variables
    hvd.broadcast_variables(variables, root_rank=0)
    optimizer = tf.keras.optimizers.SGD(0.1 * hvd.size())
    rng = np.random.default_rng(DATA_SEED + hvd.rank())

    for step in range(args.steps):
        tokens = rng.integers(0, args.vocab, size=(args.tokens // seq, seq))
        labels = rng.integers(0, 2, size=(args.tokens // seq,))
        with tf.GradientTape() as tape:
            logits = head(tf.reduce_mean(embedding(tokens), axis=1))
            loss = tf.reduce_mean(
                tf.keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, variables)
        optimizer.apply_gradients(zip(grads, variables))
        if hvd.rank() == 0:
            print(f"step {step} loss {loss.numpy():.6f}", flush=True)

    if hvd.rank() == 0:
        print(f"final {digest(variables)}", flush=True)


if __name__ == "__main__":
    main()
