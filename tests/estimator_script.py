"""A tf.estimator job with an embedding, written as Horovod's estimator example is, for the tests.

``model_fn`` looks ids up in a table (an IndexedSlices gradient) and feeds a dense head; the optimizer is
``hvd.DistributedOptimizer`` over ``tf.compat.v1.train.AdamOptimizer``, ``minimize``d; the input is a
``tf.data`` pipeline of ids drawn per rank (seeded by rank); ``hvd.BroadcastGlobalVariablesHook`` on
``Estimator.train(steps=...)``; a model directory per rank, where the estimator writes its checkpoint.
Rank 0 prints ``final DIGEST`` of the trained variables.

    mpirun -np 2 python tests/estimator_script.py --steps 4 --model-dir MODEL_DIR
"""

import argparse
import hashlib
import os

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

VOCAB, WIDTH, BATCH, IDS = 4000, 32, 64, 8


def input_fn(rank: int):
    rng = np.random.default_rng(1000 + rank)
    ids = rng.integers(0, VOCAB, size=(BATCH * 64, IDS), dtype=np.int64)
    labels = (ids.sum(axis=1) % 2).astype(np.int64)
    return tf.data.Dataset.from_tensor_slices(({"ids": ids}, labels)).repeat().batch(BATCH)


def model_fn(features, labels, mode):
    table = tf.compat.v1.get_variable("table", [VOCAB, WIDTH],
                                      initializer=tf.compat.v1.random_uniform_initializer(-0.1, 0.1, seed=3))
    pooled = tf.reduce_mean(tf.nn.embedding_lookup(table, features["ids"]), axis=1)
    logits = tf.compat.v1.layers.dense(pooled, 2, kernel_initializer=tf.compat.v1.glorot_uniform_initializer(seed=4))
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels=labels, logits=logits)
    optimizer = hvd.DistributedOptimizer(tf.compat.v1.train.AdamOptimizer(0.01 * hvd.size()))
    train_op = optimizer.minimize(loss, global_step=tf.compat.v1.train.get_or_create_global_step())
    return tf.estimator.EstimatorSpec(mode=mode, loss=loss, train_op=train_op)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--model-dir", required=True)
    args = parser.parse_args()
    hvd.init()
    model_dir = os.path.join(args.model_dir, f"rank-{hvd.rank()}")  # one directory per rank: no shared writes
    config = tf.estimator.RunConfig(model_dir=model_dir, save_summary_steps=None, tf_random_seed=5, log_step_count_steps=None)
    estimator = tf.estimator.Estimator(model_fn=model_fn, config=config)
    estimator.train(input_fn=lambda: input_fn(hvd.rank()), steps=args.steps,
                    hooks=[hvd.BroadcastGlobalVariablesHook(0)])
    if hvd.rank() == 0:
        digest = hashlib.blake2b(digest_size=8)
        for name in sorted(estimator.get_variable_names()):
            if name.startswith(("table", "dense")) and "Adam" not in name:
                digest.update(np.asarray(estimator.get_variable_value(name)).tobytes())
        print(f"final {digest.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
