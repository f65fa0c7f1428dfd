"""The records of ``rank-K.jsonl``: one typed class per record type, for the writer and the reader alike.

These are :class:`typing.TypedDict` s, so that a type checker follows a record from the rank that writes
it (:mod:`memdiag.format.writer`) through the reader (:mod:`memdiag.format.reader`) to the analysis,
and a misspelt field is an error before it is a ``KeyError``. The records are written by the ranks as
plain JSON objects; docs/reference/records.md is the reference for users and is kept in step with
this module (tests/unit/test_docs.py checks that each record type documented here is documented there).

Every record has ``type``, ``rank`` and ``t`` (Unix time); a field a rank did not write is absent,
hence ``total=False`` beyond the fields every record of a type carries. A record is made with its
class (``StepRecord(type="step", ...)``) and handed to the writer as a :data:`Record`; the writer stamps
``rank`` and ``t`` where the maker left them out, so those two are not required of a record being made.
"""

from __future__ import annotations

from typing import Any, TypedDict, Union

# The step of everything before the first training step (initial broadcasts, model building):
# records of it carry ``"step": -1``; steps of training count from 0.
SETUP_STEP = -1


class _Stamp(TypedDict, total=False):
    rank: int  # stamped by the writer where the record's maker left it out
    t: float


class _Record(_Stamp):
    type: str


class StartRecord(_Record, total=False):
    format: int  # the records' layout (memdiag.format.layout.RECORDS_FORMAT; absent: 1)
    size: int
    local_size: int
    host: str
    pid: int
    mode: str
    versions: dict[str, str | None]
    cpu_count: int | None  # os.cpu_count(): None where it cannot tell
    # the CPUs the rank may run on (its affinity: the launcher's binding), which TensorFlow sizes its
    # thread pools by; absent: not recorded
    cpus_allowed: int | None
    engine: str  # tf-distribute only (absent: horovod)
    tf_config: dict[str, Any]  # tf-distribute: source (memdiag/environment/script) and value
    marks: str  # how collectives inside graphs are marked: native, or python (and why not native)
    # --record-every: native marks turned into records every this many seconds (0 or absent: every step)
    record_every_s: float
    # a script's native marks kept in rank-K.marks.bin until they are records, so that a rank killed outright
    # still gets every step before the one it was in (memdiag.agent.replay); absent: false
    marks_file: bool
    # who reads RSS every --sample-ms: python (the sampling thread) or native (the marks library's thread,
    # under --record-every without --mem-limit); absent: python
    sampling: str
    # memdiag's own set-up in the rank (Horovod ranks): what RSS grew by from TensorFlow's and Horovod's
    # import (the job's own) to the hand-over to the script or workload, the native marks' ring included
    own_setup_rss_bytes: int
    marks_ring_bytes: int  # the native marks' ring and its reading buffers, resident from the set-up on


class StepRecord(_Record, total=False):
    step: int
    t_start: float
    t_end: float
    step_time_s: float
    peak_rss_bytes: int
    sampled_peak_rss_bytes: int  # the largest RSS sample of the step (peak_rss_bytes: also the high-water mark)
    hwm_bytes: int
    window_start: float | None  # the step's collective window: its first collective's start
    window_end: float | None  # and its last one's end (scripts: the step's end)
    compute_rise_bytes: int  # what RSS rose by outside the window (the compute phase)
    collective_rise_bytes: int  # and inside it
    peak_phase: str | None  # the phase that raised RSS most, or held
    collective_live_peak_bytes: int
    # the analysis's: what the collectives add beyond the inputs they replace (gathered outputs, quotient)
    collective_added_peak_bytes: int
    # the analysis's other bound: every gathered output and quotient of the step alive at once
    collective_live_all_peak_bytes: int
    # glibc's heaps: bytes freed and kept, not returned to the system, read when the step's record is made
    # (memdiag.agent.heap; absent where the C library does not say)
    heap_free_bytes: int
    loss: float
    items: int
    param_digest: str
    warmup: bool  # a step added by --max-warmup
    exact_peak: bool  # peak_rss_bytes is the kernel's high-water mark since the step began
    tail: bool  # a script's last step: from its first gradient reduction to the script's end


