"""memdiag's per-step cost split into its parts, measured in one process (no MPI, little noise).

A ``tf.function`` step holding K stand-ins for collectives (an identity of a small tensor each, where
Horovod's op would be) is called many times in a row, built four ways:

    bare        no memdiag
    marks       memdiag's two Python calls per collective (memdiag.graphcalls), into a tracer that
                does nothing: the cost of calling Python from the graph
    tracer      the same calls into a real Tracer: collective records, a step found from the
                collectives (the script's case), its record written and flushed with the high-water
                mark read and reset, as in a rank
    + sampler   the same with the memory sampler thread running (every 5 ms, as in a rank)
    native      the marks written by memdiag's native op (memdiag.nativemarks, the default)
                into the same tracer, drained by the sampler thread; its "adds" is against the row
                before, so the comparison is its total against + sampler's (printed last)

and the median time per call (over --repeats blocks of --calls calls) is printed with the difference
from the row before: what each part adds to a step of K collectives, and that as a share of a 50 ms
step (issue: under 1 % at 50 ms steps)::

    .venv/bin/python probes/step_cost.py [--collectives 5 38] [--calls 300] [--repeats 5] [--step-ms MS]

The stand-in collectives cost nothing, so the figures are memdiag's own time on the step's path; a
real step also shares the cores with the sampler's thread and Horovod's. ``--step-ms MS`` gives every
step, bare ones too, a chain of 512 x 512 matrix products that takes about MS milliseconds bare
(calibrated first): TensorFlow's threads then keep the cores busy for a step as long as a real one,
and the sampler thread (which drains the native marks) competes with them for the cores.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from memdiag import nativemarks  # noqa: E402
from memdiag.agent.hooks import CollectiveHooks  # noqa: E402
from memdiag.agent.naming import Origin  # noqa: E402
from memdiag.agent.sampler import MemorySampler  # noqa: E402
from memdiag.agent.tracer import Tracer  # noqa: E402
from memdiag.format.writer import RecordWriter
from memdiag.graphcalls import install  # noqa: E402


class _IdleWriter:
    def add(self, record: dict) -> None:
        pass


class _IdleTracer:
    """Takes every call a rank's tracer takes and does nothing."""

    step = 0
    writer = _IdleWriter()

    def begin_collective(self, *args: object, **kwargs: object) -> None:
        pass

    def collective(self, *args: object, **kwargs: object) -> None:
        pass


def build(collectives: int, hooks: CollectiveHooks | None, work: int = 0):
    @tf.function
    def step(x):
        outputs = []
        if work:  # the step's compute: a chain of matrix products, its result part of the step's output
            m = tf.reshape(tf.tile(x, [1024]), [512, 512]) / 512.0
            for _ in range(work):
                m = tf.linalg.matmul(m, m) / 512.0
            x = x + tf.reduce_sum(m[:1, :256], axis=0) * 1e-30
        for i in range(collectives):
            tensor = x + float(i)
            if hooks is None:
                outputs.append(tf.identity(tensor))
                continue
            origin = Origin(f"grad_{i}", gradient=True, reduce_op="average")
            marks = hooks._begin("allreduce", [(origin, tensor)])
            with tf.control_dependencies(marks):
                output = tf.identity(tensor)  # where Horovod's all-reduce would be
            outputs.append(hooks._record("allreduce", origin, tensor, output, grouped=False))
        return tf.add_n(outputs)

    return step


def per_call(step, calls: int, repeats: int) -> float:
    x = tf.ones([256])
    for _ in range(20):
        step(x)
    blocks = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            step(x)
        blocks.append((time.perf_counter() - start) / calls)
    return statistics.median(blocks)


def calibrate(step_ms: float) -> int:
    """The number of matrix products that makes a bare step take about ``step_ms`` milliseconds."""
    one = per_call(build(1, None, work=8), 20, 3) / 8
    return max(1, round(step_ms / 1e3 / one))


def rank_tracer(path: str) -> tuple[MemorySampler, RecordWriter, Tracer, CollectiveHooks]:
    """A rank's sampler (not started), record writer, tracer (steps found from the collectives) and hooks."""
    sampler = MemorySampler(0.005)
    writer = RecordWriter(path, 0)
    tracer = Tracer(writer, sampler, rank=0, auto_steps=True)
    return sampler, writer, tracer, CollectiveHooks(tracer, "as-written", 1.0, lambda: 2, lambda d: None)


def sampled(hooks: CollectiveHooks, step, calls: int, repeats: int) -> float:
    """:func:`per_call` with the hooks' sampler running; then the tracer's last step ended and its
    records closed."""
    tracer = hooks.tracer
    tracer.sampler.start()
    try:
        return per_call(step, calls, repeats)
    finally:
        tracer.sampler.stop()
        tracer.finish()
        tracer.writer.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--collectives", type=int, nargs="+", default=[5, 38])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--step-ms", type=float, default=0.0,
                        help="give every step about this much compute (0: the stand-ins only)")
    args = parser.parse_args()
    install()
    work = calibrate(args.step_ms) if args.step_ms > 0 else 0
    marks, how = nativemarks.load({nativemarks.ENV: "native"})
    print(f"marks: {how}")
    print(f"{os.cpu_count()} cores; load average {os.getloadavg()[0]:.1f}; median of {args.repeats} blocks "
          f"of {args.calls} calls" + (f"; {work} matrix products a step" if work else ""))
    with tempfile.TemporaryDirectory(prefix="memdiag-step-cost-") as tmp:
        for k in args.collectives:
            rows: list[tuple[str, float]] = []
            rows.append(("bare", per_call(build(k, None, work), args.calls, args.repeats)))
            idle = CollectiveHooks(_IdleTracer(), "as-written", 1.0, lambda: 2, lambda d: None)
            rows.append(("marks", per_call(build(k, idle, work), args.calls, args.repeats)))
            sampler, writer, tracer, real = rank_tracer(os.path.join(tmp, f"rank-{k}.jsonl"))
            rows.append(("tracer", per_call(build(k, real, work), args.calls, args.repeats)))
            steps = tracer.step + 1
            rows.append(("+ sampler", sampled(real, build(k, real, work), args.calls, args.repeats)))
            if marks is not None:  # the same tracer and sampler, the marks written by the native op
                *_, native = rank_tracer(os.path.join(tmp, f"rank-native-{k}.jsonl"))
                native.use_native(marks)
                rows.append(("native", sampled(native, build(k, native, work), args.calls, args.repeats)))
                tracer = native.tracer
                lost = f", {marks.lost} native marks lost" if marks.lost else ""
                native_steps = f"; native: {tracer.step + 1} steps{lost}"
            else:
                native_steps = "; native marks not built (python -m memdiag.nativemarks build)"
            print(f"\n{k} collectives a step ({steps} steps recorded by the tracer{native_steps})")
            print(f"  {'built':10s} {'per step':>10s} {'adds':>10s} {'per collective':>15s} {'of a 50 ms step':>16s}")
            previous = None
            for name, seconds in rows:
                adds = seconds - previous if previous is not None else None
                cells = (f"{adds * 1e6:+8.0f} us {adds * 1e6 / k:+12.1f} us {100 * adds / 0.05:+15.2f}%"
                         if adds is not None else "")
                print(f"  {name:10s} {seconds * 1e6:8.0f} us {cells}")
                previous = seconds
            by = dict(rows)
            for name in ("+ sampler", "native"):
                if name in by:
                    total = by[name] - by["bare"]
                    print(f"  memdiag in all ({name}): {total * 1e6:.0f} us a step, {100 * total / 0.05:.2f}% of a 50 ms step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
