"""A user's own training script: Horovod process sets (hvd.add_process_set, process_set=...).

A shared trunk (embedding + hidden layer) is trained data-parallel over all ranks, and each half of
the ranks trains its own output head ("two tasks"): the head's gradients are reduced with
DistributedGradientTape(tape, process_set=my_half) and the logged loss is averaged over the half
with hvd.allreduce(loss, process_set=my_half). The process sets are created after
hvd.init(process_sets="dynamic") (which sets HOROVOD_DYNAMIC_PROCESS_SETS=1) with
hvd.add_process_set, called in the same order on every rank.

Horovod 0.28.1 refuses a process set with the same ranks as the global set (statically:
"Different ranks tried to set up mismatching numbers of process sets"; dynamically: "Attempted to add a
duplicate process set"), so at -np 2 each half is a single rank. DistributedGradientTape then skips
the head's collective (its tf.cond takes the identity branch for a set of size 1), while the explicit
hvd.allreduce still runs on the one-rank set. Run with -np 4 to get two-rank group allreduces. The
script ends with hvd.join() so that no rank exits (and shuts Horovod down) while another is still
using its process set.

    mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 .venv/bin/python examples/user_process_set.py --steps 4
"""

import argparse
import hashlib

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

SEED = 909


def digest(variables) -> str:
    h = hashlib.blake2b(digest_size=8)
    for v in variables:
        h.update(v.numpy().tobytes())
    return h.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=1000)
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=256, help="tokens per rank per step")
    args = parser.parse_args()

    hvd.init(process_sets="dynamic")
    size, rank = hvd.size(), hvd.rank()
    if size >= 2:
        first = hvd.add_process_set(list(range(size // 2)))
        second = hvd.add_process_set(list(range(size // 2, size)))
        my_half = first if rank < size // 2 else second
    else:
        my_half = hvd.global_process_set
    task = 0 if rank < max(size // 2, 1) else 1

    tf.keras.utils.set_random_seed(SEED)
    seq = 16
    embedding = tf.keras.layers.Embedding(args.vocab, args.width, name="words")
    hidden = tf.keras.layers.Dense(args.width, activation="relu", name="hidden")
    heads = [tf.keras.layers.Dense(3, name="head_task0"), tf.keras.layers.Dense(3, name="head_task1")]
    features = hidden(tf.reduce_mean(embedding(tf.zeros((1, seq), tf.int32)), axis=1))
    for h in heads:  # build the layers
        h(features)
    head = heads[task]
    trunk_vars = embedding.trainable_variables + hidden.trainable_variables
    head_vars = head.trainable_variables
    # Same seed everywhere, but broadcast anyway, as Horovod users do.
    hvd.broadcast_variables(trunk_vars + heads[0].trainable_variables + heads[1].trainable_variables,
                            root_rank=0)
    optimizer = tf.keras.optimizers.SGD(0.1 * size)
    rng = np.random.default_rng(SEED + rank)

    for step in range(args.steps):
        tokens = rng.integers(0, args.vocab, size=(args.tokens // seq, seq))
        labels = (rng.integers(0, 3, size=(args.tokens // seq,)) + task) % 3
        with tf.GradientTape(persistent=True) as tape:
            logits = head(hidden(tf.reduce_mean(embedding(tokens), axis=1)))
            loss = tf.reduce_mean(
                tf.keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True))
        trunk_grads = hvd.DistributedGradientTape(tape).gradient(loss, trunk_vars)
        head_grads = hvd.DistributedGradientTape(tape, process_set=my_half).gradient(loss, head_vars)
        del tape
        optimizer.apply_gradients(zip(trunk_grads + head_grads, trunk_vars + head_vars))
        group_loss = hvd.allreduce(loss, op=hvd.Average, process_set=my_half, name="group_loss")
        if rank == 0:
            print(f"step {step} loss {group_loss.numpy():.6f}", flush=True)

    # Wait for every rank before exiting: the one-rank allreduce above does not synchronise the ranks,
    # and rank 0's Horovod shutdown at exit would otherwise tear down the process sets of a rank that
    # has not finished its last step ("Process set does not exist or has not been registered").
    hvd.join()
    if rank == 0:
        print(f"final {digest(trunk_vars + head_vars)}", flush=True)


if __name__ == "__main__":
    main()