class MemAggregates(TypedDict, total=False):
    """A step's RSS samples reduced (memdiag.format.layout.mem_aggregates): a mem record's figures."""

    n: int  # samples taken in the step
    t_first: float
    rss_first: int
    t_last: float
    rss_last: int
    rss_min: int
    rss_max: int
    t_max: float  # when rss_max was first seen
    rss_mean: float
    rss_max_window: int  # the largest sample inside the step's collective window


class MemRecord(_Record, MemAggregates, total=False):
    step: int
    times: list[float]  # the samples themselves, on the steps that keep them (docs/reference/records.md)
    rss: list[int]


class CollectiveRecord(_Record, total=False):
    step: int
    kind: int  # the number of its kind: what collective_calls records refer to
    op: str
    name: str
    part: str | None
    dtype: str
    itemsize: int
    shape_in: list[int]
    shape_out: list[int]
    bytes_in: int
    bytes_out: int
    sparse: bool
    densified: bool
    merged: bool  # duplicate rows summed before the allgather (dedup)
    grouped: bool
    gradient: bool
    reduce_op: str | None
    process_set_size: int | None
    # --engine tf-distribute only:
    engine: str
    stage: str | None  # lengths / values / indices (an IndexedSlices), pack (a dense all-reduce of several)
    padded: bool  # values/indices gathered padded to the longest worker's rows
    pad_in_bytes: int  # zero rows this worker put in: (max - own rows) x row bytes
    pad_out_bytes: int  # zero rows this worker received: (N x max - sum of rows) x row bytes
    rows: int  # padded gathers: this worker's own rows
    rows_total: int  # padded gathers: the sum of every worker's rows
    pack_members: list[str]  # a pack's tensors, in the order they were concatenated


class ChoicesRecord(_Record, total=False):
    """The script's arguments to Horovod's tape or optimizer: open (whatever the API takes), so that
    only the fields every such record has are declared."""

    step: int
    api: str


class ParamsInitialRecord(_Record, total=False):
    """A digest of the trainable variables before the first update."""

    step: int
    digest: str | None  # None: no variable could be read
    variables: int  # how many were read


class ParamsFinalRecord(_Record, total=False):
    """A digest of the same variables at the script's end."""

    digest: str | None  # None: no variable could be read
    variables: int  # how many were read
    captured: int  # how many the hooks saw


class CollectiveCallsRecord(_Record, total=False):
    """The calls of a step from step 32 on, after each kind's first full record."""

    step: int
    t0: float
    kind: list[int]  # the kind of each call, in order of completion
    us: list[int]  # each call's completion, microseconds after t0
    shapes: list[Any]  # [index, shape_in, shape_out] of calls whose shapes differ from their kind's first


class PolicyFields(TypedDict, total=False):
    """A policy record's own fields: the record has them with type, rank, t and step; ``summary.json``'s
    policy entries (:class:`PolicySummary`) have them without those."""

    name: str
    mode: str
    decision: str
    reason: str
    world_size: int
    script_sparse_as_dense: bool | None
    overridden: bool
    local_rows: int | None  # this rank's own rows T (None: unknown when it decided)
    local_distinct_rows: int | None
    agreed_rows: int | None  # the most rows of any rank, agreed (auto; tf-distribute every mode); else None
    distinct_rows: int | None
    gathered_bytes: int | None
    merged_bytes: int | None
    guarded_merged_bytes: int | None
    dedup_guard: float
    # the gradient's shape: None where it was not known when it decided (a table of unknown size)
    dense_bytes: int | None
    row_bytes: int | None
    index_bytes: int | None
    dense_rows: int | None
    row_elements: int | None
    # auto, where the optimizer took the gathered rows summed into a dense gradient (memdiag.optimizer_input):
    optimizer_input: str  # "dense"
    optimizer: str  # its class, whose sparse update was measured to hold more than its dense one
    # --engine tf-distribute only (rows agreed over the workers):
    engine: str
    rows_per_worker: list[int] | None  # None: not known when it decided
    rows_total: int | None
    padding_bytes: int | None


