"""A TF1 script in the style Horovod's word2vec example and most TF1-era jobs use, for the tests.

TensorFlow 1 behaviour throughout (``tf.compat.v1.disable_v2_behavior()``: graph mode, TF1 shapes, whose
unknown sizes are Dimension objects), placeholders of unknown batch size, and a random batch size on
every rank and step (seeded by rank, so that a run repeats). Two styles:

- ``session``: an embedding lookup and a sampled loss (``tf.nn.nce_loss``): three IndexedSlices gradients
  (the embeddings, the NCE weights and biases); ``hvd.DistributedOptimizer`` over
  ``GradientDescentOptimizer``, ``minimize``, a ``Session`` and ``hvd.broadcast_global_variables``.
- ``monitored``: ``compute_gradients`` / ``apply_gradients`` of ``hvd.DistributedOptimizer`` over
  ``AdamOptimizer`` for a table and a kernel, a second table whose gradient the script reduces itself
  with ``hvd.allreduce`` in the graph, ``MonitoredTrainingSession`` with ``hvd.BroadcastGlobalVariablesHook``
  and ``StopAtStepHook``.

``--unseeded data`` draws the batches from an unseeded generator (the graph's seed stays: the same initial
parameters every run); ``--unseeded all`` seeds nothing, as many scripts do.

Rank 0 prints ``step K loss X`` every step, and in the session style ``final DIGEST`` of the trainable
variables at the end.
"""

import argparse
import hashlib
import math
import random

import horovod.tensorflow as hvd
import numpy as np
import tensorflow.compat.v1 as tf

VOCAB, WIDTH = 5000, 32


def batch_size(rng: random.Random) -> int:
    return rng.randint(32, 96)


def session_style(steps: int, seeded: bool) -> None:
    rng = random.Random(17 + hvd.rank()) if seeded else random.Random()
    inputs = tf.placeholder(tf.int32, shape=[None])
    labels = tf.placeholder(tf.int32, shape=[None, 1])
    embeddings = tf.Variable(tf.random_uniform([VOCAB, WIDTH], -1.0, 1.0))
    embed = tf.nn.embedding_lookup(embeddings, inputs)
    nce_weights = tf.Variable(tf.truncated_normal([VOCAB, WIDTH], stddev=1.0 / math.sqrt(WIDTH)))
    nce_biases = tf.Variable(tf.zeros([VOCAB]))
    loss = tf.reduce_mean(tf.nn.nce_loss(weights=nce_weights, biases=nce_biases, labels=labels, inputs=embed,
                                         num_sampled=16, num_classes=VOCAB))
    train_op = hvd.DistributedOptimizer(tf.train.GradientDescentOptimizer(0.5 * hvd.size())).minimize(loss)
    init, broadcast = tf.global_variables_initializer(), hvd.broadcast_global_variables(0)
    with tf.Session() as session:
        init.run()
        broadcast.run()
        for step in range(steps):
            size = batch_size(rng)
            feed = {inputs: [rng.randrange(VOCAB) for _ in range(size)],
                    labels: [[rng.randrange(VOCAB)] for _ in range(size)]}
            _, value = session.run([train_op, loss], feed_dict=feed)
            if hvd.rank() == 0:
                print(f"step {step} loss {value:.6f}", flush=True)
        report(session.run(tf.trainable_variables()))


def monitored_style(steps: int, seeded: bool) -> None:
    rng = np.random.RandomState(23 + hvd.rank() if seeded else None)
    ids = tf.placeholder(tf.int64, [None], name="ids")
    side_ids = tf.placeholder(tf.int64, [None], name="side_ids")
    target = tf.placeholder(tf.float32, [None], name="target")
    with tf.variable_scope("model"):
        table = tf.get_variable("table", [VOCAB, WIDTH], initializer=tf.random_normal_initializer(stddev=0.05))
        side = tf.get_variable("side", [VOCAB, WIDTH], initializer=tf.random_normal_initializer(stddev=0.05))
        kernel = tf.get_variable("kernel", [WIDTH, 1])
    lookup = tf.nn.embedding_lookup(table, ids) + tf.reduce_mean(tf.nn.embedding_lookup(side, side_ids), 0)
    loss = tf.reduce_mean(tf.square(tf.squeeze(tf.matmul(lookup, kernel), 1) - target))
    global_step = tf.train.get_or_create_global_step()
    optimizer = hvd.DistributedOptimizer(tf.train.AdamOptimizer(1e-3 * hvd.size()))
    grads_and_vars = optimizer.compute_gradients(loss, var_list=[table, kernel])
    [side_grad] = tf.gradients(loss, [side])
    side_step = tf.train.GradientDescentOptimizer(0.1).apply_gradients([(hvd.allreduce(side_grad), side)])
    train_op = tf.group(optimizer.apply_gradients(grads_and_vars, global_step=global_step), side_step)
    hooks = [hvd.BroadcastGlobalVariablesHook(0), tf.train.StopAtStepHook(last_step=steps)]
    with tf.train.MonitoredTrainingSession(hooks=hooks) as session:
        while not session.should_stop():
            size = int(rng.randint(32, 96))
            feed = {ids: rng.randint(0, VOCAB, size), side_ids: rng.randint(0, VOCAB, 8),
                    target: rng.randn(size).astype(np.float32)}
            _, value, step = session.run([train_op, loss, global_step], feed_dict=feed)
            if hvd.rank() == 0:
                print(f"step {step - 1} loss {value:.6f}", flush=True)


def report(values: list) -> None:
    if hvd.rank() == 0:
        digest = hashlib.blake2b(digest_size=8)
        for array in values:
            digest.update(np.asarray(array).tobytes())
        print(f"final {digest.hexdigest()}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--style", choices=("session", "monitored"), default="session")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--unseeded", choices=("data", "all"))
    args = parser.parse_args()
    tf.disable_v2_behavior()
    hvd.init()
    if args.unseeded != "all":
        tf.set_random_seed(131)
    (session_style if args.style == "session" else monitored_style)(args.steps, args.unseeded is None)


if __name__ == "__main__":
    main()
