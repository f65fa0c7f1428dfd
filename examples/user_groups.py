"""A user's own training script: hvd.DistributedGradientTape(tape, groups=[[...], [...]]).

Explicit gradient groups, given as a list of lists of variables, in an order that differs from the
order of the variables passed to tape.gradient ([words/embeddings, hidden/kernel, hidden/bias,
head/kernel, head/bias]): the first group is [head/kernel, hidden/bias] (later variables first), the
second [words/embeddings, hidden/kernel]; head/bias is in no list and forms a group of its own,
built last. Horovod builds one grouped collective per group, in group order rather than variable
order, and maps the results back to variable positions. The second group mixes an IndexedSlices gradient (grouped
allgather of values and indices) with a dense one (grouped allreduce). Eager custom loop.

Horovod matches group members to gradients by variable NAME (var.name): two variables with the same
name (e.g. "kernel:0" from two Dense layers built with layer.build()) collide and one gradient is
silently dropped (None; TF warns "Gradients do not exist"). The layers here have unique names and are
built by calling them, so their variables are "words/embeddings:0", "hidden/kernel:0", ...

Horovod 0.28.1 bug worked around here: in grouped_allreduce a group that mixes IndexedSlices and dense
gradients only works if the IndexedSlices gradients come FIRST in the group: the gathered slices take
their dense_shape from zip(new_values, new_indices, tensors), i.e. from the group's first tensors,
not from its IndexedSlices; with a dense tensor first it fails with
"AttributeError: 'SymbolicTensor' object has no attribute 'dense_shape'".

    mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 .venv/bin/python examples/user_groups.py --steps 4
"""

import argparse
import hashlib

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

SEED = 606


def digest(variables) -> str:
    h = hashlib.blake2b(digest_size=8)
    for v in variables:
        h.update(v.numpy().tobytes())
    return h.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=900)
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=256, help="tokens per rank per step")
    args = parser.parse_args()

    hvd.init()
    tf.keras.utils.set_random_seed(SEED)
    seq = 16
    # Unique layer names: Horovod matches group members to gradients by variable name.
    embedding = tf.keras.layers.Embedding(args.vocab, args.width, name="words")
    hidden = tf.keras.layers.Dense(args.width, activation="relu", name="hidden")
    head = tf.keras.layers.Dense(3, name="head")
    # Build by calling the layers (not layer.build(), which leaves the names unscoped: "kernel:0" for both
    # Dense layers, and Horovod's name matching would then silently drop one layer's gradient).
    head(hidden(tf.reduce_mean(embedding(tf.zeros((1, seq), tf.int32)), axis=1)))
    # Variable order: [words/embeddings, hidden/kernel, hidden/bias, head/kernel, head/bias]
    variables = embedding.trainable_variables + hidden.trainable_variables + head.trainable_variables
    hvd.broadcast_variables(variables, root_rank=0)
    groups = [
        [head.kernel, hidden.bias],  # later variables first, before the embedding's group
        [embedding.embeddings, hidden.kernel],  # IndexedSlices + dense; the IndexedSlices must lead
    ]  # head.bias: not listed, becomes a group of its own
    optimizer = tf.keras.optimizers.SGD(0.1 * hvd.size())
    rng = np.random.default_rng(SEED + hvd.rank())

    for step in range(args.steps):
        tokens = rng.integers(0, args.vocab, size=(args.tokens // seq, seq))
        labels = rng.integers(0, 3, size=(args.tokens // seq,))
        with tf.GradientTape() as tape:
            logits = head(hidden(tf.reduce_mean(embedding(tokens), axis=1)))
            loss = tf.reduce_mean(
                tf.keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True))
        tape = hvd.DistributedGradientTape(tape, groups=groups)
        grads = tape.gradient(loss, variables)
        optimizer.apply_gradients(zip(grads, variables))
        if hvd.rank() == 0:
            print(f"step {step} loss {loss.numpy():.6f}", flush=True)

    if hvd.rank() == 0:
        print(f"final {digest(variables)}", flush=True)


if __name__ == "__main__":
    main()
