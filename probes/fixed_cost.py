"""Where memdiag's time goes, as a user sees it: a short-step script under plain mpirun and under
``memdiag run``, whole processes timed from outside, and each run split into its phases.

The script is probes/short_step_script.py (a ``tf.function`` step with ``sparse_as_dense=True``,
about 50 ms a step on 2 ranks of 2 cores when the machine is idle), run as written:

    plain:   mpirun -np N python probes/short_step_script.py --steps S --phases
    memdiag: memdiag run probes/short_step_script.py -n N -- --steps S --phases

and with memdiag's marks through Python (``memdiag-python``: ``MEMDIAG_MARKS=python``; ``memdiag`` is the
default: the native op, its marks made records once a second, the native timer sampling every 20 ms) or
sampling every 5 ms (``memdiag-sample5``: ``--sample-ms 5``, the default before every collective's edges
were sampled) or making the marks records at every step (``memdiag-every-step``: ``--record-every 0``, the
Python thread sampling: the default before the marks were kept in a file), for each S
in --steps (default 1, 30, 150), the variants interleaved (their order rotates) and repeated. Printed per
run: wall time, CPU time of every process of the run (RUSAGE_CHILDREN), and the phases, from rank 0's own
clock and memdiag's run.json and records:

    launch      from the command's start to the script's first line (mpirun, Python, for memdiag
                also its launcher and agent before the script: under memdiag the agent has imported
                TensorFlow and Horovod by then, so the script's own imports cost less)
    imports     script's first line to the end of hvd.init() (memdiag: waits for the script's hvd.init)
    build       hvd.init() to the first step
    steps       the first step's start to the last step's end (the first step traces the graph)
    wind-up     the last step's end to the command's exit; for memdiag split into the ranks' own
                wind-up (to their end records), the ranks' exit to mpirun's, collecting the records
                (to run.json's "finished") and the summary and report

and, for memdiag, the CPU time of its sampling thread (mean over the ranks, from their ``end`` records),

then, per variant, the medians, and the fixed and per-step costs fitted (least squares) to the
median walls over S, with memdiag's minus plain's, and the direct per-step figure: each run's mean step
after the first (the script's own clock: no trace in it), at the largest S, medians and spreads, the
difference called within noise when it is no larger than the larger spread::

    .venv/bin/python probes/fixed_cost.py [--np 2] [--steps 1 30 150] [--repeats 3]
        [--variants plain memdiag memdiag-python memdiag-sample5]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "short_step_script.py")
PHASE = re.compile(r"^phase (\w+) ([0-9.]+)$", re.M)
PARTS = ("launch", "imports", "build", "steps", "wind-up")


def _memdiag() -> str:
    beside = os.path.join(os.path.dirname(sys.executable), "memdiag")
    return beside if os.path.exists(beside) else "memdiag"


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _records(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def run_once(variant: str, ranks: int, steps: int, tmp: str, tag: str, hidden: int | None = None) -> dict:
    script_args = ["--steps", str(steps), "--phases", *([] if hidden is None else ["--hidden", str(hidden)])]
    env = {k: v for k, v in os.environ.items() if k != "MEMDIAG_MARKS"}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    if variant == "memdiag-python":
        env["MEMDIAG_MARKS"] = "python"
    out = os.path.join(tmp, tag)
    if variant == "plain":
        cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(ranks),
               sys.executable, SCRIPT, *script_args]
    else:
        sampling = {"memdiag-sample5": ["--sample-ms", "5"], "memdiag-every-step": ["--record-every", "0"]}.get(variant, [])
        cmd = [_memdiag(), "run", SCRIPT, "-n", str(ranks), "--out", out, *sampling, "--", *script_args]
    cpu0, t0 = _children_cpu(), time.time()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800, stdin=subprocess.DEVNULL)
    t1, cpu1 = time.time(), _children_cpu()
    text = done.stdout
    if variant != "plain" and os.path.exists(os.path.join(out, "mpirun.log")):
        with open(os.path.join(out, "mpirun.log"), encoding="utf-8") as f:
            text = f.read()
    marks = {name: float(t) for name, t in PHASE.findall(text)}
    needed = ("script_start", "init", "first_step", "last_step_end")
    if done.returncode != 0 or any(name not in marks for name in needed):
        raise SystemExit(f"{variant} run failed (exit {done.returncode}): {done.stdout[-1500:]}{done.stderr[-1500:]}")
    parts = {
        "launch": marks["script_start"] - t0,
        "imports": marks["init"] - marks["script_start"],
        "build": marks["first_step"] - marks["init"],
        "steps": marks["last_step_end"] - marks["first_step"],
        "wind-up": t1 - marks["last_step_end"],
    }
    marks_used = None
    if variant != "plain":
        [start] = [r for r in _records(os.path.join(out, "rank-0.jsonl")) if r.get("type") == "start"]
        marks_used = start.get("marks")
        with open(os.path.join(out, "run.json"), encoding="utf-8") as f:
            manifest = json.load(f)
        end_records = [r for rank in range(ranks) for r in _records(os.path.join(out, f"rank-{rank}.jsonl"))
                       if r.get("type") == "end"]
        ends = [r["t"] for r in end_records]
        sampler_cpu = [r["sampler_cpu_s"] for r in end_records if r.get("sampler_cpu_s") is not None]
        if sampler_cpu:  # CPU of memdiag's sampling thread, mean over the ranks (not a part of the wall)
            parts["sampler thread cpu a rank"] = statistics.fmean(sampler_cpu)
        first_sample = min(r["t_first"] for r in _records(os.path.join(out, "rank-0.jsonl")) if r.get("type") == "mem")
        mpirun_end = manifest["created"] + manifest["wall_s"]  # mpirun starts just after run.json is made
        parts["launch: launcher"] = manifest["created"] - t0
        parts["launch: to the agent's first sample"] = first_sample - manifest["created"]
        parts["launch: agent before the script"] = marks["script_start"] - first_sample
        parts["ranks' wind-up"] = max(ends) - marks["last_step_end"]
        parts["to mpirun's exit"] = mpirun_end - max(ends)
        parts["collect"] = manifest["finished"] - mpirun_end
        parts["summary+report"] = t1 - manifest["finished"]
    step_time = parts["steps"] / steps
    # the steps after the first, each: no trace in them, so the per-step cost without the first step's noise
    after_first = ((marks["last_step_end"] - marks["first_step_end"]) / (steps - 1)
                   if steps > 1 and "first_step_end" in marks else None)
    return {"variant": variant, "steps": steps, "wall": t1 - t0, "cpu": cpu1 - cpu0, "parts": parts,
            "step_time": step_time, "after_first": after_first, "marks": marks_used}


def _fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """(fixed, per step) of wall = fixed + per_step x steps, least squares."""
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    return my - slope * mx, slope


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=None,
                        help="the script's hidden width, which sets its step time (its default: 512)")
    parser.add_argument("--steps", type=int, nargs="+", default=[1, 30, 150])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--variants", nargs="+", default=["plain", "memdiag", "memdiag-python"],
                        choices=["plain", "memdiag", "memdiag-python", "memdiag-sample5", "memdiag-every-step"])
    args = parser.parse_args(argv)
    variants = ["plain", *[v for v in args.variants if v != "plain"]]
    if len(variants) < 2:
        parser.error("--variants: name at least one memdiag variant beside plain")

    print(f"{os.cpu_count()} cores; load average {os.getloadavg()[0]:.1f} (1 min) at the start; "
          f"{args.np} ranks; steps {args.steps}; {args.repeats} repeats")
    runs: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="memdiag-fixed-cost-") as tmp:
        for repeat in range(args.repeats):
            for steps in args.steps:
                shift = (repeat + args.steps.index(steps)) % len(variants)
                for variant in variants[shift:] + variants[:shift]:
                    run = run_once(variant, args.np, steps, tmp, f"{variant}-{steps}-{repeat}", args.hidden)
                    runs.append(run)
                    marks = f" ({run['marks']} marks)" if run["marks"] else ""
                    print(f"  repeat {repeat + 1} steps {steps:4d} {variant + marks:28s} wall {run['wall']:7.2f} s  "
                          f"cpu {run['cpu']:7.2f} s  step {run['step_time'] * 1e3:7.1f} ms  "
                          + "  ".join(f"{k} {run['parts'][k]:.2f}" for k in PARTS), flush=True)
    print(f"load average {os.getloadavg()[0]:.1f} (1 min) at the end\n")

    def median(variant: str, steps: int, key: str) -> float:
        values = [r["parts"][key] if key in r["parts"] else r[key] for r in runs
                  if r["variant"] == variant and r["steps"] == steps]
        return statistics.median(values)

    for variant in variants[1:]:
        print(f"{variant}\n{'steps':>5s} {'plain wall':>10s} {'memdiag wall':>12s} {'ratio':>6s} {'plain cpu':>9s} "
              f"{'memdiag cpu':>11s} {'ratio':>6s}")
        for steps in args.steps:
            pw, mw = median("plain", steps, "wall"), median(variant, steps, "wall")
            pc, mc = median("plain", steps, "cpu"), median(variant, steps, "cpu")
            print(f"{steps:5d} {pw:9.2f}s {mw:11.2f}s {mw / pw:6.2f} {pc:8.2f}s {mc:10.2f}s {mc / pc:6.2f}")

        print(f"median seconds per phase ({variant} - plain)")
        for steps in args.steps:
            cells = [f"{k} {median(variant, steps, k) - median('plain', steps, k):+.2f}" for k in PARTS]
            print(f"  steps {steps:4d}: " + "  ".join(cells))
            seen: list[str] = []
            for r in runs:
                seen += [k for k in r["parts"] if k not in PARTS and k not in seen]
            print(f"      {variant}: " + "  ".join(f"{k} {median(variant, steps, k):.2f}" for k in seen))

        if len(args.steps) >= 2:
            fits = {v: _fit([(s, median(v, s, "wall")) for s in args.steps]) for v in ("plain", variant)}
            step_fits = {v: _fit([(s, median(v, s, "steps")) for s in args.steps]) for v in ("plain", variant)}
            fixed = fits[variant][0] - fits["plain"][0]
            per_step = step_fits[variant][1] - step_fits["plain"][1]
            plain_step = step_fits["plain"][1]
            print(f"fitted: plain {fits['plain'][0]:.2f} s + {fits['plain'][1] * 1e3:.1f} ms/step; "
                  f"{variant} {fits[variant][0]:.2f} s + {fits[variant][1] * 1e3:.1f} ms/step (whole walls)")
            print(f"{variant}'s fixed cost {fixed:+.2f} s per run; per-step cost {per_step * 1e3:+.2f} ms on a "
                  f"{plain_step * 1e3:.1f} ms step ({100 * per_step / plain_step:+.1f}%, from the steps phase's "
                  "slope)")
            sampler = "sampler thread cpu a rank"
            if all(any(sampler in r["parts"] for r in runs if r["variant"] == variant and r["steps"] == s)
                   for s in args.steps):
                # the direct measure, without the walls' noise: the sampling thread's CPU over the step counts
                thread = _fit([(s, median(variant, s, sampler)) for s in args.steps])[1]
                print(f"{variant}'s sampling thread: {thread * 1e3:.2f} ms of CPU a step a rank "
                      f"({100 * thread / plain_step:.1f}% of plain's step), from its CPU's slope")
            print()
        _after_first(runs, variant, max(args.steps))
    return 0


def _after_first(runs: list[dict], variant: str, steps: int) -> None:
    """The direct per-step figure: each run's mean step after the first (the script's own clock), at the
    largest step count, medians and spreads of the runs, and the difference weighed against the spread."""
    values = {v: [r["after_first"] for r in runs if r["variant"] == v and r["steps"] == steps
                  and r["after_first"] is not None] for v in ("plain", variant)}
    if not values["plain"] or not values[variant]:
        return
    med = {v: statistics.median(xs) for v, xs in values.items()}
    spread = {v: max(xs) - min(xs) for v, xs in values.items()}
    diff = med[variant] - med["plain"]
    verdict = "within noise" if abs(diff) <= max(spread.values()) else "beyond the spread"
    print(f"steps after the first, at {steps} steps ({len(values['plain'])} and {len(values[variant])} runs): "
          f"plain {med['plain'] * 1e3:.2f} ms (spread {spread['plain'] * 1e3:.2f}), {variant} "
          f"{med[variant] * 1e3:.2f} ms (spread {spread[variant] * 1e3:.2f}): {diff * 1e3:+.2f} ms a step "
          f"({100 * diff / med['plain']:+.1f}%), {verdict}\n")


if __name__ == "__main__":
    sys.exit(main())
