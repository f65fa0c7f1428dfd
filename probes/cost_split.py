"""memdiag's per-step cost split into its parts, in one process with TensorFlow imported, as a rank has it:
what each part costs a step of K collectives, by default and under ``memdiag run --record-every``.

The parts (each timed on its own; CPU time of the thread doing the work, median of repeats):

    marks        the native op's two marks per collective inside the graph (probes/step_cost.py's
                 stand-in step of K identities, with the marks against without, per step: wall time, as
                 the op runs inline on TensorFlow's executor thread)
    drain        the sampling thread handing a step's marks to the tracer, ending the step and writing
                 its records (probes/drain_cost.py): warm (steps back to back) and cold (the CPU's caches
                 cleared first, as in a rank, where the job runs between two drains); under
                 --record-every the drain handles many steps while its code is warm
      of which   the step's high-water-mark work (a reset and a reading of /proc/self) and the writing of
                 a step's two records (a step record and its memory record, then a flush), each cold
    wakes        the sampling thread's wakes every --sample-ms (MemorySampler's own CPU a wake, times the
                 wakes in a step); under --record-every the native timer's wakes instead (its thread's CPU)

and the sum, as a share of a step of --step-ms (50 ms by default: issue 25's goal is 1%, 0.5 ms)::

    .venv/bin/python probes/cost_split.py [--collectives 5 38] [--step-ms 50] [--sample-ms 20] [--repeats 3]

What it does not see: the cores' contention in a real rank (two ranks and their threads on two cores),
which makes the cold figures the closer ones; whole processes are timed by probes/fixed_cost.py.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import drain_cost  # noqa: E402
import sampler_cost  # noqa: E402
import step_cost  # noqa: E402

from memdiag import nativemarks  # noqa: E402
from memdiag.agent.sampler import HighWaterMark  # noqa: E402
from memdiag.format.writer import RecordWriter  # noqa: E402

EVICT = np.ones(drain_cost.EVICT_BYTES // 8)


def cold(action, times: int) -> float:
    """Median CPU seconds of ``action()`` with the caches cleared before each call."""
    cpu = []
    for _ in range(times):
        EVICT.sum()
        start = time.thread_time()
        action()
        cpu.append(time.thread_time() - start)
    return statistics.median(cpu)


def marks_per_step(marks: nativemarks.Marks, collectives: int, repeats: int) -> float:
    """Seconds a step of ``collectives`` stand-in collectives costs more with the native marks."""
    with tempfile.TemporaryDirectory(prefix="memdiag-cost-split-") as tmp:
        _, writer, _, hooks = step_cost.rank_tracer(os.path.join(tmp, "rank-0.jsonl"))
        hooks.use_native(marks)
        step_cost.install()
        bare = step_cost.per_call(step_cost.build(collectives, None), 200, repeats)
        marked = step_cost.per_call(step_cost.build(collectives, hooks), 200, repeats)
        marks.read()  # what the stand-in steps wrote is nobody's
        writer.close()
    return max(0.0, marked - bare)


def hwm_work(times: int) -> float:
    mark = HighWaterMark()

    def work() -> None:
        mark.start()
        mark.peak()

    return cold(work, times)


def step_records(times: int) -> float:
    with tempfile.TemporaryDirectory(prefix="memdiag-cost-split-") as tmp:
        writer = RecordWriter(os.path.join(tmp, "rank-0.jsonl"), 0)
        step = {"type": "step", "step": 40, "t_start": 1.0, "t_end": 1.05, "step_time_s": 0.05,
                "peak_rss_bytes": 700 << 20, "sampled_peak_rss_bytes": 700 << 20, "hwm_bytes": 700 << 20,
                "exact_peak": True, "window_start": 1.01, "window_end": 1.04, "compute_rise_bytes": 0,
                "collective_rise_bytes": 0, "peak_phase": "held", "collective_live_peak_bytes": 1 << 20}
        mem = {"type": "mem", "step": 40, "n": 3, "t_first": 1.0, "rss_first": 700 << 20, "t_last": 1.05,
               "rss_last": 700 << 20, "rss_min": 700 << 20, "rss_max": 700 << 20, "t_max": 1.0,
               "rss_mean": 700 << 20, "rss_max_window": 700 << 20}

        def write() -> None:
            writer.add(dict(step))
            writer.add(dict(mem))
            writer.flush()

        spent = cold(write, times)
        writer.close()
    return spent


def python_wake(interval_s: float, seconds: float) -> float:
    """CPU seconds a wake of memdiag's sampling thread (Python) costs at ``interval_s``."""
    cpu, wakes = sampler_cost.sampler(interval_s, seconds)
    return cpu / max(1, wakes)


