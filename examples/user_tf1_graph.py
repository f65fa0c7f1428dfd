"""A user's own training script in TensorFlow 1 style: a graph, a session and Horovod's optimizer wrapper.

The style of the reference Transformer work and of many production scripts: eager execution is off,
variables come from ``tf.compat.v1.get_variable``, ``hvd.DistributedOptimizer`` wraps a
``tf.compat.v1.train`` optimizer, ``hvd.broadcast_global_variables(0)`` runs once after initialisation
and every step is a ``Session.run`` of the train op. The embedding lookup (``tf.nn.embedding_lookup``)
gives an IndexedSlices gradient, which Horovod reduces with two allgathers (values, indices); the
dense head's gradients are allreduced.

    mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 .venv/bin/python examples/user_tf1_graph.py --steps 4
"""

import argparse
import hashlib

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

SEED = 131


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=1200)
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=384, help="tokens per rank per step")
    args = parser.parse_args()

    tf.compat.v1.disable_eager_execution()
    hvd.init()
    tf.compat.v1.set_random_seed(SEED)
    seq = 12
    batch = args.tokens // seq
    tokens = tf.compat.v1.placeholder(tf.int64, [batch, seq], name="tokens")
    labels = tf.compat.v1.placeholder(tf.int64, [batch], name="labels")
    embeddings = tf.compat.v1.get_variable("embeddings", [args.vocab, args.width],
                                           initializer=tf.compat.v1.random_normal_initializer(stddev=0.1))
    kernel = tf.compat.v1.get_variable("head/kernel", [args.width, 3])
    bias = tf.compat.v1.get_variable("head/bias", [3], initializer=tf.compat.v1.zeros_initializer())
    features = tf.reduce_mean(tf.nn.embedding_lookup(embeddings, tokens), axis=1)
    logits = tf.matmul(features, kernel) + bias
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
    optimizer = hvd.DistributedOptimizer(tf.compat.v1.train.MomentumOptimizer(0.05 * hvd.size(), 0.9))
    train_op = optimizer.minimize(loss, global_step=tf.compat.v1.train.get_or_create_global_step())
    broadcast = hvd.broadcast_global_variables(0)
    trainable = tf.compat.v1.trainable_variables()

    rng = np.random.default_rng(SEED + hvd.rank())
    with tf.compat.v1.Session() as session:
        session.run(tf.compat.v1.global_variables_initializer())
        session.run(broadcast)
        for step in range(args.steps):
            feed = {tokens: rng.integers(0, args.vocab, size=(batch, seq)), labels: rng.integers(0, 3, size=(batch,))}
            value, _ = session.run([loss, train_op], feed_dict=feed)
            if hvd.rank() == 0:
                print(f"step {step} loss {value:.6f}", flush=True)
        values = session.run(trainable)
    if hvd.rank() == 0:
        digest = hashlib.blake2b(digest_size=8)
        for array in values:
            digest.update(array.tobytes())
        print(f"final {digest.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
