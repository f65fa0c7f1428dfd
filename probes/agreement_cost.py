"""What one agreement between ranks costs (memdiag.agreement), per transport, against the eager Horovod
max-allreduce that memdiag made per tensor before the agreement module (up to two per new sparse
gradient: its rows, then its distinct rows; now one exchange of the pair).

Run under mpirun; every rank times ``--count`` agreements on fresh keys (each a real exchange), in
alternating blocks of the variants, ``--repeats`` times; rank 0 prints the median wall time of one
exchange per variant and the ratios::

    mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 \\
        .venv/bin/python probes/agreement_cost.py [--count 50] [--repeats 3]

Variants:
    horovod      Agreement over HorovodTransport (Horovod's allgather on a thread of its own)
    mpi          Agreement over MPITransport (polled Ibarrier, then an allgather of the payloads)
    old-horovod  Horovod's max-allreduce of one int64, eager (tf.init_scope), as densify.py made it
"""

from __future__ import annotations

import argparse
import statistics
import time

from mpi4py import MPI


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    import horovod.tensorflow as hvd
    import tensorflow as tf

    from memdiag import agreement as ag

    hvd.init()
    transports = {"horovod": ag.HorovodTransport(), "mpi": ag.MPITransport()}
    allreduce = ag.horovod_op("_allreduce")
    times: dict[str, list[float]] = {"horovod": [], "mpi": [], "old-horovod": []}
    block = 0

    def old(key: str) -> int:
        with tf.init_scope():
            value = allreduce(tf.constant(hvd.rank(), tf.int64), op=hvd.Max, name="old_" + key)
            return int(value.numpy())

    for _ in range(args.repeats):
        for variant in times:
            block += 1
            agreement = ag.Agreement(transports[variant]) if variant in transports else None
            MPI.COMM_WORLD.Barrier()
            for i in range(args.count):
                key = f"b{block}_k{i}"
                start = time.perf_counter()
                if agreement is not None:
                    agreement.gather(f"rows/{key}", (hvd.rank(), i))
                else:
                    old(key)
                times[variant].append(time.perf_counter() - start)
    if hvd.rank() == 0:
        medians = {v: statistics.median(t) * 1e3 for v, t in times.items()}
        print(f"{hvd.size()} ranks, {args.count} x {args.repeats} exchanges per variant; median ms per exchange:")
        for variant, ms in medians.items():
            print(f"  {variant:12s} {ms:7.3f} ms  (p90 {statistics.quantiles(times[variant], n=10)[-1] * 1e3:.3f})")
        base = medians["old-horovod"]
        print(f"  ratios to old-horovod: horovod {medians['horovod'] / base:.2f}, mpi {medians['mpi'] / base:.2f}; "
              f"per new sparse gradient in an eager auto job: old up to 2 x {base:.3f} ms, now 1 x "
              f"{medians['horovod']:.3f} ms")


if __name__ == "__main__":
    main()
