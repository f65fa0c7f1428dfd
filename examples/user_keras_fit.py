"""A user's own Keras script, unchanged by memdiag: model.fit with Horovod's DistributedOptimizer.

Run it under memdiag with no code change:

    memdiag run examples/user_keras_fit.py -n 2 --mode auto -- --epochs 1
"""

import argparse

import horovod.tensorflow.keras as hvd
import numpy as np
import tensorflow as tf


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=3000)
    parser.add_argument("--seq", type=int, default=32)
    args = parser.parse_args()

    hvd.init()
    tf.keras.utils.set_random_seed(11)
    model = tf.keras.Sequential([
        tf.keras.layers.Embedding(args.vocab, 32),
        tf.keras.layers.GlobalAveragePooling1D(),
        tf.keras.layers.Dense(4),
    ])
    optimizer = hvd.DistributedOptimizer(tf.keras.optimizers.legacy.Adam(1e-3 * hvd.size()))
    model.compile(optimizer=optimizer,
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(hvd.rank())
    batch = 16
    x = rng.integers(0, args.vocab, size=(batch * args.batches, args.seq))
    y = rng.integers(0, 4, size=(batch * args.batches,))
    model.fit(x, y, batch_size=batch, epochs=args.epochs,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)],
              verbose=2 if hvd.rank() == 0 else 0)


if __name__ == "__main__":
    main()