class PolicyRecord(_Record, PolicyFields, total=False):
    step: int


class DistinctRowsRecord(_Record, total=False):
    step: int
    name: str
    rows: int  # T: this rank's rows
    distinct_rows: int  # U: this rank's distinct indices
    merge_s: float | None  # seconds the merge took (unique + segment sum); None when not merged


class ReductionCheckRecord(_Record, total=False):
    step: int
    name: str
    against: str  # dense or dedup: the reduction compared with the allgather
    reduce_op: str
    compression: str | None  # None: MultiWorkerMirroredStrategy, which compresses nothing
    max_abs_diff: float
    max_rel_diff: float
    scale: float
    rounding_bound_ratio: float  # max |diff| / float rounding's bound for the rows' sums (<= 1 passes)
    terms_max: int  # the most rows summed into one row
    rows_compared: int  # the rows some rank looked up
    nonzero_elsewhere: int  # elements nonzero outside them (a failed check)
    skipped: str
    engine: str  # tf-distribute (MultiWorkerMirroredStrategy's check); absent: Horovod


class WaitingRecord(_Record, total=False):
    step: int
    op: str
    name: str
    part: str | None
    bytes_out: int
    since: float


class Received(TypedDict):
    """A collective's output as a killed rank's record names it."""

    op: str
    name: str
    part: str | None
    bytes_out: int


class InFlight(Received):
    """The collective a rank was inside when it was killed or signalled: of those started and not
    completed, the one receiving the most bytes."""

    others_in_flight: int


class KilledRecord(_Record, total=False):
    reason: str
    step: int
    rss_bytes: int
    limit_bytes: int
    hwm_bytes: int
    in_flight: InFlight | None
    received_this_step: list[Received]


class TerminatedRecord(_Record, total=False):
    """Written on SIGTERM (scancel, a time limit, mpirun passing a signal on), before the end record."""

    signal: str
    step: int | None
    in_flight: InFlight | None


class EndRecord(_Record, total=False):
    status: str  # ok / error / environment / terminated
    signal: str  # terminated only: the signal's name
    step: int | None  # terminated only: the step the rank was in
    error: str | None
    hwm_bytes: int
    sampler_cpu_s: float | None  # CPU seconds of memdiag's sampling thread (None: it did not end)
    bookkeeping_failures: dict[str, int]  # what memdiag could not do -> how often (absent: nothing failed)
    mark_ops: int  # native mark ops memdiag added to the job's graphs (docs/reference/records.md)
    mark_op_heap_bytes: int  # the C heap one takes, as measured when the library was built (absent: not)
    mark_op_resident_bytes: int  # the resident memory (RSS) one takes, likewise (absent: not measured)
    begins_shared: int  # all-reduces of small conds that began with their graph's one shared mark


class OwnWorkRecord(_Record, total=False):
    what: str  # memdiag's own work: saving or digesting parameters, ...
    step: int
    within_step: bool  # cut out of the step it ran in (else between steps: in none)
    t_start: float
    t_end: float
    rss_before_bytes: int
    peak_rss_bytes: int
    rss_after_bytes: int


class ReplayedRecord(_Record, total=False):
    """Written after the run, for a rank killed outright (no end record), by memdiag's replay of the marks
    it left in its file (memdiag.agent.replay): the steps those marks completed, written just before it."""

    source: str  # the file: rank-K.marks.bin
    from_t: float  # the end of the last step the rank wrote itself (0: none); the marks replayed are later
    steps: list[int] | None  # the first and last step replayed (None: none, see error)
    marks: int  # marks replayed
    samples: int  # the native timer's samples replayed
    error: str  # why nothing was replayed (a file that could not be read, a ring written over)


