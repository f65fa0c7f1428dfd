"""A user's own training script: hvd.DistributedGradientTape(tape, op=hvd.Sum).

Gradients are summed, not averaged, across ranks (so the learning rate is not scaled by the rank
count). The embedding is a tf.Variable read with tf.gather, whose IndexedSlices gradient Horovod
reduces with two allgathers and no division by the rank count; the dense head goes through allreduce
with op Sum. Eager custom loop; initial variables broadcast from rank 0 before training.

    mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 .venv/bin/python examples/user_sum_op.py --steps 4
"""

import argparse
import hashlib

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

SEED = 303


def digest(variables) -> str:
    h = hashlib.blake2b(digest_size=8)
    for v in variables:
        h.update(v.numpy().tobytes())
    return h.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=1200)
    parser.add_argument("--width", type=int, default=24)
    parser.add_argument("--tokens", type=int, default=320, help="tokens per rank per step")
    args = parser.parse_args()

    hvd.init()
    tf.keras.utils.set_random_seed(SEED)
    table = tf.Variable(tf.random.normal((args.vocab, args.width), stddev=0.1), name="table")
    w = tf.Variable(tf.random.normal((args.width, 1), stddev=0.1), name="w")
    b = tf.Variable(tf.zeros((1,)), name="b")
    variables = [table, w, b]
    hvd.broadcast_variables(variables, root_rank=0)
    # Summed gradients: the per-rank learning rate is not multiplied by hvd.size().
    optimizer = tf.keras.optimizers.SGD(0.05)
    rng = np.random.default_rng(SEED + hvd.rank())
    seq = 10

    for step in range(args.steps):
        ids = rng.integers(0, args.vocab, size=(args.tokens // seq, seq))
        target = rng.standard_normal(args.tokens // seq).astype(np.float32)
        with tf.GradientTape() as tape:
            features = tf.reduce_mean(tf.gather(table, ids), axis=1)
            pred = tf.squeeze(tf.matmul(features, w) + b, axis=1)
            loss = tf.reduce_mean((pred - target) ** 2)
        tape = hvd.DistributedGradientTape(tape, op=hvd.Sum)
        grads = tape.gradient(loss, variables)
        optimizer.apply_gradients(zip(grads, variables))
        if hvd.rank() == 0:
            print(f"step {step} loss {loss.numpy():.6f}", flush=True)

    if hvd.rank() == 0:
        print(f"final {digest(variables)}", flush=True)


if __name__ == "__main__":
    main()
