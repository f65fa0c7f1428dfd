"""What a Keras optimizer's update holds at its peak for a sparse (IndexedSlices) gradient against the same
gradient made dense, in one process, no Horovod: why `--mode auto`, which weighs only the bytes the
collectives move, can peak above dense on a script.

A 500,000 x 64 float32 table (122 MiB) is read with tf.gather for 32,768 ids a step; its gradient is
applied by the optimizer as the tape returns it (sparse) or after ``tf.convert_to_tensor`` (dense, which
adds a 122 MiB gradient). Each step's peak RSS is the kernel's high-water mark, reset before the step.
Printed per optimizer and path, medians over steps 2 on: the rise above the step's starting RSS, and the
peak above the RSS before the first step (the table made; the optimizer's slots are made in the first
step on either path). With oneDNN's pooled allocator a step's rise is near 0 on both paths (the pool
keeps what earlier steps held), so the verdict is on the peak above the run's start: "sparse holds more"
where the sparse path's median is above the dense path's by more than either path's interquartile
range over its steps (and more than 4 MiB). The last line lists those optimizers; memdiag.optimizer_input's
table holds those listed in one setting of oneDNN at least and "dense holds more" in neither::

    .venv/bin/python probes/optimizer_update_peak.py [--steps 10] [--optimizers adam sgd ...|all] [--onednn] [--eager]

``--eager`` runs the step eagerly (op by op: each temporary is freed as soon as it is used), by default
it is a ``tf.function``. ``--onednn`` leaves oneDNN's options as TensorFlow sets them (on, its pooled allocator), as a job runs
by default; without it they are off. ``--optimizers all`` measures every optimizer the probe knows.

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
# The smallest difference the verdict tells from noise: with oneDNN's pool a path's steps can all read the
# same RSS (an interquartile range of 0), and a difference of a page or a few is not a finding.
FLOOR = 4 * MiB
# The optimizers the probe builds, by name: Keras 2's (tf.keras.optimizers, and .legacy)
OPTIMIZERS = {
    "adam": lambda k: k.Adam(1e-3),
    "sgd": lambda k: k.SGD(1e-2, momentum=0.9),
    "sgd-plain": lambda k: k.SGD(1e-2),
    "adamw": lambda k: k.AdamW(1e-3),
    "adamax": lambda k: k.Adamax(1e-3),
    "nadam": lambda k: k.Nadam(1e-3),
    "rmsprop": lambda k: k.RMSprop(1e-3),
    "adagrad": lambda k: k.Adagrad(1e-2),
    "ftrl": lambda k: k.Ftrl(1e-2),
    "legacy-adam": lambda k: k.legacy.Adam(1e-3),
    "legacy-sgd": lambda k: k.legacy.SGD(1e-2, momentum=0.9),
    "legacy-adagrad": lambda k: k.legacy.Adagrad(1e-2),
    "legacy-rmsprop": lambda k: k.legacy.RMSprop(1e-3),
}


def one(path: str, optimizer: str, steps: int, eager: bool = False) -> None:
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    import numpy as np
    import tensorflow as tf

    sys.path.insert(0, ROOT)
    from memdiag.agent.sampler import read_hwm, read_rss, reset_hwm

    rows, width, looked = 500_000, 64, 32_768
    table = tf.Variable(tf.random.normal([rows, width]), name="items")
    opt = OPTIMIZERS[optimizer](tf.keras.optimizers)
    rng = np.random.default_rng(1)

    def step(ids):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.gather(table, ids) ** 2)
        gradient = tape.gradient(loss, table)
        if path == "dense":
            gradient = tf.convert_to_tensor(gradient)
        opt.apply_gradients([(gradient, table)])
        return loss

    if not eager:
        step = tf.function(step)

    base = read_rss()  # the table made; the optimizer's slots are made by the first step, on either path
    for s in range(steps):
        ids = tf.constant(rng.integers(0, rows, looked), tf.int32)
        reset_hwm()
        before = read_rss()
        step(ids)
        peak = read_hwm()
        print(f"step {s} rise {peak - before} above {peak - base}", flush=True)


def _iqr(values: list[int]) -> float:
    """The interquartile range (0 for fewer than 4 values, where no spread can be told)."""
    if len(values) < 4:
        return 0.0
    q = statistics.quantiles(values, n=4)
    return q[2] - q[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--optimizers", nargs="+", default=["adam", "sgd"], choices=[*OPTIMIZERS, "all"])
    parser.add_argument("--onednn", action="store_true", help="oneDNN's options as TensorFlow sets them")
    parser.add_argument("--eager", action="store_true", help="the step run eagerly (by default a tf.function)")
    parser.add_argument("--one", nargs=2, metavar=("PATH", "OPTIMIZER"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        one(args.one[0], args.one[1], args.steps, args.eager)
        return 0
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    if not args.onednn:
        env["TF_ENABLE_ONEDNN_OPTS"] = "0"
    print(f"{os.cpu_count()} cores; 500,000 x 64 float32 table (122 MiB), 32,768 ids a step; "
          f"rise of the step's peak RSS over its start, median of steps 2..{args.steps - 1}; "
          f"oneDNN {'as TensorFlow sets it' if args.onednn else 'off'}; the step "
          f"{'eager' if args.eager else 'a tf.function'}")
    held = []
    for optimizer in (list(OPTIMIZERS) if "all" in args.optimizers else args.optimizers):
        figures: dict[str, dict[str, list[int]]] = {}
        for path in ("sparse", "dense"):
            done = subprocess.run([sys.executable, __file__, "--one", path, optimizer, "--steps", str(args.steps)]
                                  + (["--eager"] if args.eager else []),
                                  capture_output=True, text=True, env=env, timeout=600)
            lines = [line.split() for line in done.stdout.splitlines() if line.startswith("step ")]
            if done.returncode != 0 or len(lines) < 4:
                raise SystemExit(f"{optimizer} {path} failed: {done.stderr[-1500:]}")
            figures[path] = {"rise": [int(f[3]) for f in lines][2:], "above": [int(f[5]) for f in lines][2:]}
            print(f"  {optimizer:14s} {path:6s} rise +{statistics.median(figures[path]['rise']) / MiB:4.0f} MiB, "
                  f"peak above the run's start +{statistics.median(figures[path]['above']) / MiB:4.0f} MiB (steps: "
                  + " ".join(f"{v / MiB:.0f}" for v in figures[path]["above"]) + ")")
        # the verdict on the peaks above the run's start (with oneDNN's pool, a step's rise over its own
        # start is near 0 on both paths): sparse above dense by more than either path's spread over its steps
        sparse, dense = figures["sparse"]["above"], figures["dense"]["above"]
        gap = statistics.median(sparse) - statistics.median(dense)
        spread = max(_iqr(sparse), _iqr(dense), FLOOR)
        verdict = "sparse holds more" if gap > spread else ("dense holds more" if -gap > spread else "within noise")
        if gap > spread:
            held.append(optimizer)
        print(f"  {optimizer:14s} sparse - dense: {gap / MiB:+.0f} MiB, spread {spread / MiB:.0f} MiB: {verdict}")
    print("sparse update holds more than dense: " + (", ".join(held) or "none"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