class BookkeepingRecord(_Record, total=False):
    step: int
    what: str  # what memdiag could not do (label an allreduce, save the final parameters, ...)
    error: str  # the first such failure's error


class NotAppliedRecord(_Record, total=False):
    step: int
    name: str  # the gradient memdiag could not apply its mode to: it went to Horovod as the script asked
    mode: str
    error: str


class FirstGradientRecord(_Record, total=False):
    step: int
    name: str  # an IndexedSlices gradient, fingerprinted the first time it is reduced (a comparison's runs)
    rows: int  # this rank's rows
    indices_digest: str  # the rows looked up: what the script's data decides
    values_digest: str  # their values: what its data, sampling and initial parameters decide


class FirstGradient(TypedDict):
    """One rank's IndexedSlices gradient the first time it was reduced (summary ``first_gradients``)."""

    step: int | None
    rows: int | None
    indices_digest: str | None
    values_digest: str | None


# What a rank's writer takes (memdiag.format.writer.RecordWriter.add): a record of one of the types above.
Record = Union[StartRecord, StepRecord, MemRecord, CollectiveRecord, CollectiveCallsRecord, PolicyRecord,
               DistinctRowsRecord, ReductionCheckRecord, WaitingRecord, KilledRecord, TerminatedRecord, EndRecord,
               OwnWorkRecord, ReplayedRecord, BookkeepingRecord, NotAppliedRecord, FirstGradientRecord,
               ChoicesRecord, ParamsInitialRecord, ParamsFinalRecord]

# Every record type a rank writes; those with a class above have their fields declared there.
RECORD_TYPES = ("start", "choices", "collective", "collective_calls", "policy", "params_initial", "params_final",
                "mem", "step", "distinct_rows", "reduction_check", "waiting", "killed", "own_work", "bookkeeping",
                "terminated", "end", "replayed", "not_applied", "first_gradient")
RECORD_CLASSES: dict[str, type] = {
    "start": StartRecord, "step": StepRecord, "mem": MemRecord, "collective": CollectiveRecord,
    "collective_calls": CollectiveCallsRecord, "policy": PolicyRecord, "distinct_rows": DistinctRowsRecord,
    "reduction_check": ReductionCheckRecord, "waiting": WaitingRecord, "killed": KilledRecord,
    "own_work": OwnWorkRecord, "bookkeeping": BookkeepingRecord, "end": EndRecord,
    "choices": ChoicesRecord, "params_initial": ParamsInitialRecord, "params_final": ParamsFinalRecord,
    "terminated": TerminatedRecord, "replayed": ReplayedRecord, "not_applied": NotAppliedRecord,
    "first_gradient": FirstGradientRecord,
}
# Record types whose fields are open: any a script passed (the rest have every field declared above).
OPEN_RECORD_TYPES = frozenset({"choices"})


def undeclared_fields(record: dict[str, Any]) -> set[str]:
    """The fields of a record (as read from ``rank-K.jsonl``) that its class above does not declare;
    every field of a record of an unknown type. Empty for the open types."""
    kind = record.get("type")
    if kind in OPEN_RECORD_TYPES:
        return set()
    cls = RECORD_CLASSES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        return set(record)
    return set(record) - _declared(cls)


def _declared(cls: type) -> frozenset[str]:
    fields = _DECLARED.get(cls)
    if fields is None:
        # the keys, without evaluating their annotations (``int | None`` is not an expression before 3.10)
        fields = _DECLARED[cls] = frozenset(cls.__required_keys__ | cls.__optional_keys__)  # type: ignore[attr-defined]
    return fields


_DECLARED: dict[type, frozenset[str]] = {}
