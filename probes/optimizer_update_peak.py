"""What a Keras optimizer's update holds at its peak for a sparse (IndexedSlices) gradient against the same
gradient made dense, in one process, no Horovod: why `--mode auto`, which weighs only the bytes the
collectives move, can peak above dense on a script.

A 500,000 x 64 float32 table (122 MiB) is read with tf.gather for 32,768 ids a step; its gradient is
applied by the optimizer as the tape returns it (sparse) or after ``tf.convert_to_tensor`` (dense, which
adds a 122 MiB gradient). Each step's peak RSS is the kernel's high-water mark, reset before the step
(oneDNN's pooled allocator off, so RSS follows the tensors alive). Printed: the median over the last
steps of the rise above the step's starting RSS, per optimizer and path::

    .venv/bin/python probes/optimizer_update_peak.py [--steps 6] [--optimizers adam sgd]

Keras 2's Adam applies an IndexedSlices as ``m.assign_add(-m * (1 - beta_1))`` and a scatter (likewise
for v), then ``variable.assign_sub(m * alpha / (sqrt(v) + epsilon))``: table-sized temporaries, as the
dense update has, with the sparse accesses of m and v on top.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MiB = 2**20


def one(path: str, optimizer: str, steps: int) -> None:
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    import numpy as np
    import tensorflow as tf

    sys.path.insert(0, ROOT)
    from memdiag.agent.sampler import read_hwm, read_rss, reset_hwm

    rows, width, looked = 500_000, 64, 32_768
    table = tf.Variable(tf.random.normal([rows, width]), name="items")
    opt = tf.keras.optimizers.Adam(1e-3) if optimizer == "adam" else tf.keras.optimizers.SGD(1e-2, momentum=0.9)
    rng = np.random.default_rng(1)

    @tf.function
    def step(ids):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.gather(table, ids) ** 2)
        gradient = tape.gradient(loss, table)
        if path == "dense":
            gradient = tf.convert_to_tensor(gradient)
        opt.apply_gradients([(gradient, table)])
        return loss

    for s in range(steps):
        ids = tf.constant(rng.integers(0, rows, looked), tf.int32)
        reset_hwm()
        before = read_rss()
        step(ids)
        print(f"step {s} rise {read_hwm() - before}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--optimizers", nargs="+", default=["adam", "sgd"], choices=["adam", "sgd"])
    parser.add_argument("--one", nargs=2, metavar=("PATH", "OPTIMIZER"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        one(args.one[0], args.one[1], args.steps)
        return 0
    env = {**os.environ, "TF_ENABLE_ONEDNN_OPTS": "0", "TF_CPP_MIN_LOG_LEVEL": "2"}
    print(f"{os.cpu_count()} cores; 500,000 x 64 float32 table (122 MiB), 32,768 ids a step; "
          f"rise of the step's peak RSS over its start, median of steps 2..{args.steps - 1}")
    for optimizer in args.optimizers:
        rises = {}
        for path in ("sparse", "dense"):
            done = subprocess.run([sys.executable, __file__, "--one", path, optimizer, "--steps", str(args.steps)],
                                  capture_output=True, text=True, env=env, timeout=600)
            values = [int(line.split()[-1]) for line in done.stdout.splitlines() if line.startswith("step ")]
            if done.returncode != 0 or len(values) < 3:
                raise SystemExit(f"{optimizer} {path} failed: {done.stderr[-1500:]}")
            rises[path] = statistics.median(values[2:])
            print(f"  {optimizer:5s} {path:6s} +{rises[path] / MiB:6.0f} MiB  (steps: "
                  + " ".join(f"{v / MiB:.0f}" for v in values) + ")")
        print(f"  {optimizer:5s} sparse - dense: {(rises['sparse'] - rises['dense']) / MiB:+.0f} MiB "
              f"(the dense path holds a 122 MiB gradient more)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
