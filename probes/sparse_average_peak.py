"""A rank's peak under memdiag is the peak under plain Horovod: the average of an allgather's values.

Horovod reduces an IndexedSlices by allgathering its values and indices and, for an average, dividing
the gathered values by the number of ranks: a new tensor of the gathered size, unless TensorFlow
reuses the gathered buffer in place, which it does only when nothing else holds that buffer at the
moment the division runs. Whatever memdiag puts between the allgather and its consumer can change
that, and with it the peak by the whole gathered size. This probe runs one ``tf.function`` step that
averages an IndexedSlices of ROWS rows of width 32 (float32; 128 MiB per rank at the default), under
plain mpirun and under ``memdiag run`` (as written), interleaved, and prints each rank's VmHWM after
every step and the ratio of the largest::

    TF_ENABLE_ONEDNN_OPTS=0 .venv/bin/python probes/sparse_average_peak.py [--np 2] [--rows 1048576] [--repeats 2]

(oneDNN's pooled allocator off, as in tests/integration/test_memray_trace.py, so that VmHWM follows
the tensors alive.) The script alone, as a rank: ``python probes/sparse_average_peak.py --rank-program``.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

WIDTH, VOCAB, STEPS = 32, 1000, 3
LINE = re.compile(r"^rank (\d+) step (\d+) VmHWM (\d+) MiB$", re.M)


def _vmhwm_mib() -> int:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmHWM"):
                return int(line.split()[1]) // 1024
    return -1


def rank_program(rows: int) -> int:
    import horovod.tensorflow as hvd
    import tensorflow as tf

    hvd.init()
    values = tf.random.stateless_uniform([rows, WIDTH], seed=(1, hvd.rank()))
    indices = tf.random.stateless_uniform([rows], seed=(2, hvd.rank()), maxval=VOCAB, dtype=tf.int32)

    @tf.function
    def step(v, i):
        reduced = hvd.allreduce(tf.IndexedSlices(v, i, dense_shape=[VOCAB, WIDTH]))  # op=Average
        return tf.reduce_sum(reduced.values)

    for k in range(STEPS):
        step(values, indices).numpy()
        print(f"rank {hvd.rank()} step {k} VmHWM {_vmhwm_mib()} MiB", flush=True)
    return 0


def _memdiag() -> str:
    beside = os.path.join(os.path.dirname(sys.executable), "memdiag")
    return beside if os.path.exists(beside) else "memdiag"


def _peaks(text: str) -> dict[int, int]:
    """Each rank's VmHWM after its last step."""
    peaks: dict[int, int] = {}
    for rank, _step, mib in LINE.findall(text):
        peaks[int(rank)] = int(mib)
    return peaks


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--rows", type=int, default=1_048_576)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--rank-program", action="store_true", help="run as one rank (what mpirun starts)")
    args = parser.parse_args()
    if args.rank_program:
        return rank_program(args.rows)

    me = os.path.abspath(__file__)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    print(f"{args.rows} rows x {WIDTH} float32 per rank ({args.rows * WIDTH * 4 / 2**20:.0f} MiB), "
          f"gathered {args.np * args.rows * WIDTH * 4 / 2**20:.0f} MiB on {args.np} ranks, "
          f"TF_ENABLE_ONEDNN_OPTS={os.environ.get('TF_ENABLE_ONEDNN_OPTS', 'unset')}")
    results: dict[str, list[int]] = {"plain": [], "memdiag": []}
    smallest: dict[str, list[int]] = {"plain": [], "memdiag": []}
    with tempfile.TemporaryDirectory(prefix="sparse-average-peak-") as tmp:
        for repeat in range(args.repeats):
            order = ("plain", "memdiag") if repeat % 2 == 0 else ("memdiag", "plain")
            for variant in order:
                if variant == "plain":
                    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", str(args.np),
                           sys.executable, me, "--rank-program", "--rows", str(args.rows)]
                    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
                    text = done.stdout
                else:
                    out = os.path.join(tmp, f"run-{repeat}")
                    cmd = [_memdiag(), "run", me, "-n", str(args.np), "--out", out, "--",
                           "--rank-program", "--rows", str(args.rows)]
                    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
                    log = os.path.join(out, "mpirun.log")
                    text = Path(log).read_text(encoding="utf-8") if os.path.exists(log) else ""
                peaks = _peaks(text)
                if done.returncode != 0 or len(peaks) != args.np:
                    print(f"{variant} run failed (exit {done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
                    return 1
                results[variant].append(max(peaks.values()))
                smallest[variant].append(min(peaks.values()))
                print(f"  repeat {repeat + 1} {variant:8s} VmHWM per rank (MiB): "
                      + " ".join(f"{peaks[r]}" for r in sorted(peaks)))
    plain, traced = max(results["plain"]), max(results["memdiag"])
    spread = max(results["plain"]) - min(results["plain"])
    low_plain, low_traced = min(smallest["plain"]), min(smallest["memdiag"])
    print(f"largest VmHWM of a rank: plain {plain} MiB, memdiag {traced} MiB, ratio {traced / plain:.3f}")
    print(f"smallest VmHWM of a rank: plain {low_plain} MiB, memdiag {low_traced} MiB, ratio {low_traced / low_plain:.3f}")
    print(f"(plain's run-to-run spread of the largest: {spread} MiB; the gathered values are "
          f"{args.np * args.rows * WIDTH * 4 / 2**20:.0f} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
