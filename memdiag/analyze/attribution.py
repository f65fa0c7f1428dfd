"""What holds memory at each rank's peak: memray's high-water-mark records sorted into groups.

memray (started in every rank with native stacks) records each allocation with its stack. At the
high-water mark it gives one record per distinct stack: the bytes that stack still held at that
moment. Each record goes to the first group in ``RULES`` one of whose patterns occurs in a frame's
function name, anywhere on its stack; records that match nothing are "other". Every record lands in
exactly one group, so the groups add up to memray's own peak for the rank.

Reading a rank's file takes seconds to minutes (memray replays every allocation and resolves native
symbols), so the result is kept in ``attribution.json`` beside the files and reused while the files
are unchanged. Each file is read once, up to its high-water mark (memray's reader passes over it once
more without stacks, to find that mark), in a process of its own: memray's symbol resolver keeps
what it loaded until the process ends, and most of a reading process's memory is that resolver's.
The first file is read alone; the others as many at a time as there are cores and, at the memory the
first one took, memory available (see :func:`_readers_at_once`). A native stack shared by several
records is resolved and classified once.
"""

from __future__ import annotations

import functools
import glob
import hashlib
import json
import os
import re
import resource
import tempfile
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

from memdiag.format import rundir

ALLGATHER = "Horovod allgather output"
ALLREDUCE = "Horovod allreduce and fusion buffers"
STARTUP = "Horovod fixed buffers at start-up"
TF_TENSORS = "TensorFlow tensors"
PYTHON = "Python objects"
OTHER = "other"

# Order matters: the first rule with a pattern on the stack wins. Start-up comes first: Horovod
# builds every operation object (the Adasum allreduce's buffer among them, the allgather's own
# state) while it starts, under CreateOperationManager. Horovod's rules come before TensorFlow's
# because Horovod allocates its outputs and fusion buffer through TensorFlow's allocator.
RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    (STARTUP, ("CreateOperationManager", "MPIContext::Initialize", "MPIContextManager::EnvInitialize",
               "horovod::common::Timeline", "TimelineWriter", "InitializeHorovodOnce", "horovod_init")),
    (ALLGATHER, ("AllgatherOp", "MPIAllgather", "CollectiveGather")),
    (ALLREDUCE, ("AllreduceOp", "MPIAllreduce", "FusionBufferManager", "TFPersistentBuffer",
                 "CollectiveReduce")),
    (TF_TENSORS, ("tsl::BFCAllocator", "tensorflow::Tensor::Tensor", "tensorflow::TensorBuffer",
                  "CPUAllocator::AllocateRaw", "tsl::port::AlignedMalloc", "OpKernelContext::allocate_")),
    (PYTHON, ("<pymalloc>", "_PyObject_Malloc", "_PyObject_Calloc", "_PyObject_Realloc",
              "_PyObject_ArenaMmap", "PyMem_Malloc", "PyMem_Calloc", "PyMem_Realloc", "PyMem_RawMalloc",
              "PyMem_RawCalloc", "PyMem_RawRealloc", "PyDataMem_", "npy_alloc_cache")),
)
# Shown in this order when two groups hold the same bytes.
GROUPS: tuple[str, ...] = (ALLGATHER, ALLREDUCE, STARTUP, TF_TENSORS, PYTHON, OTHER)

# TensorFlow's CPU allocator with oneDNN (the default) hands tensors out of pooled regions: memray
# sees a region when it is created, under the allocation that made the pool grow.
POOL_FRAME = "BFCAllocator::Extend"
# memray's own allocator kinds for Python's object allocator (when it traces Python allocators).
_PYMALLOC_ALLOCATORS = {1, 2, 3, 4}
# Frames that only pass an allocation on (allocators, the C++ library, CPython's object allocator):
# never the frame that names what allocated.
_PLUMBING = re.compile(r"^(<unknown>|malloc|calloc|realloc|operator new|posix_memalign|aligned_alloc|memalign|"
                       r"valloc|mmap|mmap64|std::|__gnu_cxx::|absl::|_M_|__|_Construct$|construct$|_Sp_|"
                       r"shared_ptr$|make_shared$|AllocateOutput$|AllocatePersistent$|tsl::port::|"
                       r"tsl::\w*Allocator::|tensorflow::\w*Allocator::|tensorflow::Tensor::Tensor$|"
                       r"tensorflow::OpKernelContext::(allocate_|forward_input_or_allocate_output))")
