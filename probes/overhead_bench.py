"""What memdiag's tracing costs: the same workload plain, traced, and traced with memray.

Three variants of one training run, each on N ranks under mpirun:

* plain: the built-in workload's own code (``memdiag.workloads.transformer.run``: same model, same
  batches, same ``tf.function`` step, same Horovod ``DistributedGradientTape``) started by this
  script with no memdiag agent: no collective hooks, no memory sampler, no record files. Only the
  step marks remain, and they just read the clock;
* traced: ``memdiag run`` as a user types it (hooks on every collective, the 20 ms RSS sampler,
  per-step records);
* memray: ``memdiag run --memray`` (every allocation tracked, with native stacks).

The variants are interleaved (plain, traced, memray, then rotated) and repeated, so that a change
in the machine's load falls on all of them. The figure of one run is the median step time over
steps 1..K-1 (step 0 traces the ``tf.function``) of its slowest rank. For each variant the script
prints three estimates of its cost relative to plain, because on a shared machine other jobs slow
single runs by 2-4x:

* median: the median of the variant's runs over the median of plain's;
* paired: the median, over repeats, of the variant's run divided by plain's run of the same repeat
  (the runs of one repeat follow each other, so they see similar load);
* best: the fastest run of the variant over the fastest plain run (the least disturbed runs).

``memdiag run --memray`` reads the memray files after the ranks end to attribute the peak; the
benchmark skips that, as it measures step times only.

Example::

    .venv/bin/python probes/overhead_bench.py --ranks 2 --preset small --steps 6 --repeats 3

``--short-steps`` measures a user's script with short steps instead (probes/short_step_script.py, run as
written under plain mpirun and under ``memdiag run``; probes/fixed_cost.py does the runs): for 1, 30 and 150
steps the whole-process wall and CPU ratios against plain mpirun, the fixed and per-step costs fitted to
them, and the per-step CPU of memdiag's sampling thread, for ``memdiag run`` as it is by default (marks made
records once a second) and with ``--record-every 0`` (at every step, the default before)::

    .venv/bin/python probes/overhead_bench.py --short-steps --ranks 2 --repeats 3 [--hidden 2048]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VARIANTS = ("plain", "traced", "memray")
GOALS = {"traced": 1.03, "memray": 1.6}  # step time relative to plain


class StepClock:
    """Stands in for memdiag's tracer inside the plain variant: step times and nothing else."""

    def __init__(self) -> None:
        self.times: dict[int, float] = {}
        self.on_step_end: list = []
        self._start = time.perf_counter()

    def begin_step(self, step: int) -> None:
        self._start = time.perf_counter()

    def end_step(self, step: int, **extra: Any) -> None:
        self.times[step] = time.perf_counter() - self._start


