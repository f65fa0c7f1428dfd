"""What a native mark costs as a node of a job's graph: tracing time, the first call, and the process's
peak (VmHWM), against the same ``tf.function`` without marks, in fresh processes.

The function holds K independent computations (a 64x64 matmul of a variable), each alone or in a
``tf.cond`` of its own (of a computed tensor, as Horovod puts each gradient's all-reduce), and per
variant:

    none         no marks
    end          one mark after each computation (a control dependency on its output), as memdiag ends
                 a collective
    both         a mark before (a control input) and one after each
    group        one mark after all K

and ``cond-`` before each for the ``tf.cond`` form, where the marks are inside the branch (the cond a
stateful ``If``), and ``cond-around``: a begin mark after the cond's input and an end mark after its
output and the begin, outside it (the cond stateless), as memdiag marks Horovod's conds. memdiag's
tagging of its marks (``graphcalls._mark``) and its scopes (``graphcalls.install``) are in force in
every variant. Printed per variant: medians over the
repeats of the trace (``get_concrete_function``), the first call, the VmHWM growth from before the trace
to after 5 calls, and per mark the VmHWM and time beyond ``none`` of the same form::

    .venv/bin/python probes/mark_node_cost.py [--k 300] [--repeats 3] [--variants none,end,...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VARIANTS = ("none", "end", "both", "group", "cond-none", "cond-end", "cond-both", "cond-group", "cond-around")


def _hwm_mib() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM"):
                return int(line.split()[1]) / 1024
    return float("nan")


def child(variant: str, k: int) -> dict:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    sys.path.insert(0, ROOT)
    from memdiag import graphcalls, nativemarks

    marks, why = nativemarks.load()
    if marks is None:
        raise SystemExit(f"native marks not loaded: {why}")
    graphcalls.install()
    in_cond = variant.startswith("cond-")
    kind = variant.removeprefix("cond-")
    variables = [tf.Variable(tf.ones([64, 64])) for _ in range(k)]

    @tf.autograph.experimental.do_not_convert  # as memdiag's wrappers are: autograph would convert the call
    def mark(key: int, begin: bool) -> object:
        return marks.mark(key, 0 if begin else 1, [])

    def computation(i: int, v: tf.Tensor) -> tf.Tensor:
        if kind == "both":
            with tf.control_dependencies([mark(i, True)]):
                y = tf.matmul(v, v)
        else:
            y = tf.matmul(v, v)
        if kind in ("end", "both"):
            with tf.control_dependencies([y]):
                mark(i, False)
        return y

    @tf.function
    def step() -> tf.Tensor:
        outputs = []
        for i, v in enumerate(variables):
            if kind == "around":
                x = tf.identity(v)
                with tf.control_dependencies([x]):
                    begin = mark(i, True)
                y = tf.cond(tf.constant(True), lambda x=x: tf.matmul(x, x), lambda x=x: tf.identity(x))
                with tf.control_dependencies([y, begin]):
                    mark(i, False)
            elif in_cond:
                x = tf.identity(v)
                y = tf.cond(tf.constant(True), lambda i=i, x=x: computation(i, x), lambda x=x: tf.identity(x))
            else:
                y = computation(i, v)
            outputs.append(y)
        if kind == "group":
            with tf.control_dependencies(outputs):
                mark(0, False)
        return tf.add_n([tf.reduce_sum(o) for o in outputs])

    before = _hwm_mib()
    t0 = time.monotonic()
    step.get_concrete_function()
    t1 = time.monotonic()
    step()
    t2 = time.monotonic()
    for _ in range(5):
        step()
    return {"trace": t1 - t0, "first": t2 - t1, "hwm": _hwm_mib() - before, "marks": marks.ops_made}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--k", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.k)))
        return 0
    variants = [v for v in args.variants.split(",") if v]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        print(f"mark_node_cost: unknown variant {unknown[0]!r}; one of {', '.join(VARIANTS)}", file=sys.stderr)
        return 2
    runs: dict[str, list[dict]] = {v: [] for v in variants}
    for _ in range(args.repeats):
        for variant in variants:  # interleaved, so that a slow spell of the machine spreads over all
            done = subprocess.run([sys.executable, __file__, "--child", variant, "--k", str(args.k)],
                                  capture_output=True, text=True, check=False)
            if done.returncode != 0:
                print(f"mark_node_cost: {variant} failed:\n{done.stderr[-1500:]}", file=sys.stderr)
                return 1
            runs[variant].append(json.loads(done.stdout.strip().splitlines()[-1]))

    def median(variant: str, field: str) -> float:
        return statistics.median(r[field] for r in runs[variant])

    def spread(variant: str, field: str) -> float:
        values = [r[field] for r in runs[variant]]
        return max(values) - min(values)

    print(f"K = {args.k} computations, {args.repeats} runs per variant (medians; spread max - min)")
    print(f"{'variant':14s} {'marks':>5s} {'trace s':>8s} {'first s':>8s} {'VmHWM +MiB':>11s} {'spread':>7s}"
          f" {'KB/mark':>8s} {'ms/mark':>8s}")
    for variant in variants:
        base = "cond-none" if variant.startswith("cond-") else "none"
        marks = runs[variant][0]["marks"]
        per_kb = per_ms = ""
        if marks and base in runs:
            per_kb = f"{(median(variant, 'hwm') - median(base, 'hwm')) * 1024 / marks:8.1f}"
            extra_s = (median(variant, "trace") + median(variant, "first")
                       - median(base, "trace") - median(base, "first"))
            per_ms = f"{extra_s * 1000 / marks:8.2f}"
        print(f"{variant:14s} {marks:5d} {median(variant, 'trace'):8.2f} {median(variant, 'first'):8.2f}"
              f" {median(variant, 'hwm'):11.1f} {spread(variant, 'hwm'):7.1f} {per_kb:>8s} {per_ms:>8s}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
