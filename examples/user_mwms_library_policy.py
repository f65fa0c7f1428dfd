"""memdiag's policy as a library call in a plain MultiWorkerMirroredStrategy script (no Horovod).

The model and data of ``user_mwms_embedding.py``: a 5000 x 256 float32 table and a Dense(1) head;
worker r looks up ``rows_base + rows_step x r`` int32 ids per step (1000 and 1500 at 2 workers), so
the table's IndexedSlices gradient has uneven rows and MWMS gathers it padded to the longest worker's.
The one change: between ``tape.gradient`` and the optimizer, inside ``strategy.run``,

    grads = memdiag.tensorflow.densify_gradients(grads, variables, mode=args.mode)

``auto`` densifies the table when N x max_rows x (row + index) > its dense bytes, decided once, when
the step is traced, alike on every worker (rows agreed through TensorFlow's coordination service).
Keras 2's ``apply_gradients`` and Keras 3's ``apply`` both take the result.

    mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 -x TF_PORTS=23456,23457 \\
        .venv/bin/python examples/user_mwms_library_policy.py --steps 3 --mode auto
    memdiag run examples/user_mwms_library_policy.py -n 4 --engine tf-distribute -- --steps 3 --mode auto

Worker 0 prints ``decision {json}`` per IndexedSlices variable, ``step {k} loss {loss:.6f}`` per step
and ``final {digest}``; every worker ends in an MPI barrier (as user_mwms_embedding.py).
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
    parser.add_argument("--mode", choices=["sparse", "dense", "auto"], default="auto")
    parser.add_argument("--margin", type=float, default=1.0)
    parser.add_argument("--vocab", type=int, default=5000)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--rows-base", type=int, default=1000, help="lookups per step on worker 0")
    parser.add_argument("--rows-step", type=int, default=500, help="extra lookups per worker index")
    args = parser.parse_args()

    tf_config_from_env()
    import tensorflow as tf  # no TensorFlow op before the strategy exists

    import memdiag.tensorflow as mdt

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
    keras3 = hasattr(optimizer, "apply")  # Keras 3; Keras 2's optimizer has apply_gradients only

    def step_fn(ids, targets):
        with tf.GradientTape() as tape:
            prediction = tf.squeeze(head(embedding(ids)), axis=1)
            loss = tf.reduce_sum(tf.square(prediction - targets)) / 4096.0  # a global scaling constant
        grads = tape.gradient(loss, variables)  # the table's: IndexedSlices of `rows` rows
        grads = mdt.densify_gradients(grads, variables, mode=args.mode, margin=args.margin)
        if keras3:
            optimizer.apply(grads, variables)
        else:
            optimizer.apply_gradients(zip(grads, variables))
        return loss

    @tf.function
    def train_step(ids, targets):
        return strategy.reduce("SUM", strategy.run(step_fn, args=(ids, targets)), axis=None)

    for step in range(args.steps):
        ids = tf.constant(rng.integers(0, args.vocab, rows), tf.int32)
        targets = tf.constant(rng.standard_normal(rows), tf.float32)
        loss = train_step(ids, targets)
        if worker == 0 and step == 0:
            for name, d in mdt.mirrored_policy(args.mode, args.margin).decisions.items():
                print("decision " + json.dumps({"name": name, "decision": d.reduction, "reason": d.reason,
                                                "rows_per_worker": d.rows_per_worker}), flush=True)
        if worker == 0:
            print(f"step {step} loss {float(loss):.6f}", flush=True)
    if worker == 0:
        print(f"final {digest(variables)}", flush=True)

    from mpi4py import MPI

    MPI.COMM_WORLD.Barrier()


if __name__ == "__main__":
    main()
