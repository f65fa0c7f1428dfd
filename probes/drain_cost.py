"""What the tracer's drain costs per native mark: the records of K collectives a step, made in memory as
the native op writes them (memdiag/native/mark_op.cc), handed to memdiag.agent.hooks.CollectiveHooks's
dispatch in one batch per step, into the real tracer (steps found from the collectives, records written
and flushed at each step's end). Every mark read a different RSS, so each one joins the step's samples
(the most work the marks' samples can cost; in a run most marks read what the sample before them did).
A batch is stamped just before it is handed over, as the ring gives the marks of the last moments. No
graph runs: this is the sampler thread's share of native marks, which in a rank runs beside the job's step.

    .venv/bin/python probes/drain_cost.py [--collectives 5 38] [--steps 400] [--repeats 3] [--cold]

Prints, per K, the median over repeats of the time per record and per step (step ends included), and
what that is of a 50 ms step. Back to back, step after step, the tracer's code and data stay in the
CPU's caches, which is not how a rank runs them: there the drain runs about once a step, between
stretches of the job's own work on the same cores. ``--cold`` also times each step with the caches
cleared first (a 64 MiB array summed between steps, outside the timing), and prints the median
step's CPU time (``time.thread_time``) both ways, warm and cold.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from memdiag import nativemarks  # noqa: E402
from memdiag.agent.hooks import CollectiveHooks  # noqa: E402
from memdiag.agent.sampler import MemorySampler  # noqa: E402
from memdiag.agent.tracer import Tracer  # noqa: E402
from memdiag.format.writer import RecordWriter

WORDS = nativemarks.RECORD_WORDS
EVICT_BYTES = 64 * 2**20  # summed between steps under --cold: more than the last-level caches hold


def _records(collectives: int, steps: int) -> list[np.ndarray]:
    """Per step, a begin and an end record of each collective (keys 2i and 2i+1), 1 us apart, each with
    its own resident page count."""
    t0, index, batches = time.time_ns(), 0, []
    values = nativemarks.HEADER + nativemarks.MAX_INPUTS
    for step in range(steps):
        batch = np.zeros((2 * collectives, WORDS), dtype=np.int64)
        for i in range(collectives):
            for j, kind in enumerate((nativemarks.BEGIN, nativemarks.END)):
                row = batch[2 * i + j]
                row[:6] = [index, 2 * i + j, kind, 1 if kind == nativemarks.BEGIN else 2,
                           t0 + (step * 2 * collectives + 2 * i + j) * 1000, 1]
                index += 1
                row[nativemarks.RSS] = 250_000 + 2 * i + j  # resident pages, a new value at every mark
                row[nativemarks.HEADER] = 2
                row[values:values + 2] = [64, 32 + i]
                if kind == nativemarks.END:
                    row[nativemarks.HEADER + 1] = 2
                    row[values + nativemarks.MAX_VALUES:values + nativemarks.MAX_VALUES + 2] = [64, 32 + i]
        batches.append(batch)
    return batches


def once(collectives: int, steps: int, evict: np.ndarray | None = None) -> tuple[float, float]:
    """Seconds to dispatch ``steps`` steps of ``collectives`` collectives' records, and the median step's
    CPU seconds (after the first 10 steps); ``evict``: an array summed before each step, untimed, so that
    each step starts with caches the tracer no longer holds."""
    with tempfile.TemporaryDirectory(prefix="memdiag-drain-cost-") as tmp:
        writer = RecordWriter(os.path.join(tmp, "rank-0.jsonl"), 0)
        tracer = Tracer(writer, MemorySampler(0.005), rank=0, auto_steps=True)
        hooks = CollectiveHooks(tracer, "as-written", 1.0, lambda: 2, lambda d: None)
        for i in range(collectives):
            meta = {"op": "allreduce", "name": f"grad_{i}", "part": None, "dtype": "float32", "itemsize": 4,
                    "sparse": False, "densified": False, "merged": False, "grouped": False, "gradient": True,
                    "reduce_op": "average", "process_set_size": 2}
            hooks._marked += [("allreduce", meta, 2), ("allreduce", meta, 0)]  # begin, end
        batches = _records(collectives, steps)
        elapsed, cpu = 0.0, []
        for batch in batches:
            # as the ring gives them: marks made in the last moments (their order and spacing kept), later
            # than every sample the sampler holds (the restamping is not timed)
            batch[:, 4] += time.time_ns() - int(batch[-1, 4])
            if evict is not None:
                evict.sum()
            start, start_cpu = time.perf_counter(), time.thread_time()
            hooks._dispatch(batch)
            cpu.append(time.thread_time() - start_cpu)
            elapsed += time.perf_counter() - start
        writer.close()
        if hooks.failures:
            raise SystemExit(f"the tracer failed: {hooks.failures.counts()}")
        return elapsed, statistics.median(cpu[10:])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--collectives", type=int, nargs="+", default=[5, 38])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cold", action="store_true", help="also time each step with the caches cleared first")
    args = parser.parse_args()
    print(f"{os.cpu_count()} cores; load average {os.getloadavg()[0]:.1f}; {args.steps} steps, "
          f"median of {args.repeats}")
    evict = np.ones(EVICT_BYTES // 8) if args.cold else None
    for k in args.collectives:
        runs = [once(k, args.steps) for _ in range(args.repeats)]
        per_step = statistics.median(r[0] for r in runs) / args.steps
        print(f"{k:3d} collectives a step: {per_step / (2 * k) * 1e6:6.1f} us a record, {per_step * 1e3:6.3f} ms a "
              f"step ({100 * per_step / 0.050:.2f}% of a 50 ms step); runs "
              + " ".join(f"{r[0]:.3f}" for r in runs) + " s")
        if evict is not None:
            warm = statistics.median(r[1] for r in runs)
            cold = statistics.median(once(k, args.steps, evict)[1] for _ in range(args.repeats))
            print(f"    median step's CPU: warm {warm * 1e3:.3f} ms, cold {cold * 1e3:.3f} ms ({cold / warm:.1f}x; "
                  f"{100 * cold / 0.050:.2f}% of a 50 ms step)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
