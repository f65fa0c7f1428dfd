"""glibc malloc's state at each MPI rank's RSS peak: an experiment's tool, not part of memdiag.

Put this directory first on ``PYTHONPATH`` of every rank (``mpirun -x PYTHONPATH``): Python imports this
file at start-up. A rank (``OMPI_COMM_WORLD_RANK`` set) starts a daemon thread that reads its resident
memory every 20 ms and, at each new maximum, glibc's ``mallinfo2()``. At exit each rank prints one line
to stderr::

    MALLOC rank R peak_rss P arena A mmap M inuse U free F | at exit arena ... mmap ... inuse ... free ...

in MiB: at the sample of the largest RSS, the bytes malloc took from the system for its heaps (arena),
the bytes of chunks it serves with mmap of their own (mmap: allocated chunks, not all of their pages
need be resident yet), the heap bytes in use (inuse), and the heap bytes freed but kept (free: held by
glibc's per-thread arenas, not returned to the system). The same at exit. It changes nothing in the
job but one thread's 20 ms wakes; ``mallinfo2`` takes each arena's lock for a moment.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import sys
import threading
import time


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def _start() -> None:
    libc = ctypes.CDLL(None)
    try:
        libc.mallinfo2.restype = _MallInfo2
    except AttributeError:  # glibc before 2.33
        return
    page = os.sysconf("SC_PAGE_SIZE")
    best: dict[str, float] = {"rss": 0}
    stopped = threading.Event()

    def loop() -> None:
        fd = os.open("/proc/self/statm", os.O_RDONLY)
        while not stopped.is_set():
            rss = int(os.pread(fd, 128, 0).split()[1]) * page
            if rss > best["rss"]:
                info = libc.mallinfo2()
                best.update(rss=rss, arena=info.arena, mmap=info.hblkhd, inuse=info.uordblks, free=info.fordblks,
                            t=time.time())
            time.sleep(0.02)

    threading.Thread(target=loop, daemon=True, name="malloc_at_peak").start()

    def report() -> None:
        stopped.set()
        mib = 2**20
        now = libc.mallinfo2()
        print(f"MALLOC rank {os.environ['OMPI_COMM_WORLD_RANK']} peak_rss {best['rss'] / mib:.0f} "
              f"arena {best.get('arena', 0) / mib:.0f} mmap {best.get('mmap', 0) / mib:.0f} "
              f"inuse {best.get('inuse', 0) / mib:.0f} free {best.get('free', 0) / mib:.0f} | at exit "
              f"arena {now.arena / mib:.0f} mmap {now.hblkhd / mib:.0f} inuse {now.uordblks / mib:.0f} "
              f"free {now.fordblks / mib:.0f}", file=sys.stderr, flush=True)

    atexit.register(report)


if os.environ.get("OMPI_COMM_WORLD_RANK") is not None:
    _start()