_CPYTHON_FILE = re.compile(r"(Include|Objects|Modules|Python|Parser)/.*\.[ch]$")
# The operation an allocation served: a TensorFlow kernel, a Horovod collective or buffer set-up.
_OPERATION = re.compile(r"::Compute(Async)?$|::Execute$|PerformOperation$|::InitializeBuffer$")
TOP_STACKS = 3
CACHE_FILE = "attribution.json"
CACHE_VERSION = 1  # raise when the cached figures or stacks would come out differently
Frame = tuple[str, str, int]  # function, file, line: memray's frame tuples


@dataclass(frozen=True)
class StackShare:
    """Bytes held at the peak under one short stack (innermost frame first)."""

    frames: tuple[str, ...]
    bytes: int
    allocations: int


@dataclass(frozen=True)
class GroupShare:
    group: str
    bytes: int
    share: float  # of the rank's peak as attributed here
    allocations: int
    top_stacks: tuple[StackShare, ...]


@dataclass(frozen=True)
class RankAttribution:
    rank: int
    file: str  # the memray file's name in the run directory
    peak_bytes: int  # sum over the groups
    memray_peak_bytes: int  # memray's own high-water mark for the file
    records: int
    pooled_bytes: int  # of peak_bytes: TensorFlow allocator regions (see POOL_FRAME)
    groups: tuple[GroupShare, ...]  # largest first; empty groups left out

    def group(self, name: str) -> GroupShare | None:
        return next((g for g in self.groups if g.group == name), None)


@dataclass
class Attribution:
    ranks: list[RankAttribution] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"ranks": [asdict(r) for r in self.ranks], "warnings": list(self.warnings)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Attribution:
        ranks = []
        for r in data.get("ranks", []):
            groups = tuple(
                GroupShare(g["group"], g["bytes"], g["share"], g["allocations"],
                           tuple(StackShare(tuple(s["frames"]), s["bytes"], s["allocations"])
                                 for s in g["top_stacks"]))
                for g in r["groups"])
            ranks.append(RankAttribution(r["rank"], r["file"], r["peak_bytes"], r["memray_peak_bytes"],
                                         r["records"], r["pooled_bytes"], groups))
        return cls(ranks, list(data.get("warnings", [])))


@dataclass(frozen=True)
class PeakRecord:
    """One high-water-mark record, reduced to what attribution needs (memray's or hand-made)."""

    size: int
    allocations: int
    frames: tuple[Frame, ...]  # innermost first; native frames, Python ones may be interleaved
    allocator: int = 0
    # The stack with Python frames interleaved, when ``frames`` has none: memray merges them
    # slowly, so only the records shown as top stacks ask for it.
    hybrid: Callable[[], Sequence[Frame]] | None = field(default=None, compare=False)
    # Records with the same key have the same frames and allocator kind: classified once. With
    # ``resolve``, ``frames`` is left empty and ``resolve()`` gives them, asked once per key.
    stack_key: Hashable | None = field(default=None, compare=False)
    resolve: Callable[[], Sequence[Frame]] | None = field(default=None, compare=False)