def plain_rank(args: argparse.Namespace) -> int:
    """One rank of the plain variant (run by mpirun): the workload without the agent."""
    import tensorflow as tf

    local = int(os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE", "1"))
    threads = max(1, (os.cpu_count() or 1) // local)  # as the agent sizes TF's pools
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(max(2, threads))
    import horovod.tensorflow as hvd

    from memdiag.workloads import transformer
    from memdiag.workloads.loop import WorkloadContext

    hvd.init()
    clock = StepClock()
    ctx = WorkloadContext(tracer=clock, rank=hvd.rank(), size=hvd.size(), steps=args.steps, seed=1234,
                          preset=args.preset, overrides=dict(args.overrides), run_dir=None, check_params=False)
    transformer.run(ctx, workload=args.workload)
    with open(os.path.join(args.worker_out, f"plain-rank-{hvd.rank()}.json"), "w") as f:
        json.dump({str(k): v for k, v in clock.times.items()}, f)
    return 0


def typical(step_times: dict[int, float]) -> float:
    """Median over the training steps after step 0."""
    times = [t for step, t in step_times.items() if step >= 1] or list(step_times.values())
    return statistics.median(times)


def run_plain(args: argparse.Namespace, out: str) -> float:
    from memdiag.launch.mpirun import find_mpirun

    os.makedirs(out, exist_ok=True)
    cmd = [find_mpirun(), "-np", str(args.ranks), "--oversubscribe", "--bind-to", "none"]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    cmd += ["-x", "PYTHONPATH", "-x", "TF_CPP_MIN_LOG_LEVEL", sys.executable, os.path.abspath(__file__),
            "--worker-out", out, "--workload", args.workload, "--preset", args.preset, "--steps", str(args.steps)]
    for key, value in args.overrides:
        cmd += ["--set", f"{key}={value}"]
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2")}
    with open(os.path.join(out, "mpirun.log"), "wb") as log:
        subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
    per_rank = []
    for rank in range(args.ranks):
        with open(os.path.join(out, f"plain-rank-{rank}.json")) as f:
            per_rank.append(typical({int(k): v for k, v in json.load(f).items()}))
    return max(per_rank)


def run_memdiag(args: argparse.Namespace, out: str, memray: bool) -> float:
    from memdiag.analyze import summary
    from memdiag.launch.options import LaunchOptions
    from memdiag.launch.session import RunRequest, execute

    summary.attribution_entry = lambda run_dir: {}  # step times only: skip the peak attribution
    options = LaunchOptions(steps=args.steps, preset=args.preset, overrides=dict(args.overrides), memray=memray)
    request = RunRequest(args.workload, args.ranks, options=options, out=out, force=True)
    run_dir = execute(request)
    with open(os.path.join(run_dir, "summary.json")) as f:
        result = json.load(f)
    if result.get("status") != "ok":
        raise SystemExit(f"{out}: the run failed ({result.get('status')}); see {out}/mpirun.log")
    return max(r["step_time_s"] for r in result["ranks"])


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.1f} (1 min), {five:.1f} (5 min) on {os.cpu_count()} cores"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--workload", default="transformer")
    parser.add_argument("--preset", default="small")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        type=lambda text: tuple(text.split("=", 1)), metavar="KEY=VALUE")
    parser.add_argument("--keep", metavar="DIR", help="keep the run directories here (default: a temporary folder)")
    parser.add_argument("--short-steps", action="store_true",
                        help="a user's short-step script, plain mpirun against memdiag run, at 1, 30 and 150 steps")
    parser.add_argument("--hidden", type=int, default=None,
                        help="--short-steps: the script's hidden width, which sets its step time (default 512)")
    parser.add_argument("--worker-out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker_out:
        return plain_rank(args)
    if args.short_steps:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import fixed_cost

        return fixed_cost.main(["--np", str(args.ranks), "--repeats", str(args.repeats), "--variants", "plain",
                                "memdiag", "memdiag-every-step",
                                *([] if args.hidden is None else ["--hidden", str(args.hidden)])])
    if args.steps < 3:
        parser.error("--steps must be at least 3: step 0 is left out of the median")

    base = args.keep or tempfile.mkdtemp(prefix="memdiag-overhead-")
    results: dict[str, list[float]] = {v: [] for v in VARIANTS}
    print(f"{args.workload} --preset {args.preset} {' '.join(f'--set {k}={v}' for k, v in args.overrides)}"
          f" on {args.ranks} ranks, {args.steps} steps, {args.repeats} repeats; {load()}", flush=True)
    try:
        for repeat in range(args.repeats):
            order = VARIANTS[repeat % 3:] + VARIANTS[:repeat % 3]
            for variant in order:
                out = os.path.join(base, f"{variant}-{repeat}")
                start = time.monotonic()
                value = run_plain(args, out) if variant == "plain" else \
                    run_memdiag(args, out, memray=variant == "memray")
                results[variant].append(value)
                print(f"  repeat {repeat + 1} {variant:7s} median step {value * 1000:8.1f} ms"
                      f"  (run took {time.monotonic() - start:5.0f} s)", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    plain = results["plain"]
    print(f"\n{'variant':8s} {'median (ms)':>12s} {'best (ms)':>10s}  {'vs plain: median':>16s} {'paired':>7s}"
          f" {'best':>6s}  {'goal':>5s}  per repeat (ms)")
    for variant in VARIANTS:
        runs = results[variant]
        ratios = {"median": statistics.median(runs) / statistics.median(plain),
                  "paired": statistics.median(v / p for v, p in zip(runs, plain)),
                  "best": min(runs) / min(plain)}
        goal = GOALS.get(variant)
        verdict = "" if goal is None else f"{goal:.2f}"
        print(f"{variant:8s} {statistics.median(runs) * 1000:12.1f} {min(runs) * 1000:10.1f}  "
              f"{ratios['median']:16.3f} {ratios['paired']:7.3f} {ratios['best']:6.3f}  {verdict:>5s}  "
              + " ".join(f"{v * 1000:.1f}" for v in runs))
    print(f"\n{load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
