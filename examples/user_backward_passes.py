"""A user's own Keras script: hvd.DistributedOptimizer(opt, backward_passes_per_step=2, sparse_as_dense=True).

model.compile + model.fit with horovod.tensorflow.keras. The optimizer is built outside any
tf.function, so Horovod 0.28.1 uses its LocalGradientAggregationHelperEager: every batch adds the
(densified) gradients into local aggregation variables, and only every 2nd batch are they allreduced
(inside a tf.cond) and applied; on the other batches only the optimizer's iteration counter moves.
The helper raises ValueError for an IndexedSlices gradient unless sparse_as_dense=True, so the
embedding gradient is densified before aggregation: no allgather. Gradients are summed over the 2
passes, not averaged (average_aggregated_gradients=False, the default). The legacy Keras optimizer is
used, as Horovod's Keras integration expects with TF >= 2.11. Initial state is broadcast by
hvd.callbacks.BroadcastGlobalVariablesCallback(0) at the end of the first batch.

Rank 0 prints, per batch, the loss Keras reports in its logs (the running mean over the epoch).

    mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 .venv/bin/python examples/user_backward_passes.py --steps 4
"""

import argparse
import hashlib

import horovod.tensorflow.keras as hvd
import numpy as np
import tensorflow as tf

SEED = 1111


def digest(variables) -> str:
    h = hashlib.blake2b(digest_size=8)
    for v in variables:
        h.update(v.numpy().tobytes())
    return h.hexdigest()


class PrintLoss(tf.keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        print(f"step {batch} loss {logs['loss']:.6f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=4, help="batches (one epoch); a multiple of 2")
    parser.add_argument("--vocab", type=int, default=1500)
    parser.add_argument("--seq", type=int, default=16)
    parser.add_argument("--batch", type=int, default=16)
    args = parser.parse_args()

    hvd.init()
    tf.keras.utils.set_random_seed(SEED)
    model = tf.keras.Sequential([
        tf.keras.layers.Embedding(args.vocab, 32, name="words"),
        tf.keras.layers.GlobalAveragePooling1D(),
        tf.keras.layers.Dense(32, activation="relu", name="hidden"),
        tf.keras.layers.Dense(4, name="head"),
    ])
    optimizer = hvd.DistributedOptimizer(
        tf.keras.optimizers.legacy.SGD(0.05 * hvd.size(), momentum=0.9),
        backward_passes_per_step=2,
        sparse_as_dense=True,
    )
    model.compile(optimizer=optimizer,
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(SEED + hvd.rank())
    x = rng.integers(0, args.vocab, size=(args.batch * args.steps, args.seq))
    y = rng.integers(0, 4, size=(args.batch * args.steps,))
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0)]
    if hvd.rank() == 0:
        callbacks.append(PrintLoss())
    model.fit(x, y, batch_size=args.batch, epochs=1, callbacks=callbacks, verbose=0)

    if hvd.rank() == 0:
        print(f"final {digest(model.trainable_variables)}", flush=True)


if __name__ == "__main__":
    main()