class Classifier:
    """Applies ``rules`` to stacks, remembering the verdict for each distinct frame."""

    def __init__(self, rules: Sequence[tuple[str, tuple[str, ...]]] = RULES) -> None:
        self.rules = tuple(rules)
        self._verdicts: dict[str, int] = {}
        self._frames: dict[Frame, tuple[int, _FrameView]] = {}  # frame -> (its rule, how it reads)

    def _rule_of(self, function: str) -> int:
        verdict = self._verdicts.get(function)
        if verdict is None:
            verdict = next((i for i, (_, patterns) in enumerate(self.rules)
                            if any(p in function for p in patterns)), len(self.rules))
            self._verdicts[function] = verdict
        return verdict

    def classify(self, record: PeakRecord) -> tuple[str, int | None]:
        """The record's group and the index of the frame that decided it (None: no rule matched)."""
        return self.classify_frames(record.frames, record.allocator)

    def classify_frames(self, frames: Sequence[Frame], allocator: int = 0) -> tuple[str, int | None]:
        best, where = len(self.rules), None
        if allocator in _PYMALLOC_ALLOCATORS:
            best = self._rule_of("<pymalloc>")
        for i, (function, _, _) in enumerate(frames):
            rule = self._rule_of(function)
            if rule < best:
                best, where = rule, i
                if rule == 0:
                    break
        return (self.rules[best][0] if best < len(self.rules) else OTHER), where

    def read_stack(self, frames: Sequence[Frame], allocator: int = 0) -> tuple[str, tuple[str, ...], bool]:
        """A stack's group, short stack and whether it passed through a pool region (POOL_FRAME), in
        one pass over its frames: each distinct frame is looked at once."""
        known = self._frames
        rules, views = [], []
        for frame in frames:
            info = known.get(frame)
            if info is None:
                info = known[frame] = (self._rule_of(frame[0]), _view(frame))
            rules.append(info[0])
            views.append(info[1])
        best, where = len(self.rules), None
        if allocator in _PYMALLOC_ALLOCATORS:
            best = self._rule_of("<pymalloc>")
        for i, rule in enumerate(rules):
            if rule < best:
                best, where = rule, i
                if rule == 0:
                    break
        group = self.rules[best][0] if best < len(self.rules) else OTHER
        return group, short_stack(frames, where, views), any(v.pool for v in views)


@functools.cache
def simplify(function: str) -> str:
    """A C++ symbol without template arguments, parameter list or return type."""
    name = function.replace("(anonymous namespace)::", "")
    out: list[str] = []
    depth = 0
    for ch in name:
        if ch == "<":
            depth += 1
        elif ch == ">" and depth:
            depth -= 1
        elif depth == 0:
            if ch == "(" and out and not "".join(out).endswith("operator"):
                break
            out.append(ch)
    text = "".join(out).strip()
    if " " in text and "operator" not in text:
        text = text.rsplit(" ", 1)[-1]  # "void absl::f" -> "absl::f"
    return text or function


@dataclass(frozen=True)
class _FrameView:
    """How a frame reads in a short stack (computed once per distinct frame)."""

    shown: str
    python: bool
    own_python: bool  # a Python frame of the program, not of a library or the import system
    plumbing: bool
    operation: bool
    pool: bool


@functools.lru_cache(maxsize=200_000)
def _view(frame: Frame) -> _FrameView:
    function, file, line = frame
    python = file.endswith(".py") or file.startswith("<frozen")
    if python:
        own = not file.startswith("<frozen") and "/lib/python" not in file and "-packages/" not in file
        return _FrameView(f"{function} ({os.path.basename(file)}:{line})", True, own, False, False, False)
    name = simplify(function)
    return _FrameView(name, False, False, bool(_PLUMBING.match(name) or _CPYTHON_FILE.search(file)),
                      bool(_OPERATION.search(name)), POOL_FRAME in function)


def short_stack(frames: Sequence[Frame], decided_at: int | None,
                views: Sequence[_FrameView] | None = None) -> tuple[str, ...]:
    """A few frames that say what allocated, innermost first: the first frame that is not allocator
    plumbing, the frame that decided the group, the operation that called them (a TensorFlow
    kernel's Compute, a Horovod operation) and the innermost Python frame of the program itself.
    ``views``: the frames' views when the caller has them already."""
    if views is None:
        views = [_view(f) for f in frames]
    native = [i for i, v in enumerate(views) if not v.python]
    shown: list[int] = []
    origin = next((i for i in native if not views[i].plumbing), None)
    if origin is not None:
        shown.append(origin)
    if decided_at is not None and decided_at != origin and not views[decided_at].python:
        if not views[decided_at].plumbing or frames[decided_at][0].startswith(("_Py", "Py", "<")):
            shown.append(decided_at)
        else:  # an allocator frame decided: name the pool region instead, if that is what it is
            limit = len(frames) if origin is None else origin
            shown.extend(i for i in native if i < limit and views[i].pool)
    if shown and not any(views[i].operation for i in shown):
        after = max(shown)
        operation = next((i for i in native if i > after and views[i].operation), None)
        if operation is not None:
            shown.append(operation)
    picked = [views[i].shown for i in sorted(set(shown))[:3]]
    python = [v for v in views if v.python]
    own = [v for v in python if v.own_python]
    if own or python:
        picked.append((own or python)[0].shown)
    return tuple(dict.fromkeys(picked)) or ("<no stack>",)


