"""memdiag's per-tensor policy inside your own code, without `memdiag run`.

A model with three embeddings: a small vocabulary looked up many times per step (assumed-sparse: its
allgather would be larger than the table), a large table looked up a few times (truly sparse), and a
large table looked up many times with a few ids repeated most of the time (Zipf: its gathered rows
are mostly duplicates). `mode="auto"` densifies the first, keeps the second on Horovod's allgather
path, and sums the third's duplicate rows before gathering them (dedup).

    mpirun -np 2 python examples/library_policy.py

`--op adasum` reduces with Horovod's Adasum, which has no allgather path for an IndexedSlices: there
`auto` densifies every table.
"""

import argparse
import json

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

import memdiag.tensorflow as mdt


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--op", choices=("average", "adasum"), default="average")
    op = {"average": hvd.Average, "adasum": hvd.Adasum}[parser.parse_args().op]
    hvd.init()
    tf.keras.utils.set_random_seed(3)
    words = tf.keras.layers.Embedding(1000, 64, name="words")
    items = tf.keras.layers.Embedding(200_000, 64, name="items")
    tags = tf.keras.layers.Embedding(50_000, 64, name="tags")
    head = tf.keras.layers.Dense(1)
    optimizer = tf.keras.optimizers.SGD(0.01)
    rng = np.random.default_rng(hvd.rank())

    @tf.function
    def step(word_ids, item_ids, tag_ids, target):
        with tf.GradientTape() as tape:
            features = (tf.reduce_mean(words(word_ids), axis=1) + tf.reduce_mean(items(item_ids), axis=1)
                        + tf.reduce_mean(tags(tag_ids), axis=1))
            loss = tf.reduce_mean((head(features)[:, 0] - target) ** 2)
        tape = mdt.DistributedGradientTape(tape, mode="auto", op=op)
        variables = (words.trainable_variables + items.trainable_variables + tags.trainable_variables
                     + head.trainable_variables)
        grads = tape.gradient(loss, variables)
        optimizer.apply_gradients(zip(grads, variables))
        step.policy = tape.memdiag_policy
        # what the optimizer is handed (known when the step is traced): dense or IndexedSlices
        step.handed = {v.name: "IndexedSlices" if isinstance(g, tf.IndexedSlices) else "dense"
                       for g, v in zip(grads, variables)}
        return loss

    for _ in range(2):
        tag_ids = np.minimum(rng.zipf(1.5, (64, 32)), 50_000) - 1
        loss = step(rng.integers(0, 1000, (64, 32)), rng.integers(0, 200_000, (64, 2)), tag_ids,
                    rng.random(64, dtype=np.float32))
    if hvd.rank() == 0:
        # dense_update_by: the optimizer's class, where it took the gathered rows summed into a dense gradient
        decisions = {name: {"decision": d.reduction, "reason": d.reason, "dense_update_by": d.dense_update_by}
                     for name, d in step.policy.decisions.items()}
        print(json.dumps({"loss": float(loss), "decisions": decisions, "handed": step.handed}))


if __name__ == "__main__":
    main()
