"""Users' scripts under memdiag, as written, against the same scripts under plain mpirun.

For each script of ``examples/`` (each an ordinary Horovod script), interleaved and repeated:

* plain: ``mpirun -np N python SCRIPT`` with Horovod's timeline on, each rank under GNU time
  (``/usr/bin/time -f %M``: the process's maximum resident set size, the kernel's VmHWM);
* memdiag: ``memdiag run SCRIPT -n N --horovod-timeline`` (as written: no mode), whose ranks report
  the same VmHWM in their ``end`` records.

It prints, per script: the collectives memdiag recorded on rank 0, whether they equal those in the
plain run's Horovod timeline (op, dtype, output shape, count; where they differ, each differing run's
timeline or records with what they have more and less), whether the script's printed losses and
final digest are identical, and the largest rank's VmHWM plain vs memdiag (median and spread over the
repeats) with the ratio. A difference smaller than the larger spread is "within noise".

Example::

    .venv/bin/python probes/user_scripts_bench.py --ranks 2 --repeats 3
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from memdiag.analyze.timeline import record_collectives, timeline_collectives, unshaped_ops  # noqa: E402
from memdiag.format.rundir import read_timeline  # noqa: E402

SCRIPTS = {
    "user_tape_eager.py": ["--steps", "6", "--tokens", "256"],
    "user_tape_function.py": ["--steps", "6"],
    "user_keras_fit.py": ["--batches", "6"],
    "user_sparse_as_dense.py": ["--steps", "6"],
    "user_sum_op.py": ["--steps", "6"],
    "user_adasum.py": ["--steps", "6"],
    "user_fp16_compression.py": ["--steps", "6"],
    "user_groups.py": ["--steps", "6"],
    "user_process_set.py": ["--steps", "6"],
    "user_alltoall.py": ["--steps", "6"],
    "user_sync_batchnorm.py": ["--steps", "6"],
    "user_backward_passes.py": ["--steps", "6"],
}
OUTPUT_LINE = re.compile(r"^(step \d+ loss \S+|final \S+)$", re.M)
HWM_LINE = re.compile(r"memdiag-bench-hwm-kib (\d+)")
MiB = 2**20


def mpirun_base(ranks: int) -> list[str]:
    cmd = ["mpirun", "-np", str(ranks), "--oversubscribe", "-x", "HOROVOD_TIMELINE",
           "-x", "TF_CPP_MIN_LOG_LEVEL"]
    return cmd + (["--allow-run-as-root"] if os.geteuid() == 0 else [])


def plain(script: str, args: list[str], ranks: int, work: str) -> dict:
    timeline = os.path.join(work, "timeline.json")
    env = {**os.environ, "HOROVOD_TIMELINE": timeline, "TF_CPP_MIN_LOG_LEVEL": "2"}
    timed = ["/usr/bin/time", "-f", "memdiag-bench-hwm-kib %M"]
    done = subprocess.run([*mpirun_base(ranks), *timed, sys.executable, script, *args], capture_output=True,
                          text=True, env=env, stdin=subprocess.DEVNULL, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"plain run of {script} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    hwm = [int(k) * 1024 for k in HWM_LINE.findall(done.stdout + done.stderr)]
    return {"hwm": max(hwm), "output": OUTPUT_LINE.findall(done.stdout),
            "collectives": timeline_collectives(read_timeline(timeline).events)}


def traced(script: str, args: list[str], ranks: int, work: str) -> dict:
    out = os.path.join(work, "run")
    done = subprocess.run([sys.executable, "-m", "memdiag", "run", script, "-n", str(ranks), "--horovod-timeline",
                           "--out", out, "--", *args], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"memdiag run of {script} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    ends, records = [], []
    for rank in range(ranks):
        with open(os.path.join(out, f"rank-{rank}.jsonl"), encoding="utf-8") as f:
            lines = [json.loads(line) for line in f if line.strip()]
        ends += [r["hwm_bytes"] for r in lines if r["type"] == "end"]
        if rank == 0:
            records = lines
    with open(os.path.join(out, "mpirun.log"), encoding="utf-8") as f:
        log = f.read()
    return {"hwm": max(ends), "output": OUTPUT_LINE.findall(log), "records": records,
            "collectives": timeline_collectives(read_timeline(os.path.join(out, "horovod-timeline.json")).events)}


def _difference(found: collections.Counter, issued: collections.Counter) -> str:
    """What ``found`` has beyond the plain run's timeline (+) and lacks (-), by (op, dtype, shape)."""
    return f"+{dict(found - issued)} -{dict(issued - found)}"