def attribute_records(records: Iterable[PeakRecord], rank: int = 0, file: str = "",
                      memray_peak_bytes: int | None = None,
                      rules: Sequence[tuple[str, tuple[str, ...]]] = RULES) -> RankAttribution:
    """Group one rank's high-water-mark records; ``memray_peak_bytes`` defaults to their sum."""
    classifier = Classifier(rules)
    sizes: dict[str, int] = defaultdict(int)
    counts: dict[str, int] = defaultdict(int)
    # group -> short stack -> [bytes, allocations, largest record]
    stacks: dict[str, dict[tuple[str, ...], list[Any]]] = defaultdict(dict)
    total = pooled = n = 0
    seen: dict[Hashable, tuple[str, tuple[str, ...], bool]] = {}  # stack key -> (group, short stack, pooled)
    for record in records:
        n += 1
        verdict = seen.get(record.stack_key) if record.stack_key is not None else None
        if verdict is None:
            frames = record.frames if record.resolve is None else record.resolve()
            verdict = classifier.read_stack(frames, record.allocator)
            if record.stack_key is not None:
                seen[record.stack_key] = verdict
        group, shown, in_pool = verdict
        sizes[group] += record.size
        counts[group] += record.allocations
        entry = stacks[group].setdefault(shown, [0, 0, record])
        entry[0] += record.size
        entry[1] += record.allocations
        if record.size > entry[2].size:
            entry[2] = record
        total += record.size
        if in_pool:
            pooled += record.size
    groups = []
    for group in sorted(sizes, key=lambda g: (-sizes[g], GROUPS.index(g) if g in GROUPS else len(GROUPS))):
        if sizes[group] <= 0:
            continue
        top = sorted(stacks[group].items(), key=lambda kv: (-kv[1][0], kv[0]))[:TOP_STACKS]
        groups.append(GroupShare(group, sizes[group], sizes[group] / total if total else 0.0, counts[group],
                                 tuple(StackShare(_with_python(frames, largest, classifier), b, a)
                                       for frames, (b, a, largest) in top)))
    return RankAttribution(rank, file, total, total if memray_peak_bytes is None else memray_peak_bytes,
                           n, pooled, tuple(groups))


def _with_python(shown: tuple[str, ...], record: PeakRecord, classifier: Classifier) -> tuple[str, ...]:
    """A top stack with the Python frame of its largest record, when the stack had none."""
    if record.hybrid is None:
        return shown
    try:
        frames = tuple(record.hybrid())
    except Exception:  # noqa: BLE001 - a stack memray cannot merge is shown without Python frames
        return shown
    return short_stack(frames, classifier.classify(PeakRecord(record.size, 0, frames, record.allocator))[1])


@contextmanager
def _stderr_captured() -> Iterator[list[str]]:
    """memray's reader reports a damaged file only on the process's stderr: catch it there."""
    caught: list[str] = []
    with tempfile.TemporaryFile(mode="w+b") as sink:
        saved = os.dup(2)
        os.dup2(sink.fileno(), 2)
        try:
            yield caught
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            caught.append(sink.read().decode("utf-8", "replace"))


