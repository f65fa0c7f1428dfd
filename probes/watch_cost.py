"""What watching a job costs, on jobs with hundreds of tensors: the same script, unchanged, under plain
``mpirun`` and under ``memdiag run`` as written, whole processes timed from outside, interleaved and
repeated, with each rank's VmHWM side by side.

Jobs (``--jobs``, comma-separated):

    mobilenet   Horovod's TF2 synthetic benchmark (tests/conformance/horovod_v0.28.1), MobileNetV2, batch 4,
                2 warm-up batches and 1 iteration of 3 (5 steps; 158 gradients, 262 variables broadcast)
    resnet50    the same benchmark with ResNet50, batch 2 (5 steps; 161 gradients)
    manyvars    probes/many_variables_script.py: 1,000 variables of 16 floats, 5 steps
    transformer the README's built-in workload, preset small, 5 steps, ``--mode sparse`` (Horovod's default);
                its plain side is probes/builtin_plain.py: the same training loop with nothing watching it
    resnet50-builtin  the built-in ResNet-50 workload, preset tiny, 5 steps, the same way

The built-in workloads' ranks run unbound under memdiag (they size TensorFlow's pools themselves), so
their plain side runs ``mpirun --bind-to none``; a script's plain side runs as ``mpirun`` binds it.

Per run: the wall time of the whole command (``mpirun ...`` against ``memdiag run ...``, which includes
memdiag's collect, summary and report), split into parts (plain: the longest rank process, start to
exit, from GNU time, and the rest around it; memdiag: its launcher before mpirun, mpirun to the first
agent's ``start`` record (Python and the agent's imports of TensorFlow and Horovod, which the script's
own imports then find done), the ranks from there to the last ``end`` record, on to mpirun's exit,
collecting the records, and the summary and report), and each rank's VmHWM (plain: GNU time's maximum resident set
size of each rank; memdiag: the ``end`` record's ``hwm_bytes``, the kernel's VmHWM of the same process).
Printed per job: medians and spreads (max - min over the repeats), the wall ratio and difference, and per
rank the VmHWM difference against the larger spread ("within noise" when it is smaller), and each
variant's parts, medians::

    .venv/bin/python probes/watch_cost.py [--ranks 2] [--repeats 3]
        [--jobs mobilenet,resnet50,manyvars,transformer,resnet50-builtin]
        [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "tests", "conformance", "horovod_v0.28.1", "tensorflow2_synthetic_benchmark.py")
SYNTHETIC = ["--no-cuda", "--num-warmup-batches", "2", "--num-batches-per-iter", "3", "--num-iters", "1"]
JOBS = {
    "mobilenet": (BENCH, [*SYNTHETIC, "--model", "MobileNetV2", "--batch-size", "4"]),
    "resnet50": (BENCH, [*SYNTHETIC, "--model", "ResNet50", "--batch-size", "2"]),
    "manyvars": (os.path.join(ROOT, "probes", "many_variables_script.py"), ["--variables", "1000", "--steps", "5"]),
    "transformer": ("transformer", ["--preset", "small", "--steps", "5"]),
    "resnet50-builtin": ("resnet50", ["--preset", "tiny", "--steps", "5"]),
}
BUILTINS = ("transformer", "resnet50")  # memdiag's own workloads: run by name, not as a script
BUILTIN_PLAIN = os.path.join(ROOT, "probes", "builtin_plain.py")
HWM_LINE = re.compile(r"memdiag-watch-hwm rank=(\d+) kib=(\d+) s=([0-9.]+)")
MiB = 2**20


def plain(script: str, args: list[str], ranks: int, work: str) -> dict:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    timed = ["sh", "-c", 'exec /usr/bin/time -f "memdiag-watch-hwm rank=$OMPI_COMM_WORLD_RANK kib=%M s=%e" "$@"',
             "sh"]
    builtin = script in BUILTINS
    cmd = ["mpirun", "-np", str(ranks), "--oversubscribe", "-x", "TF_CPP_MIN_LOG_LEVEL",
           *(["--bind-to", "none"] if builtin else []), *(["--allow-run-as-root"] if os.geteuid() == 0 else []),
           *timed, sys.executable, *([BUILTIN_PLAIN] if builtin else []), script, *args]
    start = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL, timeout=1200)
    wall = time.monotonic() - start
    if done.returncode != 0:
        raise SystemExit(f"plain run of {script} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    found = HWM_LINE.findall(done.stdout + done.stderr)
    hwm = {int(r): int(k) * 1024 for r, k, _ in found}
    ranks_s = max(float(s) for _, _, s in found)  # the longest rank process, start to exit
    return {"wall": wall, "hwm": [hwm[r] for r in range(ranks)],
            "split": {"ranks": ranks_s, "around the ranks": wall - ranks_s}}


def traced(script: str, args: list[str], ranks: int, work: str) -> dict:
    out = os.path.join(work, "run")
    start, clock = time.monotonic(), time.time()
    rest = ["--mode", "sparse", *args] if script in BUILTINS else ["--", *args]
    done = subprocess.run([sys.executable, "-m", "memdiag", "run", script, "-n", str(ranks), "--out", out, *rest],
                          capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=1200)
    wall = time.monotonic() - start
    if done.returncode != 0:
        raise SystemExit(f"memdiag run of {script} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    hwm, starts, ends = [], [], []
    for rank in range(ranks):
        with open(os.path.join(out, f"rank-{rank}.jsonl"), encoding="utf-8") as f:
            records = [json.loads(line) for line in f if line.startswith(('{"type":"end"', '{"type":"start"'))]
        hwm.append([r for r in records if r["type"] == "end"][-1]["hwm_bytes"])
        starts.append(min(r["t"] for r in records if r["type"] == "start"))
        ends.append(max(r["t"] for r in records if r["type"] == "end"))
    with open(os.path.join(out, "run.json"), encoding="utf-8") as f:
        manifest = json.load(f)
    mpirun_end = manifest["created"] + manifest["wall_s"]
    return {"wall": wall, "hwm": hwm, "split": {
        "launcher": manifest["created"] - clock,
        "to the agents' start": min(starts) - manifest["created"],  # mpirun, Python, the agent's imports
        "ranks": max(ends) - min(starts),  # from the first agent's start record to the last end record
        "to mpirun's exit": mpirun_end - max(ends),
        "collect": manifest["finished"] - mpirun_end,
        "summary and report": clock + wall - manifest["finished"]}}


def spread(values: list[float]) -> float:
    return max(values) - min(values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--jobs", default=",".join(JOBS))
    parser.add_argument("--json", help="also write every run's figures here")
    args = parser.parse_args()
    if not shutil.which("mpirun") or not os.path.exists("/usr/bin/time"):
        raise SystemExit("needs mpirun and GNU time (/usr/bin/time: apt-get install time)")
    results = {}
    for name in args.jobs.split(","):
        script, script_args = JOBS[name]
        runs: dict[str, list[dict]] = {"plain": [], "memdiag": []}
        # one warm-up run of each, not counted (the page cache: TensorFlow's libraries, the model's code)
        for variant in (plain, traced):
            with tempfile.TemporaryDirectory(prefix="memdiag-watch-") as work:
                variant(script, script_args, args.ranks, work)
        for repeat in range(args.repeats):
            order = (plain, traced) if repeat % 2 == 0 else (traced, plain)
            for variant in order:
                with tempfile.TemporaryDirectory(prefix="memdiag-watch-") as work:
                    result = variant(script, script_args, args.ranks, work)
                runs["plain" if variant is plain else "memdiag"].append(result)
                print(f"  {name} {'plain' if variant is plain else 'memdiag'}: wall {result['wall']:.1f} s, VmHWM "
                      + " / ".join(f"{h / MiB:.0f}" for h in result["hwm"]) + " MiB; "
                      + ", ".join(f"{k} {v:.1f} s" for k, v in result["split"].items()), flush=True)
        results[name] = runs
        walls = {v: [r["wall"] for r in rs] for v, rs in runs.items()}
        p, m = statistics.median(walls["plain"]), statistics.median(walls["memdiag"])
        print(f"{name}: wall plain {p:.1f} s (spread {spread(walls['plain']):.1f}), memdiag {m:.1f} s "
              f"(spread {spread(walls['memdiag']):.1f}): ratio {m / p:.2f}, +{m - p:.1f} s")
        for variant, rs in runs.items():
            print(f"  {variant}, medians: " + ", ".join(f"{k} {statistics.median(r['split'][k] for r in rs):.1f} s"
                                                         for k in rs[0]["split"]))
        for rank in range(args.ranks):
            ph = [r["hwm"][rank] for r in runs["plain"]]
            mh = [r["hwm"][rank] for r in runs["memdiag"]]
            diff = statistics.median(mh) - statistics.median(ph)
            noise = max(spread(ph), spread(mh))
            print(f"  rank {rank} VmHWM plain {statistics.median(ph) / MiB:.0f} MiB (spread {spread(ph) / MiB:.0f}), "
                  f"memdiag {statistics.median(mh) / MiB:.0f} MiB (spread {spread(mh) / MiB:.0f}): "
                  f"{diff / MiB:+.0f} MiB ({diff / statistics.median(ph):+.1%})"
                  + (", within noise" if abs(diff) <= noise else ""), flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
