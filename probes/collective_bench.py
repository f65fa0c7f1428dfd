"""Micro-benchmark of MPI allgather against allreduce of equal inputs, with RSS columns.

For every size S (per-rank *input* bytes of float32 data) it runs, on numpy buffers:

* allreduce: ``comm.Allreduce(send, recv, op=MPI.SUM)``; S in, S out per rank;
* allgather: ``comm.Allgather(send, recv)``; S in, N x S out per rank (N = world size).

Each op runs ``--warmup`` untimed calls, a barrier, then ``--iters`` calls timed with
``MPI.Wtime``; the reported time is the maximum over ranks of the per-call mean.

Definitions (as in nccl-tests; GB/s means 1e9 bytes per second):

* algbw = size / time, where size is S for allreduce and the total output N x S
  for allgather.
* busbw = algbw x 2(n-1)/n for allreduce and algbw x (n-1)/n for allgather, 0 when
  n = 1: the traffic each link carries, so the two ops compare on one scale.

Memory columns, each the maximum over ranks, in MiB:

* peak_rss: VmHWM from /proc/self/status after the op's loop (warm-up included);
  the peak is reset just before the op, so it belongs to this op alone.
* rss: current resident set (psutil) after the loop, buffers still alive.
* peak_growth, rss_growth: peak_rss and rss minus the baseline RSS, read after the
  input buffer is filled and before the output buffer is allocated. The growth is
  what the collective adds: its output buffer (S for allreduce, N x S for
  allgather) plus MPI's scratch memory; the peak also shows scratch already freed.

A second table gives, per size, allgather / allreduce for time and for output bytes
per rank.

Example::

    mpirun -np 4 python probes/collective_bench.py --sizes 1K,64K,1M,16M --iters 20
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import gc
import json
import os
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import NoReturn

import numpy as np
import numpy.typing as npt
import psutil
from mpi4py import MPI

PROG = "collective_bench"
FLOAT32_BYTES = 4
MIB = 1024 * 1024
SIZE_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}
DEFAULT_SIZES = "1K,64K,1M,16M"
Float32Array = npt.NDArray[np.float32]

_PROCESS = psutil.Process()


@dataclass(frozen=True)
class Config:
    sizes: list[int]
    iters: int
    warmup: int
    json: str | None


@dataclass(frozen=True)
class Collective:
    name: str
    call: Callable[[MPI.Intracomm, Float32Array, Float32Array], None]
    gathers: bool  # output is N x input (allgather) rather than input-sized (allreduce)
    bus_scale: float  # busbw = algbw * bus_scale * (n-1)/n

    def out_count(self, count: int, world: int) -> int:
        return count * world if self.gathers else count


@dataclass(frozen=True)
class Row:
    op: str
    bytes_in: int
    bytes_out: int
    time_us: float
    algbw_gbps: float
    busbw_gbps: float
    peak_rss_mib: float
    rss_mib: float
    peak_growth_mib: float
    rss_growth_mib: float


def _allreduce(comm: MPI.Intracomm, send: Float32Array, recv: Float32Array) -> None:
    comm.Allreduce(send, recv, op=MPI.SUM)


def _allgather(comm: MPI.Intracomm, send: Float32Array, recv: Float32Array) -> None:
    comm.Allgather(send, recv)


COLLECTIVES = (
    Collective("allreduce", _allreduce, gathers=False, bus_scale=2.0),
    Collective("allgather", _allgather, gathers=True, bus_scale=1.0),
)


# ---------------------------------------------------------------- arguments


class _ParserExit(Exception):
    def __init__(self, status: int, message: str | None) -> None:
        super().__init__(status, message)
        self.status = status
        self.message = message


class _Parser(argparse.ArgumentParser):
    """Raises instead of exiting, so rank 0 can tell the other ranks to exit too."""

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        raise _ParserExit(status, message)

    def error(self, message: str) -> NoReturn:
        raise _ParserExit(2, f"{self.prog}: error: {message}\n")


def parse_size(text: str) -> int:
    match = re.fullmatch(r"(\d+)([KMG]?)", text.strip(), flags=re.IGNORECASE)
    if match is None:
        raise argparse.ArgumentTypeError(
            f"invalid size {text!r} (want e.g. 4096, 64K, 1M, 2G)"
        )
    size = int(match[1]) * SIZE_UNITS[match[2].upper()]
    if size <= 0 or size % FLOAT32_BYTES:
        raise argparse.ArgumentTypeError(
            f"size {text!r} is not a positive multiple of 4 bytes (float32)"
        )
    return size


def parse_sizes(text: str) -> list[int]:
    return [parse_size(item) for item in text.split(",")]


def _int_at_least(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid integer {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} is below the minimum {minimum}")
        return value

    return parse


def parse_args(argv: Sequence[str] | None) -> Config:
    parser = _Parser(
        prog=PROG,
        description="MPI allgather vs allreduce micro-benchmark with RSS columns.",
    )
    parser.add_argument(
        "--sizes",
        type=parse_sizes,
        default=parse_sizes(DEFAULT_SIZES),
        help=f"per-rank input bytes, K/M/G = powers of 1024 (default {DEFAULT_SIZES})",
    )
    parser.add_argument(
        "--iters",
        type=_int_at_least(1),
        default=20,
        help="timed calls per op (default 20)",
    )
    parser.add_argument(
        "--warmup",
        type=_int_at_least(0),
        default=3,
        help="untimed calls first (default 3)",
    )
    parser.add_argument(
        "--json", metavar="OUT", help="also write rank 0's rows to this JSON file"
    )
    args = parser.parse_args(argv)
    # Checked up front so an unwritable path fails before the benchmark, not after it.
    if args.json is not None and (
        os.path.isdir(args.json)
        or not os.access(os.path.dirname(os.path.abspath(args.json)), os.W_OK)
    ):
        parser.error(f"argument --json: cannot write {args.json!r}")
    return Config(
        sizes=args.sizes, iters=args.iters, warmup=args.warmup, json=args.json
    )


def configure(comm: MPI.Intracomm, argv: Sequence[str] | None) -> Config:
    """Parse on rank 0 only (one message, not one per rank); broadcast the outcome."""
    outcome: Config | int | None = None
    if comm.rank == 0:
        try:
            outcome = parse_args(argv)
        except _ParserExit as stop:
            if stop.message:
                sys.stderr.write(stop.message)
            outcome = stop.status
    outcome = comm.bcast(outcome, root=0)
    if isinstance(outcome, int):
        sys.exit(outcome)
    assert isinstance(outcome, Config)
    return outcome


# ---------------------------------------------------------------- memory


def _load_malloc_trim() -> Callable[[int], int] | None:
    libc_path = ctypes.util.find_library("c")
    return getattr(ctypes.CDLL(libc_path), "malloc_trim", None) if libc_path else None


_MALLOC_TRIM = _load_malloc_trim()


def release_freed_memory() -> None:
    """Collect garbage, then hand glibc's free heap pages back to the kernel.

    After the first large free glibc raises its mmap threshold, so later buffers (ours
    and MPI's scratch) live on the heap and stay resident once freed; the next op would
    reuse them and its growth would read too low (0 MiB, measured). Trimming between
    ops, rather than pinning the threshold, leaves the timed loop's allocator as in a
    real run: pinned, OpenMPI's per-call allreduce scratch is mmapped and faulted in on
    every call, which made allreduce 2-3x slower. Without glibc only gc runs.
    """
    gc.collect()
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def rss_bytes() -> int:
    return int(_PROCESS.memory_info().rss)


def peak_rss_bytes() -> int:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM line in /proc/self/status")


def reset_peak_rss() -> None:
    # Writing 5 to clear_refs (Linux >= 4.0) sets VmHWM to the current RSS, so the peak
    # read after the op is this op's and not the highest of the whole run.
    with open("/proc/self/clear_refs", "w", encoding="ascii") as clear_refs:
        clear_refs.write("5")


# ---------------------------------------------------------------- measurement


def time_collective(
    comm: MPI.Intracomm,
    op: Collective,
    send: Float32Array,
    recv: Float32Array,
    config: Config,
) -> float:
    """Mean seconds per call, maximum over ranks: the slowest rank sets the pace."""
    for _ in range(config.warmup):
        op.call(comm, send, recv)
    comm.Barrier()
    start = MPI.Wtime()
    for _ in range(config.iters):
        op.call(comm, send, recv)
    mean = (MPI.Wtime() - start) / config.iters
    return float(comm.allreduce(mean, op=MPI.MAX))


def check_result(comm: MPI.Intracomm, op: Collective, recv: Float32Array) -> None:
    """Fail loudly on a wrong result: timings of a broken collective are meaningless."""
    world = comm.size
    # Rank r sends r + 1: a sum is n(n+1)/2 everywhere, a gather has r + 1 in block r.
    ranks = np.arange(1, world + 1, dtype=np.float32)
    blocks = ranks if op.gathers else np.array([ranks.sum()], dtype=np.float32)
    correct = bool(np.all(recv.reshape(len(blocks), -1) == blocks[:, None]))
    if not comm.allreduce(correct, op=MPI.LAND):
        raise RuntimeError(
            f"{op.name} returned wrong values for {recv.nbytes} output bytes"
        )


def measure(comm: MPI.Intracomm, op: Collective, size: int, config: Config) -> Row:
    world = comm.size
    count = size // FLOAT32_BYTES
    # np.full writes every page, so the input is resident before the baseline is read.
    send = np.full(count, comm.rank + 1, dtype=np.float32)
    baseline = rss_bytes()
    reset_peak_rss()
    # Fresh and untouched (np.empty): the collective faults its pages in, so the output
    # buffer, N x size for allgather, shows up as growth over the baseline.
    recv = np.empty(op.out_count(count, world), dtype=np.float32)
    seconds = time_collective(comm, op, send, recv, config)
    peak, current = peak_rss_bytes(), rss_bytes()
    check_result(comm, op, recv)
    bytes_out = recv.nbytes
    # Free now so the next op starts from a baseline without this op's buffers in it.
    del send, recv
    release_freed_memory()

    memory = np.array([peak, current, peak - baseline, current - baseline], np.int64)
    comm.Allreduce(MPI.IN_PLACE, memory, op=MPI.MAX)
    peak_mib, rss_mib, peak_growth_mib, rss_growth_mib = (int(v) / MIB for v in memory)
    # bytes_out is S for allreduce and N x S for allgather: the algbw definitions.
    algbw = bytes_out / seconds / 1e9
    return Row(
        op=op.name,
        bytes_in=size,
        bytes_out=bytes_out,
        time_us=seconds * 1e6,
        algbw_gbps=algbw,
        busbw_gbps=algbw * op.bus_scale * (world - 1) / world,
        peak_rss_mib=peak_mib,
        rss_mib=rss_mib,
        peak_growth_mib=peak_growth_mib,
        rss_growth_mib=rss_growth_mib,
    )


# ---------------------------------------------------------------- report

_HEADER = (
    f"{'op':<10}{'bytes_in':>12}{'bytes_out':>12}{'time_us':>12}{'algbw_GB/s':>12}"
    f"{'busbw_GB/s':>12}{'peak_MiB':>10}{'rss_MiB':>10}{'peak+_MiB':>11}{'rss+_MiB':>10}"
)


def format_row(row: Row) -> str:
    return (
        f"{row.op:<10}{row.bytes_in:>12}{row.bytes_out:>12}{row.time_us:>12.1f}"
        f"{row.algbw_gbps:>12.3f}{row.busbw_gbps:>12.3f}{row.peak_rss_mib:>10.1f}"
        f"{row.rss_mib:>10.1f}{row.peak_growth_mib:>11.1f}{row.rss_growth_mib:>10.1f}"
    )


def print_report(results: Sequence[dict[str, Row]], world: int, config: Config) -> None:
    print(
        f"# {PROG}: world_size={world} iters={config.iters} warmup={config.warmup} "
        "(time: max over ranks of the mean; memory: max over ranks; +: growth)"
    )
    print(_HEADER)
    for by_op in results:
        for row in by_op.values():
            print(format_row(row))
    print()
    print(f"{'bytes_in':>12}{'time ag/ar':>12}{'out ag/ar':>12}")
    for by_op in results:
        gather, reduce = by_op["allgather"], by_op["allreduce"]
        print(
            f"{reduce.bytes_in:>12}{gather.time_us / reduce.time_us:>12.2f}"
            f"{gather.bytes_out / reduce.bytes_out:>12.2f}"
        )


def write_json(path: str, results: Sequence[dict[str, Row]], world: int) -> None:
    rows = [
        {"world_size": world, **asdict(row)}
        for by_op in results
        for row in by_op.values()
    ]
    with open(path, "w", encoding="utf-8") as out:
        json.dump(rows, out, indent=2)
        out.write("\n")


def main(argv: Sequence[str] | None = None) -> int:
    comm = MPI.COMM_WORLD
    config = configure(comm, argv)
    # Memory freed by imports and MPI start-up must not hide the first op's growth.
    release_freed_memory()
    # One {op name: row} per size, in --sizes order: a repeated size keeps its own pair.
    results = [
        {op.name: measure(comm, op, size, config) for op in COLLECTIVES}
        for size in config.sizes
    ]
    if comm.rank == 0:
        print_report(results, comm.size, config)
        if config.json is not None:
            write_json(config.json, results, comm.size)
    return 0


if __name__ == "__main__":
    sys.exit(main())
