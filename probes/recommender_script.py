"""A user's recommender training script (plain Horovod, no memdiag import), for measuring `--mode auto`.

Two embedding tables whose gradients Horovod receives as IndexedSlices:

- `words` (4,000 x 512): every user's history of 32 words is looked up, 32,768 rows per rank per step;
  the gathered rows outgrow the table from N = 1 on, so auto should densify it;
- `items` (500,000 x 64): 8 items per user, 8,192 rows per rank per step; the table is 60 times the
  rows gathered at N = 4, so auto should keep the allgather.

Both are read by a small dense scorer. The step is a `tf.function` by default (`--eager` runs it
eagerly), the optimizer Keras's Adam (`--optimizer sgd` for SGD with momentum), and with `--uneven`
rank r takes (1 + r) / 2 times the users of rank 0 (rows unequal across ranks). With `--reduce-by-hand` the
script makes auto's per-tensor choice itself, with no DistributedGradientTape (words densified and
allreduced, items allgathered): what that choice costs without memdiag's run-time switch. Rank 0 prints the loss
per step and a digest of the parameters at the end, as the project's example scripts do.

    mpirun --allow-run-as-root --oversubscribe --bind-to none -np 4 .venv/bin/python probes/recommender_script.py
    memdiag compare sparse-vs-dense probes/recommender_script.py -n 4 --modes sparse,dense,auto --repeats 3
"""

import argparse
import hashlib

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

SEED = 211


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--users", type=int, default=1024, help="users per rank per step (rank 0's with --uneven)")
    parser.add_argument("--words", type=int, default=4000)
    parser.add_argument("--word-width", type=int, default=512)
    parser.add_argument("--items", type=int, default=500_000)
    parser.add_argument("--item-width", type=int, default=64)
    parser.add_argument("--optimizer", choices=("adam", "sgd"), default="adam")
    parser.add_argument("--eager", action="store_true")
    parser.add_argument("--uneven", action="store_true")
    parser.add_argument("--reduce-by-hand", action="store_true",
                        help="no DistributedGradientTape: the words' gradient densified and allreduced, the "
                             "items' allgathered (hvd.allreduce of its IndexedSlices), the rest allreduced")
    parser.add_argument("--tape", choices=("horovod", "memdiag-auto", "memdiag-dense"), default="horovod",
                        help="the gradient tape: Horovod's (the default), or memdiag's drop-in "
                             "(memdiag.tensorflow.DistributedGradientTape) with mode auto or dense")
    parser.add_argument("--print-peak", action="store_true",
                        help="every rank prints its process's peak RSS (VmHWM) at the end")
    parser.add_argument("--densify-after-gather", action="store_true",
                        help="with --reduce-by-hand: the items' gathered rows summed into a dense gradient "
                             "before the optimizer (it takes its dense update)")
    args = parser.parse_args()

    hvd.init()
    tf.keras.utils.set_random_seed(SEED)
    words = tf.keras.layers.Embedding(args.words, args.word_width, name="words")
    items = tf.keras.layers.Embedding(args.items, args.item_width, name="items")
    scorer = tf.keras.layers.Dense(1, name="scorer")
    if args.optimizer == "adam":
        optimizer = tf.keras.optimizers.Adam(1e-3 * hvd.size())
    else:
        optimizer = tf.keras.optimizers.SGD(0.01 * hvd.size(), momentum=0.9)
    rng = np.random.default_rng(SEED + hvd.rank())
    users = args.users * (1 + hvd.rank()) // 2 if args.uneven else args.users

    def trainable():
        return words.trainable_variables + items.trainable_variables + scorer.trainable_variables

    def step(history, basket, clicked):
        with tf.GradientTape() as tape:
            features = tf.concat([tf.reduce_mean(words(history), axis=1), tf.reduce_mean(items(basket), axis=1)], 1)
            logits = scorer(features)[:, 0]
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=clicked, logits=logits))
        variables = trainable()
        if args.reduce_by_hand:
            grads = tape.gradient(loss, variables)
            grads = [hvd.allreduce(tf.convert_to_tensor(g) if v is words.embeddings else g) for g, v in zip(grads, variables)]
            if args.densify_after_gather:
                grads = [tf.convert_to_tensor(g) if v is items.embeddings else g for g, v in zip(grads, variables)]
        elif args.tape != "horovod":
            import memdiag.tensorflow as mdt

            grads = mdt.DistributedGradientTape(tape, mode=args.tape.split("-")[1]).gradient(loss, variables)
        else:
            grads = hvd.DistributedGradientTape(tape).gradient(loss, variables)
        optimizer.apply_gradients(zip(grads, variables))
        return loss

    train_step = step if args.eager else tf.function(step)
    for k in range(args.steps):
        history = rng.integers(0, args.words, size=(users, 32))
        basket = rng.integers(0, args.items, size=(users, 8))
        clicked = rng.integers(0, 2, size=(users,)).astype(np.float32)
        loss = train_step(tf.constant(history), tf.constant(basket), tf.constant(clicked))
        if k == 0:
            hvd.broadcast_variables(trainable(), root_rank=0)
            hvd.broadcast_variables(optimizer.variables(), root_rank=0)
        if hvd.rank() == 0:
            print(f"step {k} loss {float(loss):.6f}", flush=True)

    if hvd.rank() == 0:
        h = hashlib.blake2b(digest_size=8)
        for v in trainable():
            h.update(v.numpy().tobytes())
        print(f"final {h.hexdigest()}", flush=True)
    if args.print_peak:
        with open("/proc/self/status") as status:
            peak = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
        print(f"rank {hvd.rank()} peak_rss_mib {peak / 1024:.0f}", flush=True)


if __name__ == "__main__":
    main()
