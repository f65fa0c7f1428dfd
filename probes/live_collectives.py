"""Which large buffers are alive at once in the collective window: read from memray's allocation
records of a run made with ``memdiag run ... --memray``.

memdiag's hooks know the bytes of every collective's output exactly, but not when TensorFlow frees
them. memray records every allocation and free with its native stack, so this probe replays a rank's
file and follows the buffers of at least ``--min-mib`` MiB: Horovod's allgather outputs (stacks through
``AllgatherOp``/``MPIAllgather``), TensorFlow's element-wise products and quotients (``BinaryOp``:
Horovod's ``values / size`` reaches the kernel as a multiplication by 1/N after TensorFlow's constant
folding), under MultiWorkerMirroredStrategy its gathers (``CollectiveGatherV2OpKernel``) and the
gRPC copies of their chunks (send: ``RecvBufAsync``/``PackFrom``, gRPC slices; receive: read buffers,
``RecvBufResponse`` parsing; most under 16 MiB: ``--min-mib 1`` shows them) and everything else by the
kernel that allocated it. It prints the largest sum of gathered
outputs and products alive at the same moment, what was alive then, and the last allocations and frees
in order, which is the sequence docs/notes/memory.md ("What is alive in the collective window") quotes.

    .venv/bin/python probes/live_collectives.py runs/RUN/rank-0.memray.bin [--min-mib 16] [--last 24]

Reading a file replays every allocation (10-20 million for the small Transformer): 10-30 s per file.
"""

from __future__ import annotations

import argparse
from collections import Counter

GATHERED, PRODUCT = "allgather output", "BinaryOp (product/quotient)"
# MultiWorkerMirroredStrategy (--engine tf-distribute) moves a gather's chunks between workers over gRPC:
# the sender serialises a chunk (RecvBuf response packed into a protobuf Any, then gRPC slices), the
# receiver reads it (gRPC read buffers) and parses it into a string before copying it into the output.
SEND_COPY, RECEIVE_COPY = "gRPC send copy (RecvBuf response)", "gRPC receive copy (RecvBuf response)"


def classify(frames: list[str]) -> str:
    text = " | ".join(frames)
    if ("AllgatherOp" in text or "MPIAllgather" in text or "HorovodAllgather" in text
            or "CollectiveGatherV2OpKernel" in text or "CollectiveGatherOpKernel" in text):
        return GATHERED
    if "AnyMetadata::PackFrom" in text or "RecvBufAsync" in text or "grpc_slice_malloc" in text:
        return SEND_COPY
    if ("RecvBufResponse::_InternalParse" in text or "Any::_InternalParse" in text
            or "read_action_locked" in text or "pollset_work" in text):
        return RECEIVE_COPY
    if "BinaryOp<" in text:
        return PRODUCT
    if "AllreduceOp" in text or "FusionBufferManager" in text or "CollectiveReduceV2OpKernel" in text:
        return "allreduce/fusion buffer"
    frames = [f.replace("(anonymous namespace)::", "") for f in frames]
    kernel = next((f for f in frames if "::Compute" in f), None)
    return (kernel or (frames[min(3, len(frames) - 1)] if frames else "?")).split("(")[0][:70]


def replay(path: str, min_bytes: int) -> tuple[int, dict[str, int], list[tuple[str, int, str, int]]]:
    from memray import AllocatorType, FileReader

    frees = {AllocatorType.FREE, AllocatorType.MUNMAP}
    stacks: dict[int, str] = {}
    live: dict[int, tuple[int, str]] = {}
    by_class: Counter[str] = Counter()
    events: list[tuple[str, int, str, int]] = []
    best, best_at = 0, {}
    for rec in FileReader(path).get_allocation_records():
        if rec.allocator in frees:
            got = live.pop(rec.address, None)
            if got:
                by_class[got[1]] -= got[0]
                events.append(("free", got[0], got[1], sum(by_class.values())))
            continue
        if rec.size < min_bytes or rec.allocator == AllocatorType.MMAP:
            continue
        if rec.native_stack_id not in stacks:
            stacks[rec.native_stack_id] = classify([f[0] for f in rec.native_stack_trace()])
        kind = stacks[rec.native_stack_id]
        live[rec.address] = (rec.size, kind)
        by_class[kind] += rec.size
        events.append(("alloc", rec.size, kind, sum(by_class.values())))
        collective = by_class[GATHERED] + by_class[PRODUCT]
        if collective > best:
            best, best_at = collective, {k: v for k, v in by_class.items() if v}
    return best, best_at, events


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", help="rank-K.memray.bin files")
    parser.add_argument("--min-mib", type=float, default=16.0, help="follow buffers of at least this size")
    parser.add_argument("--last", type=int, default=24, help="print this many of the last allocations and frees")
    args = parser.parse_args()
    mib = 2**20
    for path in args.files:
        best, at, events = replay(path, int(args.min_mib * mib))
        print(f"{path}: largest gathered outputs + products alive at once: {best / mib:.1f} MiB; alive then:")
        for kind, size in sorted(at.items(), key=lambda kv: -kv[1]):
            print(f"  {size / mib:9.1f} MiB  {kind}")
        print(f"last {args.last} allocations and frees of >= {args.min_mib:g} MiB (all such buffers alive after each):")
        for what, size, kind, total in events[-args.last:]:
            print(f"  {what:5} {size / mib:7.1f} MiB  alive {total / mib:7.1f} MiB  {kind}")


if __name__ == "__main__":
    main()
