"""A user's own training script: hvd.SyncBatchNormalization in a small Keras model.

Embedding -> mean pooling -> Dense -> hvd.SyncBatchNormalization -> ReLU -> Dense. In training mode
SyncBatchNormalization computes the batch mean and variance over all ranks: its forward pass calls
Horovod's _allreduce (op Sum) on the stacked per-rank statistics, and the backward pass allreduces
again. Gradients are reduced with DistributedGradientTape inside a @tf.function train step; the model
(including the moving statistics, which are not trainable) is broadcast from rank 0 before training.

    mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 .venv/bin/python examples/user_sync_batchnorm.py --steps 4
"""

import argparse
import hashlib

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

SEED = 808


def digest(variables) -> str:
    h = hashlib.blake2b(digest_size=8)
    for v in variables:
        h.update(v.numpy().tobytes())
    return h.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=700)
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=256, help="tokens per rank per step")
    args = parser.parse_args()

    hvd.init()
    tf.keras.utils.set_random_seed(SEED)
    seq = 16
    model = tf.keras.Sequential([
        tf.keras.layers.Embedding(args.vocab, args.width, name="words"),
        tf.keras.layers.GlobalAveragePooling1D(),
        tf.keras.layers.Dense(args.width, name="hidden"),
        hvd.SyncBatchNormalization(name="sync_bn"),
        tf.keras.layers.ReLU(),
        tf.keras.layers.Dense(3, name="head"),
    ])
    model.build((None, seq))
    hvd.broadcast_variables(model.variables, root_rank=0)
    optimizer = tf.keras.optimizers.SGD(0.1 * hvd.size())
    rng = np.random.default_rng(SEED + hvd.rank())

    @tf.function
    def train_step(tokens, labels):
        with tf.GradientTape() as tape:
            logits = model(tokens, training=True)
            loss = tf.reduce_mean(
                tf.keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    for step in range(args.steps):
        tokens = rng.integers(0, args.vocab, size=(args.tokens // seq, seq))
        labels = rng.integers(0, 3, size=(args.tokens // seq,))
        loss = train_step(tf.constant(tokens), tf.constant(labels))
        if hvd.rank() == 0:
            print(f"step {step} loss {loss.numpy():.6f}", flush=True)

    if hvd.rank() == 0:
        print(f"final {digest(model.trainable_variables)}", flush=True)


if __name__ == "__main__":
    main()