def native_wake(marks: nativemarks.Marks, interval_s: float, seconds: float) -> float:
    """CPU seconds a wake of the native timer costs at ``interval_s``."""
    if not marks.timer_start(interval_s):
        return float("nan")
    time.sleep(seconds)
    cpu = marks.timer_stop() or 0.0
    times, _ = marks.timer_read()  # every sample since the start: one a wake
    return cpu / max(1, len(times) + marks.timer_lost)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--collectives", type=int, nargs="+", default=[5, 38])
    parser.add_argument("--step-ms", type=float, default=50.0, help="the step the shares are of")
    parser.add_argument("--sample-ms", type=float, default=20.0)
    parser.add_argument("--record-every", type=float, default=1.0, help="the batch of the second column, seconds")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    marks, used = nativemarks.load()
    if marks is None:
        raise SystemExit(f"the native marks are not available here: {used}")
    step_s, interval_s = args.step_ms / 1e3, args.sample_ms / 1e3
    print(f"{os.cpu_count()} cores; load average {os.getloadavg()[0]:.1f}; a {args.step_ms:g} ms step, "
          f"--sample-ms {args.sample_ms:g}; median of {args.repeats}; microseconds of CPU a step")
    wakes_a_step = step_s / interval_s
    python = statistics.median(python_wake(interval_s, 2.0) for _ in range(args.repeats))
    native = statistics.median(native_wake(marks, interval_s, 2.0) for _ in range(args.repeats))
    hwm = statistics.median(hwm_work(200) for _ in range(args.repeats))
    records = statistics.median(step_records(200) for _ in range(args.repeats))
    # Under --record-every the thread also wakes a few times a second (memdiag.agent.sampler.TIMER_WAKE_MAX_S)
    from memdiag.agent.sampler import TIMER_WAKE_MAX_S

    idle_wakes = step_s / TIMER_WAKE_MAX_S
    for k in args.collectives:
        mark = statistics.median(marks_per_step(marks, k, 3) for _ in range(args.repeats))
        warm_cold = [drain_cost.once(k, 300, evict) for evict in (None, EVICT) for _ in range(args.repeats)]
        warm = statistics.median(r[1] for r in warm_cold[:args.repeats])
        cold_drain = statistics.median(r[1] for r in warm_cold[args.repeats:])
        # (part, by default, under --record-every: the drain warm, the native timer's wakes and the thread's own)
        rows = [("marks in the graph (2 a collective; step wall)", mark, mark),
                ("drain, step end and records (cold / warm)", cold_drain, warm),
                ("wakes (Python / native timer)", python * wakes_a_step, native * wakes_a_step + python * idle_wakes)]
        print(f"\n{k} collectives a step")
        print(f"  {'part':46s} {'default':>10s} {'--record-every ' + format(args.record_every, 'g'):>18s}")
        for label, d, b in rows:
            print(f"  {label:46s} {d * 1e6:10.0f} {b * 1e6:18.0f}")
        print(f"  {'  of the drain: high-water-mark work (cold)':46s} {hwm * 1e6:10.0f}")
        print(f"  {'  of the drain: a step record, a mem record':46s} {records * 1e6:10.0f}")
        total_d, total_b = sum(row[1] for row in rows), sum(row[2] for row in rows)
        print(f"  {'sum':46s} {total_d * 1e6:10.0f} {total_b * 1e6:18.0f}")
        print(f"  {'share of the step':46s} {100 * total_d / step_s:9.2f}% {100 * total_b / step_s:17.2f}%")
    print(f"\nwake CPU: Python sampling thread {python * 1e6:.0f} us, native timer {native * 1e6:.0f} us; "
          f"load average {os.getloadavg()[0]:.1f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