def _memray_records(reader: Any, native: bool) -> Iterator[PeakRecord]:
    """memray's records at the high-water mark; stacks resolved only when asked (once per stack)."""
    for record in reader.get_high_watermark_allocation_records(merge_threads=True):
        allocator = int(record.allocator)
        if native:
            yield PeakRecord(record.size, record.n_allocations, (), allocator, record.hybrid_stack_trace,
                             ("native", record.native_stack_id, record.native_segment_generation, allocator),
                             record.native_stack_trace)
        else:
            yield PeakRecord(record.size, record.n_allocations, (), allocator, None,
                             ("python", record.stack_id, record.tid, allocator), record.stack_trace)


def attribute_file(path: str, rank: int) -> tuple[RankAttribution | None, list[str]]:
    """One rank's memray file -> its attribution and warnings; a damaged file gives a warning."""
    name = os.path.basename(path)
    try:
        import memray
    except ImportError:
        return None, [f"memray is not installed: cannot read {name}; pip install memray"]
    warnings: list[str] = []
    try:
        with _stderr_captured() as stderr:
            reader = memray.FileReader(path)
            try:
                meta = reader.metadata
                last_snapshot = None
                for last_snapshot in reader.get_memory_snapshots():  # noqa: B007 - the last one is used below
                    pass
                result = attribute_records(_memray_records(reader, meta.has_native_traces), rank, name,
                                           meta.peak_memory)
            finally:
                reader.close()
    except Exception as exc:  # noqa: BLE001 - memray raises OSError, RuntimeError, ... on bad files
        reason = str(exc).split(":")[0].strip() or type(exc).__name__
        return None, [f"rank {rank}: {name} cannot be read ({reason}); no attribution for this rank"]
    # memray writes the end time into a file's header when tracking stops: a rank killed before that
    # leaves the start time there while its memory snapshots go on; a record cut in half makes the
    # reader complain on stderr.
    end_ms = meta.end_time.timestamp() * 1000
    unfinished = meta.end_time <= meta.start_time or bool(last_snapshot and last_snapshot.time > end_ms)
    if unfinished or "Failed to process" in stderr[0]:
        warnings.append(f"rank {rank}: {name} ends early (the rank was killed before memray closed it, or "
                        "the file was cut short): the peak shown is the peak of what was recorded")
    if not meta.has_native_traces:
        warnings.append(f"rank {rank}: {name} has no native stacks: Horovod and TensorFlow buffers "
                        "cannot be told apart (record with memray's native_traces=True)")
    mismatch = reconciliation_warning(result)
    if mismatch:
        warnings.append(mismatch)
    return result, warnings


# memray's high-water-mark records and the peak in its file's header can differ by a tiny fraction of the
# peak, well below this slack (measured: docs/explanation/attribution.md#how-the-peak-is-attributed): that
# is memray's bookkeeping, not a record left out of a group (every record is in one). A difference warns
# from this size on.
RECONCILE_SLACK_BYTES = 1 << 20


def reconciliation_warning(result: RankAttribution) -> str | None:
    """A warning where the groups (the sum of memray's high-water-mark records) and memray's own peak
    differ by more than :data:`RECONCILE_SLACK_BYTES`; None where they agree that closely."""
    if abs(result.peak_bytes - result.memray_peak_bytes) <= RECONCILE_SLACK_BYTES:
        return None
    return (f"rank {result.rank}: groups add up to {result.peak_bytes} bytes but memray's peak is "
            f"{result.memray_peak_bytes} bytes")


def memray_files(run_dir: str) -> dict[int, str]:
    files = {}
    for path in glob.glob(os.path.join(run_dir, rundir.MEMRAY_GLOB)):
        match = rundir.MEMRAY_FILE.search(path)
        if match:
            files[int(match.group(1))] = path
    return dict(sorted(files.items()))


def _fingerprint(files: dict[int, str]) -> dict[str, Any]:
    rules = hashlib.sha256(json.dumps([CACHE_VERSION, RULES]).encode()).hexdigest()[:16]
    stats = {}
    for path in files.values():
        st = os.stat(path)
        stats[os.path.basename(path)] = [st.st_size, st.st_mtime_ns]
    return {"rules": rules, "files": stats}


