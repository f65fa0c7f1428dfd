"""A built-in workload's training with nothing of memdiag's watching it: the plain side of
``probes/watch_cost.py``'s ``transformer`` and ``resnet50`` jobs.

Under ``memdiag run WORKLOAD`` a rank sizes TensorFlow's pools (intra-op threads = the node's cores over
its ranks, one inter-op thread), calls ``hvd.init()`` and runs the workload's training loop
(memdiag/workloads/loop.py) with memdiag's tracer, hooks, sampler and records. This script does the same
set-up and runs the same loop, the same steps, seed and preset, with a tracer that does nothing and no
hooks: Horovod reduces the gradients as it does by default (``--mode sparse`` under memdiag). Run it as
plain mpirun runs a job, with the ranks unbound as memdiag runs built-in workloads::

    mpirun -np 2 --bind-to none python probes/builtin_plain.py transformer --preset small --steps 5

It prints nothing but the workload's own output (each rank's VmHWM is taken from outside, by GNU time),
and with ``--hwm-each-step`` each rank's VmHWM after each step, as memdiag's step records give it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


class Unwatched:
    """What the training loop calls on its tracer, doing nothing; with ``hwm_each_step``, printing the
    process's VmHWM after each step (a read of /proc/self/status: ``rank R step S hwm_kib K``)."""

    def __init__(self, rank: int, hwm_each_step: bool) -> None:
        self.on_step_end: list[Any] = []
        self.step_peaks: list[int] = []
        self._rank, self._hwm_each_step = rank, hwm_each_step

    def begin_step(self, step: int) -> None:
        pass

    def end_step(self, step: int, **_: Any) -> None:
        if self._hwm_each_step:
            with open("/proc/self/status", encoding="ascii") as f:
                kib = next(line.split()[1] for line in f if line.startswith("VmHWM:"))
            print(f"rank {self._rank} step {step} hwm_kib {kib}", flush=True)

    @contextlib.contextmanager
    def own_work(self, what: str) -> Iterator[None]:
        yield


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workload", choices=("transformer", "resnet50"))
    parser.add_argument("--preset", default="small")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--hwm-each-step", action="store_true", help="print each rank's VmHWM after each step")
    args = parser.parse_args()

    import tensorflow as tf

    from memdiag.agent.rank_env import ranks_on_node  # as the agent reads its launcher's variables

    tf.config.threading.set_intra_op_parallelism_threads(max(1, (os.cpu_count() or 1) // ranks_on_node()))
    tf.config.threading.set_inter_op_parallelism_threads(1)
    import horovod.tensorflow as hvd

    hvd.init()
    from memdiag.workloads.loop import WorkloadContext

    ctx = WorkloadContext(tracer=Unwatched(hvd.rank(), args.hwm_each_step), rank=hvd.rank(), size=hvd.size(),
                          steps=args.steps, seed=args.seed, preset=args.preset, overrides={}, run_dir=None,
                          check_params=False)
    if args.workload == "resnet50":
        from memdiag.workloads import resnet

        resnet.run(ctx)
    else:
        from memdiag.workloads import transformer

        transformer.run(ctx)


if __name__ == "__main__":
    main()
