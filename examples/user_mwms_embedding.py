"""A user's own script with TensorFlow's MultiWorkerMirroredStrategy (no Horovod, no memdiag import).

One worker per MPI rank. An embedding table (vocab x 256, float32) feeds a Dense(1) head; worker r
looks up ``rows_base + rows_step x r`` int32 ids per step (1000 and 1500 at 2 workers), so the
embedding's IndexedSlices gradient has a different number of rows on each worker: MWMS gathers it
padded to the longest worker's rows (docs/explanation/physics.md). The train step is a ``tf.function``
around ``strategy.run``: ``tape.gradient``, then Keras SGD's ``apply_gradients``, which all-reduces
the gradients (a sum over the workers); the loss is summed with ``strategy.reduce``.

With ``--unknown-rows`` the step is traced for ids of any length (``input_signature`` with a ``None``
dimension), so the gradient's row count is known only when the step runs.

The cluster comes from TF_CONFIG when the environment has one (``memdiag run --engine tf-distribute``
writes it); otherwise it is built from ``TF_PORTS`` (one port per worker, on localhost) and the MPI
rank, so that the script also runs under plain mpirun:

    mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 -x TF_PORTS=23456,23457 \\
        .venv/bin/python examples/user_mwms_embedding.py --steps 3

Worker 0 prints ``step {k} loss {loss:.6f}`` per step and ``final {digest}`` (blake2b, 8 bytes, over
the trainable variables). Every worker ends in an MPI barrier, so that worker 0, which leads the
strategy's coordination service, does not leave while the others still run.
"""

import argparse
import hashlib
import json
import os

import numpy as np

SEED = 7


def tf_config_from_env() -> None:
    """TF_CONFIG, unless the environment has one: worker = MPI rank, ports from TF_PORTS."""
    if os.environ.get("TF_CONFIG"):
        return
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
    size = int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))
    ports = [p for p in os.environ.get("TF_PORTS", "").split(",") if p][:size]
    if len(ports) != size:
        raise SystemExit(f"set TF_PORTS to {size} free ports, e.g. TF_PORTS=23456,23457 (or TF_CONFIG)")
    os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": [f"localhost:{p}" for p in ports]},
                                          "task": {"type": "worker", "index": rank}})


def digest(variables) -> str:
    h = hashlib.blake2b(digest_size=8)
    for v in variables:
        h.update(np.ascontiguousarray(v.numpy()).tobytes())
    return h.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=5000)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--rows-base", type=int, default=1000, help="lookups per step on worker 0")
    parser.add_argument("--rows-step", type=int, default=500, help="extra lookups per worker index")
    parser.add_argument("--unknown-rows", action="store_true",
                        help="trace the step for batches of any size (rows unknown until the step runs)")
    args = parser.parse_args()

    tf_config_from_env()
    import tensorflow as tf  # no TensorFlow op before the strategy exists

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    worker = strategy.cluster_resolver.task_id
    tf.keras.utils.set_random_seed(SEED)
    with strategy.scope():  # initial values broadcast from worker 0
        embedding = tf.keras.layers.Embedding(args.vocab, args.width, name="table")
        embedding.build((None,))
        head = tf.keras.layers.Dense(1, name="head")
        head.build((None, args.width))
        optimizer = tf.keras.optimizers.SGD(0.1)
    variables = list(embedding.trainable_variables) + list(head.trainable_variables)
    rows = args.rows_base + args.rows_step * worker
    rng = np.random.default_rng(SEED + worker)

    def step_fn(ids, targets):
        with tf.GradientTape() as tape:
            prediction = tf.squeeze(head(embedding(ids)), axis=1)
            loss = tf.reduce_sum(tf.square(prediction - targets)) / 4096.0  # a global scaling constant
        grads = tape.gradient(loss, variables)  # the table's: IndexedSlices of `rows` rows
        optimizer.apply_gradients(zip(grads, variables))
        return loss

    signature = [tf.TensorSpec([None], tf.int32), tf.TensorSpec([None], tf.float32)] if args.unknown_rows else None

    @tf.function(input_signature=signature)
    def train_step(ids, targets):
        return strategy.reduce("SUM", strategy.run(step_fn, args=(ids, targets)), axis=None)

    for step in range(args.steps):
        ids = tf.constant(rng.integers(0, args.vocab, rows), tf.int32)
        targets = tf.constant(rng.standard_normal(rows), tf.float32)
        loss = train_step(ids, targets)
        if worker == 0:
            print(f"step {step} loss {float(loss):.6f}", flush=True)
    if worker == 0:
        print(f"final {digest(variables)}", flush=True)

    from mpi4py import MPI

    MPI.COMM_WORLD.Barrier()


if __name__ == "__main__":
    main()