def spread(values: list[int]) -> int:
    return max(values) - min(values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--scripts", default=",".join(SCRIPTS), help="comma-separated names from examples/")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    if not shutil.which("mpirun") or not os.path.exists("/usr/bin/time"):
        raise SystemExit("needs mpirun and GNU time (/usr/bin/time: apt-get install time)")
    rows = []
    for name in args.scripts.split(","):
        script, script_args = os.path.join(ROOT, "examples", name), SCRIPTS[name]
        plain_runs, traced_runs = [], []
        for repeat in range(args.repeats):
            # Alternate which variant goes first, so a drift in the machine's load falls on both.
            order = (plain, traced) if repeat % 2 == 0 else (traced, plain)
            for variant in order:
                with tempfile.TemporaryDirectory(prefix="memdiag-bench-") as work:
                    result = variant(script, script_args, args.ranks, work)
                (plain_runs if variant is plain else traced_runs).append(result)
        issued = plain_runs[0]["collectives"]
        recorded = record_collectives(traced_runs[0]["records"], unshaped_ops(issued))
        plain_hwm = [r["hwm"] for r in plain_runs]
        traced_hwm = [r["hwm"] for r in traced_runs]
        difference = statistics.median(traced_hwm) - statistics.median(plain_hwm)
        noise = max(spread(plain_hwm), spread(traced_hwm))
        # What differs from the first plain run's timeline, each memdiag run's own timeline and records
        # apart: a run's records off the timeline would be memdiag's; both timelines off would be Horovod's.
        differences = [f"memdiag run {i + 1}: {what} {_difference(found, issued)}"
                       for i, r in enumerate(traced_runs)
                       for what, found in (("timeline", r["collectives"]),
                                           ("records", record_collectives(r["records"], unshaped_ops(issued))))
                       if found != issued]
        differences += [f"plain run {i + 2}: timeline {_difference(r['collectives'], issued)}"
                        for i, r in enumerate(plain_runs[1:]) if r["collectives"] != issued]
        rows.append({
            "script": name,
            "collectives_recorded": sum(recorded.values()),
            "matches_timeline": recorded == issued and all(r["collectives"] == issued for r in traced_runs),
            "differences": differences,
            "output_identical": all(r["output"] == plain_runs[0]["output"] for r in plain_runs + traced_runs),
            "plain_hwm_median": statistics.median(plain_hwm), "plain_hwm_spread": spread(plain_hwm),
            "memdiag_hwm_median": statistics.median(traced_hwm), "memdiag_hwm_spread": spread(traced_hwm),
            "ratio": statistics.median(traced_hwm) / statistics.median(plain_hwm),
            "within_noise": abs(difference) <= noise,
        })
        row = rows[-1]
        print(f"{name:28s} coll {row['collectives_recorded']:4d}  timeline {'same' if row['matches_timeline'] else 'DIFF'}"
              f"  output {'same' if row['output_identical'] else 'DIFF'}"
              f"  VmHWM plain {row['plain_hwm_median'] / MiB:6.0f} ±{row['plain_hwm_spread'] / MiB:3.0f} MiB"
              f"  memdiag {row['memdiag_hwm_median'] / MiB:6.0f} ±{row['memdiag_hwm_spread'] / MiB:3.0f} MiB"
              f"  x{row['ratio']:.3f}  {'within noise' if row['within_noise'] else 'BEYOND NOISE'}", flush=True)
        for line in differences:
            print(f"    {line}", flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"ranks": args.ranks, "repeats": args.repeats, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
