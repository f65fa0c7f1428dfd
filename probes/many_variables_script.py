"""A Horovod script with many small variables (1,000 by default): a stand-in for a job whose gradient
reduction is hundreds of small allreduces, where memdiag's per-tensor work at trace time shows.

A ``tf.function`` step over ``hvd.DistributedGradientTape``, ``hvd.broadcast_variables`` after the first
step, as Horovod's TF2 examples do. Seeded; prints each step's loss and a final digest of the variables.

    mpirun -np 2 python probes/many_variables_script.py [--variables 1000] [--steps 5]
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import horovod.tensorflow as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--variables", type=int, default=1000)
    parser.add_argument("--size", type=int, default=16, help="elements of each variable")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--times", action="store_true", help="print each step's wall time too")
    args = parser.parse_args()
    hvd.init()
    tf.random.set_seed(1)
    weights = [tf.Variable(tf.random.normal([args.size]), name=f"w{i}") for i in range(args.variables)]
    optimizer = tf.keras.optimizers.SGD(0.01)
    data = tf.random.normal([8, args.size], seed=hvd.rank() + 1)

    @tf.function
    def step(first: bool) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = tf.add_n([tf.reduce_sum(tf.square(data * w)) for w in weights])
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, weights)
        optimizer.apply_gradients(zip(grads, weights))
        if first:
            hvd.broadcast_variables(weights, root_rank=0)
            hvd.broadcast_variables(optimizer.variables(), root_rank=0)
        return loss

    for i in range(args.steps):
        start = time.perf_counter()
        loss = float(step(i == 0))
        took = f" time {time.perf_counter() - start:.3f} s" if args.times else ""
        if hvd.rank() == 0:
            print(f"step {i} loss {loss:.6f}{took}", flush=True)
    if hvd.rank() == 0:
        digest = float(np.sum([np.sum(w.numpy()) for w in weights]))
        print(f"final {digest:.6f}", flush=True)


if __name__ == "__main__":
    main()