def _attribute_one(item: tuple[int, str]) -> tuple[RankAttribution | None, list[str], int]:
    """One file (in a process of its own): its attribution, warnings and the process's peak RSS."""
    rank, path = item
    result, warnings = attribute_file(path, rank)
    return result, warnings, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _available_memory() -> int | None:
    """MemAvailable of /proc/meminfo in bytes (None where there is none)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _readers_at_once(files: int, peak_bytes: int) -> int:
    """How many files to read at once after the first, which took ``peak_bytes``: one per core, as many
    as fit in 80% of the memory available now, and at least one."""
    available = _available_memory()
    fit = 1 if available is None or peak_bytes <= 0 else int(available * 0.8 // peak_bytes)
    return max(1, min(files, os.cpu_count() or 1, fit))


def _read_in_child(item: tuple[int, str], conn: Any) -> None:
    try:
        conn.send(_attribute_one(item))
    finally:
        conn.close()


def _read_in_children(items: list[tuple[int, str]], at_once: int) -> list[tuple[RankAttribution | None, list[str], int]]:
    """Each file read in a process of its own, ``at_once`` at a time (forked: the parent holds little by
    then, and a spawned child would run ``python -m memdiag`` again)."""
    from multiprocessing import connection, get_context

    context = get_context("fork")
    results: list[tuple[RankAttribution | None, list[str], int] | None] = [None] * len(items)
    running: dict[Any, tuple[int, Any, Any]] = {}  # pipe -> (index, process, pipe)
    queued = 0
    while queued < len(items) or running:
        while queued < len(items) and len(running) < at_once:
            receive, send = context.Pipe(duplex=False)
            process = context.Process(target=_read_in_child, args=(items[queued], send), daemon=True)
            process.start()
            send.close()
            running[receive] = (queued, process, receive)
            queued += 1
        for ready in connection.wait(list(running)):
            index, process, receive = running.pop(ready)
            try:
                results[index] = receive.recv()
            except EOFError:  # the reading process died (memray crashed, or it was killed)
                rank, path = items[index]
                results[index] = (None, [f"rank {rank}: reading {os.path.basename(path)} failed (the reading "
                                         f"process ended with code {process.exitcode}); no attribution for this rank"], 0)
            receive.close()
            process.join()
    return [r for r in results if r is not None]


def _attribute_all(files: dict[int, str]) -> list[tuple[RankAttribution | None, list[str]]]:
    """Each file in a fresh process (memray's resolver frees its memory only when the process ends):
    the first alone, to learn what a file takes, then the others as many at a time as cores and
    available memory allow (_readers_at_once)."""
    items = list(files.items())
    try:
        results = _read_in_children(items[:1], 1)
        if len(items) > 1:
            results += _read_in_children(items[1:], _readers_at_once(len(items) - 1, results[0][2]))
    except (OSError, ValueError):  # no processes here (no fork, no pipes): read one by one
        results = [_attribute_one(item) for item in items]
    return [(result, warnings) for result, warnings, _ in results]


def attribute_run(run_dir: str, use_cache: bool = True) -> Attribution | None:
    """Attribution of every rank with a memray file in ``run_dir``; None when there is none."""
    files = memray_files(run_dir)
    if not files:
        return None
    fingerprint = _fingerprint(files)
    cache = os.path.join(run_dir, CACHE_FILE)
    if use_cache:
        try:
            with open(cache, encoding="utf-8") as f:
                cached = json.load(f)
            if cached.get("fingerprint") == fingerprint:
                return Attribution.from_dict(cached)
        except (OSError, ValueError, KeyError, TypeError):
            pass
    attribution = Attribution()
    for result, warnings in _attribute_all(files):
        if result is not None:
            attribution.ranks.append(result)
        attribution.warnings.extend(warnings)
    try:
        tmp = cache + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"fingerprint": fingerprint, **attribution.as_dict()}, f, indent=1)
        os.replace(tmp, cache)
    except OSError:  # a read-only run directory: compute again next time
        pass
    return attribution


def summary_entry(run_dir: str) -> dict[str, Any] | None:
    """summary.json's ``attribution`` when the run has memray files, else None."""
    attribution = attribute_run(run_dir)
    if attribution is None:
        return None
    return {"dir": os.path.abspath(run_dir), **attribution.as_dict()}
