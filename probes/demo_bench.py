"""Where the README's main job spends its time: the comparison, repeated, split into its parts.

Runs ``memdiag compare sparse-vs-dense transformer --preset small -n 1,2,4`` (or the arguments given
after ``--``) ``--repeats`` times and prints, per part, the seconds summed over the comparison's runs
(median over the repeats):

* launch: from the run's creation to rank 0's start record (mpirun, Python, TensorFlow and Horovod
  imports, ``hvd.init``);
* set-up: from the start record to step 0 (building the model, the initial broadcast);
* step 0: tracing the ``tf.function`` and running the first step;
* steps 1+: the other steps;
* wind-up: from the last step to the run's end (saving parameters, summarising);
* and the whole comparison's wall time, verification run included.

Example::

    .venv/bin/python probes/demo_bench.py --repeats 3
    .venv/bin/python probes/demo_bench.py --repeats 3 -- transformer --preset small -n 1,2,4 --steps 5

Time the README's main job as `make demo` runs it, with ``TF_ENABLE_ONEDNN_OPTS=0`` in the
environment (the benchmark passes its environment on)::

    TF_ENABLE_ONEDNN_OPTS=0 .venv/bin/python probes/demo_bench.py --repeats 3
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

DEFAULT = ["transformer", "--preset", "small", "-n", "1,2,4"]
PARTS = ("launch", "set-up", "step 0", "steps 1+", "wind-up")


def parts_of(run_dir: str) -> dict[str, float]:
    with open(os.path.join(run_dir, "run.json"), encoding="utf-8") as f:
        manifest = json.load(f)
    records = []
    with open(os.path.join(run_dir, "rank-0.jsonl"), encoding="utf-8") as f:
        for line in f:
            if line.strip():
                records.append(json.loads(line))
    start = next(r for r in records if r["type"] == "start")
    steps = sorted((r for r in records if r["type"] == "step" and r["step"] >= 0), key=lambda r: r["step"])
    return {
        "launch": start["t"] - manifest["created"],
        "set-up": steps[0]["t_start"] - start["t"],
        "step 0": steps[0]["step_time_s"],
        "steps 1+": sum(s["step_time_s"] for s in steps[1:]),
        "wind-up": manifest["finished"] - steps[-1]["t_end"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--keep", metavar="DIR", help="keep each comparison in DIR/repeat-K and its report in "
                                                       "DIR/repeat-K.txt")
    args, rest = parser.parse_known_args()
    compare_args = (rest[1:] if rest and rest[0] == "--" else rest) or DEFAULT
    totals: dict[str, list[float]] = {part: [] for part in (*PARTS, "comparison")}
    for repeat in range(args.repeats):
        with tempfile.TemporaryDirectory(prefix="memdiag-demo-") as work:
            out = os.path.join(args.keep or work, f"repeat-{repeat + 1}" if args.keep else "compare")
            began = time.monotonic()
            done = subprocess.run([sys.executable, "-m", "memdiag", "compare", "sparse-vs-dense", *compare_args,
                                   "--out", out], capture_output=True, text=True, stdin=subprocess.DEVNULL)
            wall = time.monotonic() - began
            if args.keep:
                with open(out + ".txt", "w", encoding="utf-8") as f:
                    f.write(done.stdout)
            if done.returncode not in (0, 1):
                raise SystemExit(f"compare failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
            summed = {part: 0.0 for part in PARTS}
            for run_dir in sorted(glob.glob(os.path.join(out, "*", "run.json"))):
                for part, seconds in parts_of(os.path.dirname(run_dir)).items():
                    summed[part] += seconds
        for part in PARTS:
            totals[part].append(summed[part])
        totals["comparison"].append(wall)
        print(f"repeat {repeat + 1}: comparison {wall:.0f} s; " +
              ", ".join(f"{part} {summed[part]:.0f} s" for part in PARTS), flush=True)
    print(f"\nmedian of {args.repeats} ({' '.join(compare_args)}):")
    for part, values in totals.items():
        print(f"  {part:12s} {statistics.median(values):7.1f} s   (min {min(values):.1f}, max {max(values):.1f})")


if __name__ == "__main__":
    main()
