"""memdiag.agreement's transports under a real launcher: every rank runs three agreements and prints
one JSON line of what it saw.

    mpirun -np 2 python tests/agreement_script.py mpi|horovod DEADLINE_S

1. ``rows/a``: every rank's (rank, 10 x rank), in rank order.
2. Two keys in opposite orders on ranks 0 and 1 (a fresh agreement): the error, and how long it took.
3. One key more on the last rank (a fresh agreement): the error, and how long that rank waited.
The ranks meet at an MPI barrier (on MPI_COMM_WORLD, not the agreements') before leaving, and leave
with os._exit, without finalising MPI (so mpirun reports a failure): the last rank's timed-out exchange
is still pending, and MPI_Finalize or Horovod's shutdown would wait for it.
"""

import json
import os
import sys
import time

from mpi4py import MPI

from memdiag import agreement as ag


def main() -> None:
    kind, deadline = sys.argv[1], float(sys.argv[2])
    if kind == "horovod":
        import horovod.tensorflow as hvd

        hvd.init()
        make = ag.HorovodTransport
    else:
        make = ag.MPITransport
    transport = make()
    rank, size = transport.rank, transport.size
    seen: dict = {"rank": rank, "size": size, "transport": type(transport).__name__}
    first = ag.Agreement(transport, deadline)
    seen["gather"] = first.gather("rows/a", (rank, 10 * rank))
    seen["max"] = first.max("rows/a", (0, 0))  # kept: no exchange

    def attempt(what: str, keys: list[str]) -> None:
        """A fresh agreement asked for ``keys`` in turn: the error it ended with (None) and how long it took."""
        agreement = ag.Agreement(make() if kind == "mpi" else transport, deadline)
        start = time.monotonic()
        try:
            for key in keys:
                agreement.gather(key, (rank,))
            seen[f"{what}_error"] = None
        except ag.AgreementError as error:
            seen[f"{what}_error"] = str(error)
        seen[f"{what}_s"] = time.monotonic() - start

    attempt("order", ["rows/x", "rows/y"] if rank == 0 else ["rows/y", "rows/x"])
    MPI.COMM_WORLD.Barrier()
    attempt("extra", ["rows/z", "rows/only-last"] if rank == size - 1 else ["rows/z"])
    print(json.dumps(seen), flush=True)
    MPI.COMM_WORLD.Barrier()
    os._exit(0)


if __name__ == "__main__":
    main()
