"""The results memdiag builds from the records: ``summary.json``, ``compare.json``, ``scale.json`` and a prediction.

:class:`typing.TypedDict` s, as the records are (:mod:`memdiag.format.records`), so that a type checker
follows a result from the analysis that builds it to the reports that print it; a field a result may
lack is ``NotRequired`` or its class ``total=False``. docs/reference/report-fields.md is the reference.
"""

from __future__ import annotations

import sys
from typing import Any, TypedDict

from memdiag.format.records import FirstGradient, KilledRecord, PolicyFields, ReductionCheckRecord, WaitingRecord

if sys.version_info >= (3, 11):
    from typing import NotRequired
else:  # Python 3.9 and 3.10, which TensorFlow 2.15 supports
    from typing_extensions import NotRequired


class LastCollective(TypedDict):
    """A rank's last recorded collective (a hang's facts)."""

    step: int | None
    op: str
    name: str
    bytes_out: int


class FailureSummary(TypedDict):
    """Why a run did not finish (memdiag.analyze.failure.diagnose): one headline and the facts behind it."""

    kind: str  # mem-limit, timeout, error, died
    headline: str
    killed_ranks: NotRequired[dict[str, KilledRecord]]  # mem-limit: each killed rank's record
    missing: NotRequired[dict[str, list[str]]]  # timeout: per rank, the collectives Horovod's stall report said it lacks
    waiting_ranks: NotRequired[list[int]]  # timeout: the ranks that waited in a collective
    waiting_in: NotRequired[dict[str, WaitingRecord]]  # timeout: per rank, memdiag's record of what it waited in
    last_collective: NotRequired[dict[str, LastCollective | None]]  # timeout: per rank, its last collective


class PhaseFigures(TypedDict):
    """Which phase set a rank's steady peak (memdiag.analyze.steady)."""

    compute_peak_rss_bytes: int | None
    collective_peak_rss_bytes: int | None
    collective_rise_bytes: int | None
    compute_rise_bytes: int | None
    peak_phase: str | None


class SteadyFigures(PhaseFigures):
    """A rank's figures over its steady steps (memdiag.analyze.steady.steady_figures)."""

    steady: bool | None
    steady_from_step: int | None
    first_step_peak_rss_bytes: int | None
    steady_peak_rss_bytes: int | None
    collective_live_peak_bytes: int | None
    collective_added_peak_bytes: int | None  # of them, what adds to the step beyond the inputs they replace
    # the live model's other bound: every gathered output and quotient of a step alive at once
    collective_live_all_peak_bytes: int | None
    # glibc's heaps: bytes freed and kept at the record of the steady step with the largest peak (None: not read)
    heap_free_bytes: int | None
    tail_peak_rss_bytes: int | None  # a script's last step, which runs on to the script's end


class RankSummary(TypedDict, total=False):
    """One rank of ``summary.json`` ``ranks``."""

    rank: int
    status: str
    host: str | None
    cpus_allowed: int | None  # the CPUs it could run on: its affinity, the launcher's binding (None: not recorded)
    cpu_count: int | None  # its host's CPUs
    steps_completed: int
    last_step: int | None
    peak_rss_bytes: int | None
    hwm_bytes: int | None
    allgather_bytes_per_step: int
    allreduce_bytes_per_step: int
    collective_bytes_per_step: int
    step_time_s: float | None
    steady: bool | None  # None: no training step with a peak
    steady_from_step: int | None
    steady_peak_rss_bytes: int | None
    first_step_peak_rss_bytes: int | None
    compute_peak_rss_bytes: int | None
    collective_peak_rss_bytes: int | None
    collective_live_peak_bytes: int | None
    collective_added_peak_bytes: int | None
    collective_live_all_peak_bytes: int | None
    heap_free_bytes: int | None  # glibc's heaps' freed bytes at its steady peak's step record (None: not read)
    compute_rise_bytes: int | None
    collective_rise_bytes: int | None
    peak_phase: str | None
    tail_peak_rss_bytes: int | None  # a script's last step, which runs on to the script's end
    error: str | None
    killed: KilledRecord | None
    sampler_cpu_s: float | None  # memdiag's sampling thread's CPU seconds (the end record's)
    agent_wall_s: float | None  # from the rank's start record to its end record
    own_setup_rss_bytes: int | None  # memdiag's own set-up (the start record's; None: not measured)
    marks_ring_bytes: int | None
    mark_ops: int | None  # native mark ops added to the graphs (the end record's)
    mark_op_heap_bytes: int | None  # the C heap one takes, measured at the library's build (the end record's)
    mark_op_resident_bytes: NotRequired[int | None]  # the resident memory (RSS) one takes, likewise
    begins_shared: int | None  # all-reduces under 64 KiB whose begin was their graph's shared mark
    own_work_spans: int  # memdiag's own work on the rank (own_work records), cut out of every step
    own_work_s: float | None  # their seconds in all (None: none)
    own_work_rise_bytes: int | None  # the most RSS rose above where one of them began (None: none)
    record_every_s: float  # --record-every: native marks made records every this many seconds (0: every step)
    marks_file: bool  # its native marks kept in a file until they were records (the start record's)
    # killed outright: the steps made from the marks it left in that file, first and last (None: none)
    replayed_steps: list[int] | None


class CollectiveSummary(TypedDict):
    """One (tensor, op, part) of ``summary.json`` ``collectives``: over every rank's training steps."""

    name: str
    op: str
    part: str | None
    sparse: bool
    densified: bool
    merged: bool
    reduce_op: str | None
    process_set_size: int | None
    dtype: str | None
    shape_in: list[int] | None
    shape_out: list[int] | None
    rows_in: int | None
    rows_out: int | None
    bytes_in_per_rank: int
    bytes_out_per_rank: int
    bytes_out_mean: float
    calls_per_step: float


class PolicySummary(PolicyFields, total=False):
    """One IndexedSlices gradient of ``summary.json`` ``policy``: the first policy record read, and the
    rows of every rank (memdiag.analyze.rows.gradient_rows)."""

    own_rows_by_rank: dict[str, int] | None  # rank -> its own rows T (the most of any step)
    rows_gathered: int | None  # what every rank receives per step (Horovod: the sum of the ranks' rows)
    rows_largest_rank: int | None
    rows_from: str | None  # trace or records
    # where rows change from step to step: [least, median, most] over every rank's steps; the figures
    # above (own rows, rows gathered) are the most
    own_rows_range: list[int]
    gathered_rows_range: list[int]
    shape_from: str  # records: sizes unknown when traced, read off the records
    formula_gathered_bytes: int | None  # rows_gathered x (row + index)
    reduce_op: str


class DistinctRowsSummary(TypedDict):
    """One IndexedSlices gradient's rows T and distinct rows U over the training steps (its
    ``distinct_rows`` records, every rank's)."""

    name: str
    rows_max: int
    distinct_rows_min: int
    distinct_rows_max: int
    first_step_distinct_rows_max: int  # what auto decided from
    distinct_rows_per_rank: dict[str, list[int]]  # rank -> [min, max] over the steps
    merge_s_median: float | None  # the merge's compute time per step, where the rows were merged
    steps: int


class PaddingSummary(TypedDict):
    """--engine tf-distribute: the zero rows MultiWorkerMirroredStrategy padded one gradient's gathers
    with, at the step and worker with the most."""

    name: str
    padding_bytes_per_step: int
    gathered_bytes_per_step: int
    padding_share: float | None
    rows_per_worker: list[int] | None


class Consistency(TypedDict):
    """Whether the ranks held identical parameters (their digests) at the steps every rank checked."""

    checked_steps: int
    ranks_identical: bool | None  # None: no step was checked on every rank
    mismatched_steps: list[int]


class StepDetail(TypedDict):
    """One training step of ``summary.json`` ``steps_detail``, over the ranks."""

    step: int
    loss_mean: float | None
    step_time_s_max: float
    peak_rss_bytes_max: int  # the largest rank's peak in this step
    params_identical_across_ranks: bool | None


class NotApplied(TypedDict):
    """An IndexedSlices gradient whose records do not show the reduction the run's mode chose for it."""

    name: str
    expected: str  # sparse, dense or dedup: what the mode (or auto's decision) chose
    recorded: list[str]  # the reductions its collective records show (empty: none recorded)
    why: str


class ModeApplied(TypedDict):
    """``summary.json`` ``mode_applied``: the mode a run asked for against what its records show, per
    IndexedSlices gradient (memdiag.analyze.mode_applied)."""

    mode: str
    gradients: list[str]  # the IndexedSlices gradients the records show
    applied: list[str]  # those reduced as the mode chose
    not_applied: list[NotApplied]
    unlabelled: list[str]  # allgathers memdiag could not tie to a variable while labelling failed


class RunSummary(TypedDict, total=False):
    """``summary.json``: one run's figures (memdiag.analyze.summary.summarize; docs/reference/report-fields.md)."""

    format: int  # memdiag.format.rundir.SUMMARY_FORMAT
    workload: str | None
    script: str | None
    preset: str | None
    mode: str  # the manifest's (unknown: a manifest without it)
    world_size: int  # the manifest's (a manifest without it: the ranks whose records were read)
    steps: int | None
    steps_recorded: int
    status: str  # the manifest's (unknown: a manifest without it)
    oversubscribed: bool | None
    peak_rss_bytes_max: int | None  # the largest peak of any rank, set-up and every step included
    steady_peak_rss_bytes_max: int | None  # the largest rank's steady peak: what comparisons use
    steady: bool | None
    first_step_peak_rss_bytes_max: int | None
    compute_peak_rss_bytes_max: int | None
    collective_peak_rss_bytes_max: int | None
    collective_live_peak_bytes_max: int | None
    collective_live_all_peak_bytes_max: int | None
    heap_free_bytes_at_peak: NotRequired[int | None]  # glibc's heaps' freed bytes, of the rank with the largest steady peak
    allgather_groups: list[list[str]]
    peak_phase: str | None
    throughput_items_per_s: float | None
    ranks: list[RankSummary]
    collectives: list[CollectiveSummary]
    policy: list[PolicySummary]
    script_choices: list[dict[str, Any]]
    changes_to_job: list[str]
    memory_environment: dict[str, Any]
    initial_params_digest: str | None
    first_gradients: NotRequired[dict[str, dict[str, FirstGradient]]]  # by gradient, by rank
    final_params_digest: str | None
    steps_detail: list[StepDetail]
    consistency: Consistency
    reduction_checks: list[ReductionCheckRecord]
    distinct_rows: list[DistinctRowsSummary]
    engine: str
    versions: dict[str, str | None]
    padding: list[PaddingSummary]
    failure: FailureSummary | None
    warnings: list[str]
    attribution: dict[str, Any]  # only when the run has memray files
    mode_applied: ModeApplied | None  # an explicit --mode: what the records show of it


class CompareRow(TypedDict, total=False):
    """One (rank count, mode, repeat) row of ``compare.json`` ``rows``: maxima over the run's ranks."""

    world_size: int
    mode: str
    status: str
    # the largest rank's steady peak (summary.json's steady_peak_rss_bytes_max; its overall peak where no training
    # step ran), the median over the row's repeats (one run: that run's)
    steady_peak_rss_bytes_median: float | None  # None: no rank recorded a peak
    peak_spread_bytes: float | None  # with --repeats: max - min over the repeats (the noise)
    # with --repeats: the sample standard deviation of the repeats' peaks (memdiag.analyze.precision)
    peak_sd_bytes: NotRequired[float | None]
    peak_runs: NotRequired[int]  # the repeats with a peak, which peak_sd_bytes is of
    repeats: int
    first_step_peak_rss_bytes: int | None
    steady: bool | None
    peak_phase: str | None
    compute_peak_rss_bytes: int | None
    collective_peak_rss_bytes: int | None
    collective_live_peak_bytes: int | None
    collective_live_all_peak_bytes: int | None
    heap_free_bytes: NotRequired[float | None]  # glibc's heaps' freed bytes at the largest rank's steady peak
    heap_free_spread_bytes: NotRequired[float | None]  # with --repeats: their max - min over the repeats
    # the mean of each run's ranks' steady peaks (median over the repeats), and the ranks' spread about their
    # run's mean: [sum of squared deviations, degrees of freedom] over the row's runs (memdiag.analyze.ranks_spread)
    rank_mean_peak_rss_bytes: NotRequired[float | None]
    rank_spread: NotRequired[list[float] | None]
    collective_bytes_per_rank: int
    allgather_bytes_per_rank: int
    allreduce_bytes_per_rank: int
    step_time_s: float | None
    throughput_items_per_s: float | None
    run_dir: str
    failure: FailureSummary | None


class MergedTensor(TypedDict):
    """What merging did to one gathered tensor in the dedup run at the largest rank count."""

    world_size: int
    rows_largest_rank: int
    distinct_rows_min: int
    distinct_rows_max: int
    distinct_rows_per_rank: dict[str, list[int]]
    gathered_bytes: int  # merged, per rank per step
    unmerged_gathered_bytes: int | None  # the sparse run's at that N (None: no sparse run there)
    bytes_saved: int | None
    merge_s_median: float | None


class GrowthTensor(TypedDict):
    """One IndexedSlices gradient of a comparison (``compare.json`` ``tensors``): its growth per added
    rank on the sparse runs, what auto chose for it, and what merging did."""

    name: str
    growth_bytes_per_rank: int | None  # None: no sparse run gathered it
    gathered_bytes: int | None
    at_world_size: int | None
    auto_decision: NotRequired[str]
    auto_reason: NotRequired[str]
    auto_world_size: NotRequired[int]
    auto_optimizer_input: NotRequired[str]  # "dense": gathered, then handed dense to the optimizer
    dedup: NotRequired[MergedTensor]


class GrowthSegment(TypedDict):
    """Sparse's growth between two rank counts of a comparison against k x the formula (``sparse_segments``)."""

    from_world_size: int
    to_world_size: int
    measured_bytes_per_rank: float  # steady peak (median of repeats) per added rank
    predicted_bytes_per_rank: float  # k x the formula's gathered bytes per added rank
    unexplained_bytes_per_rank: float  # measured - predicted
    # the gap beyond the noise: two standard errors of the segment's growth where both ends have repeats
    # (standard_error_bytes_per_rank), else the noise figure over the segment (None: no noise figure)
    beyond_noise: bool | None
    standard_error_bytes_per_rank: NotRequired[float | None]  # from the two ends' repeats (None: one run)
    # the live model's two bounds over the segment, per added rank (None: a run without the model's figure):
    # one tensor's gathered outputs and quotient at a time, and every one's at once
    live_bytes_per_rank: NotRequired[float | None]
    live_all_bytes_per_rank: NotRequired[float | None]
    # measured: what glibc's heaps held freed and kept grew by, per added rank (each row's median over its
    # repeats; None: not read), and whether the gap less that growth (where positive) is still beyond the noise
    heap_free_bytes_per_rank: NotRequired[float | None]
    heap_free_beyond_noise: NotRequired[bool | None]  # that growth over the segment beyond its own spread
    beyond_noise_after_heap: NotRequired[bool | None]
    # the ranks' spread alone: how much higher the largest of more ranks stands per added rank (None: one rank's
    # figures), and whether the gap less the heaps' kept bytes and that is still beyond the noise
    largest_of_ranks_bytes_per_rank: NotRequired[float | None]
    beyond_noise_after_named: NotRequired[bool | None]
    # the CPUs a rank could run on at each end, where the launcher's binding made them differ (else absent)
    cpus_per_rank: NotRequired[list[list[int]]]


class Physics(TypedDict, total=False):
    """The figures of a comparison's verdict (``compare.json`` ``physics``; memdiag.analyze.physics.physics)."""

    largest_world_size: int | None
    cost_per_gathered_byte: float | None  # k: RSS per gathered byte, from the largest sparse run
    sparse_growth_bytes_per_rank: float | None  # fitted from the rows' steady peaks
    predicted_rss_growth_bytes_per_rank: float | None  # k x the formula's growth
    sparse_growth_within_noise: bool | None
    # what judged it: "standard_error" (within two of the growth's), "repeats" (the largest range of a row's
    # repeats), "ranks" (the largest spread between one run's ranks); and, beyond two standard errors above
    # k x the formula, whether adding the named terms brings it within: the heaps' growth (unless within its
    # own spread) and the ranks' spread term
    sparse_growth_judged_by: NotRequired[str | None]
    sparse_growth_within_after_named: NotRequired[bool | None]
    sparse_segments: NotRequired[list[GrowthSegment]]
    sparse_live_growth_bytes_per_rank: float | None  # modelled: the live collective outputs
    sparse_live_all_growth_bytes_per_rank: NotRequired[float | None]  # the same, every one alive at once
    sparse_heap_free_growth_bytes_per_rank: NotRequired[float | None]  # measured: glibc's heaps' freed bytes
    # the mean over the ranks' peaks, per added rank; the ranks' spread within a run (pooled standard
    # deviation) and what it makes the largest of N ranks grow by alone (memdiag.analyze.ranks_spread)
    sparse_rank_mean_growth_bytes_per_rank: NotRequired[float | None]
    sparse_rank_sd_bytes: NotRequired[float | None]
    sparse_largest_of_ranks_growth_bytes_per_rank: NotRequired[float | None]
    # with --repeats: the growth's standard error from the repeats' spread, and about how many repeats at
    # each rank count would put two of it within 10% of k x the formula (memdiag.analyze.precision)
    sparse_growth_se_bytes_per_rank: NotRequired[float | None]
    sparse_growth_repeats: NotRequired[int | None]  # the fewest repeats of a rank count it is from
    sparse_growth_repeats_for_tenth: NotRequired[int | None]
    sparse_heap_free_within_noise: NotRequired[bool | None]  # its change within its own run-to-run spread
    heap_free_noise_bytes: NotRequired[float | None]
    dense_change: float | None
    dense_peak_bytes: float | None
    auto_densified: list[str]
    auto_merged: list[str]
    auto_dense_to_optimizer: list[str]  # gathered, then handed dense to the optimizer (memdiag.optimizer_input)
    best_fixed_mode: str | None
    lowest_peak_mode: str | None
    lowest_peak_modes_within_noise: NotRequired[list[str] | None]
    auto_vs_sparse: float | None
    auto_minus_best_bytes: float | None
    auto_vs_best_beyond_noise: bool | None
    phases: dict[str, dict[str, str | None]]  # mode -> N -> the phase that set the largest rank's peak
    noise_bytes: float | None
    noise_source: str | None


class ReductionFigures(TypedDict):
    """The worst of a set of reduction checks (memdiag.analyze.correctness.reduction_result)."""

    max_abs_diff: float | None
    max_rel_diff: float | None
    rtol: float
    rounding_bound_ratio: float | None  # <= 1: within float rounding's bound for the rows' sums
    terms_max: int | None
    passed: bool | None  # None: nothing was checked


class ReductionResult(ReductionFigures):
    """Both reductions of the same IndexedSlices gradients compared in the verification run."""

    world_size: int
    tensors: list[str]
    by_reduction: dict[str, ReductionFigures]  # dense, dedup: each path against the allgather
    reduce_ops: list[str]
    skipped: list[str]
    failed_run: NotRequired[str | None]  # the verification run's status, where it did not finish


class VariableCheck(TypedDict):
    """One variable's final values against the reference mode's (memdiag.analyze.verify.VariableDiff)."""

    name: str
    max_abs_diff: float
    max_rel_diff: float
    passed: bool
    max_update: float | None
    allowance: float


class SpreadCheck(TypedDict):
    """The distance between two runs of one mode (another summation order), and whether a failed check is within it."""

    max_abs_diff: float | None
    loss_max_rel_diff: float | None
    within: bool


class RankOrderLook(TypedDict):
    """A failed check looked at again against a run that sums the ranks' gradients in rank order."""

    run: str
    passed: bool | None
    max_abs_diff: float | None
    max_rel_diff: float | None
    loss_max_rel_diff: float | None
    spread: NotRequired[SpreadCheck]


class ParameterCheck(TypedDict):
    """One mode's final parameters and losses against the reference mode's at one rank count."""

    world_size: int
    mode: str
    against: str
    max_abs_diff: float | None
    max_rel_diff: float | None
    loss_max_rel_diff: float | None
    variables: list[VariableCheck]
    passed: bool | None  # None: not compared (see note)
    note: NotRequired[str]
    terms: NotRequired[int | None]
    update_allowance: NotRequired[float | None]
    as_run_passed: NotRequired[bool]  # a check that failed as run and passed on its rank-order look
    rank_order: NotRequired[RankOrderLook]


class Correctness(TypedDict, total=False):
    """A comparison's checks (``compare.json`` ``correctness``; memdiag.analyze.correctness.correctness)."""

    passed: bool | None
    max_abs_diff: float | None
    max_rel_diff: float | None
    rtol: float
    atol: float
    terms_max: int | None
    update_allowance: float | None
    ranks_identical_every_step: bool | None
    reduction: ReductionResult | None  # the reduction check (memdiag.analyze.correctness.reduction_result)
    notes: list[str]
    checks: list[ParameterCheck]  # the parameters of each mode against the reference mode's


class Comparison(TypedDict, total=False):
    """``compare.json`` of one engine (memdiag.analyze.compare.build, with what was compared)."""

    format: int
    headline: str | None
    workload: str
    preset: str | None
    engine: str  # tf-distribute; absent for Horovod's
    rows: list[CompareRow]
    growth_bytes_per_rank: dict[str, float | None]
    collective_growth_bytes_per_rank: dict[str, float | None]
    live_growth_bytes_per_rank: dict[str, float | None]
    live_all_growth_bytes_per_rank: NotRequired[dict[str, float | None]]
    heap_free_growth_bytes_per_rank: NotRequired[dict[str, float | None]]  # glibc's heaps' freed bytes, measured
    heap_free_noise_bytes: NotRequired[float | None]  # their largest spread over repeats (None: no repeats)
    rank_mean_growth_bytes_per_rank: NotRequired[dict[str, float | None]]  # of the mean over the ranks' peaks
    growth_fitted_from_world_size: int
    predicted_growth_bytes_per_rank: int | None
    tensors: list[GrowthTensor]
    correctness: Correctness
    oversubscribed: bool
    # the CPUs a rank could run on (the launcher's binding) by rank count, when some rank was bound to
    # fewer than its host has (None: unbound everywhere, or not recorded)
    binding: NotRequired[dict[str, list[int]] | None]
    memory_environment: dict[str, Any]
    all_ok: bool
    noise_bytes: float | None
    noise_source: str | None
    physics: Physics
    # what was compared (memdiag.launch.studies)
    rank_counts: list[int]
    modes: list[str]
    steps: int | None
    repeats: int
    directory: str


class PredictionRow(TypedDict):
    """One (rank count, mode) of a prediction (``memdiag predict``; memdiag.analyze.model.prediction_table)."""

    world_size: int
    mode: str
    collective_bytes_per_rank: int  # by the formula, from shapes known before the runs fitted
    gathered_bytes_per_rank: int
    peak_rss_bytes: float  # modelled: the larger regime's peak
    # the same with every gathered tensor's outputs and quotient alive at once (the live model's other bound)
    peak_rss_all_at_once_bytes: NotRequired[float]
    regime: str | None  # compute or collectives
    over_budget: bool | None  # None: no --mem-per-rank


class MeasuredRow(TypedDict):
    """A run the prediction was fitted to, beside it: its steady peak and collective bytes."""

    world_size: int
    mode: str
    peak_rss_bytes: int | None
    collective_bytes_per_rank: int


class ShapeFields(TypedDict):
    """One IndexedSlices gradient's sizes as the formula takes them (memdiag.formula.SparseGradientShape)."""

    rows_per_rank: int
    row_bytes: int
    index_bytes: int
    dense_rows: int
    row_elements: int
    distinct_rows: int | None


class TensorRows(TypedDict):
    """Where a prediction's rows of one gradient came from: every rank's, as measured."""

    rows_per_rank: int | None  # what every added rank is assumed to bring: the largest rank's rows
    own_rows_by_rank: dict[str, int] | None
    rows_gathered: int | None  # the sum over the ranks at the measured N
    rows_from: str | None  # trace or records
    own_rows_range: list[int] | None  # rows that change from step to step: [least, median, most]
    world_size: int | None


class Prediction(TypedDict, total=False):
    """What ``memdiag predict`` prints and writes as JSON (memdiag.analyze.model.prediction_table)."""

    rows: list[PredictionRow]
    budget_bytes: float | None
    scan_limit_ranks: int
    ranks_over_budget: dict[str, int | None]  # per mode: the first N over the budget
    regime_change_ranks: dict[str, int | None]  # per mode: the first N where the collectives set the peak
    compute_again_ranks: dict[str, int | None]
    compute_peak_bytes: dict[str, float | None]
    collective_base_bytes: dict[str, float]
    count_overflow: dict[str, int | None]  # per tensor: the first N whose gathered count passes MPI's int
    count_overflow_merged: dict[str, int | None]
    cost_per_gathered_byte: float | None
    reduce_ops: dict[str, str]
    fitted_cost_per_gathered_byte: float | None
    base_bytes: dict[str, float]
    fitted_from_world_sizes: list[int]
    tensors: dict[str, ShapeFields]  # per tensor: its shape
    tensor_rows: dict[str, TensorRows]  # per tensor: every rank's rows, as measured
    not_predicted: dict[str, str]  # gradients left out of the prediction, with why
    measured: list[MeasuredRow]


class Study(TypedDict):
    """What a scaling study ran (``scale.json`` ``study``); one run read as a study has ``scaling`` None."""

    workload: str
    preset: str | None
    scaling: str | None  # weak, strong; None: one run
    mode: str
    steps: int
    rank_counts: list[int]
    hosts: str | None
    overrides: dict[str, str]
    batch_overrides: dict[str, Any]  # per rank count: the batch plan of that run
    mem_limit_bytes: NotRequired[int | None]


class ScaleRow(TypedDict):
    """One rank count of ``scale.json`` ``rows`` (memdiag.analyze.scaling.measured_row): per rank and per
    step, maxima over the ranks."""

    world_size: int
    status: str
    failure: FailureSummary | None
    items_per_rank: float | None
    step_time_s: float | None
    throughput: float | None  # items per second, every rank
    speedup: float | None  # against the smallest rank count with a throughput
    efficiency: float | None
    peak_rss_bytes_max: int | None  # as in summary.json: the overall peak of the largest rank
    collective_bytes_per_rank: int
    allgather_bytes_per_rank: int
    allreduce_bytes_per_rank: int
    collective_time_s: float | None  # median over rank 0's steps, from Horovod's timeline
    collective_time_fraction: float | None
    compute_time_s: float | None
    ranks_per_host: int
    cores_per_host: int
    cores_per_rank: int
    oversubscribed: bool
    run_dir: str


class ScaleResult(TypedDict):
    """``scale.json`` (memdiag.analyze.scaling.build_result; ``memdiag scale`` adds the directory)."""

    study: Study
    rows: list[ScaleRow]
    scaling_experiment: bool  # every rank had the same cores at every N
    warnings: list[str]
    collective_time_method: str
    projection: dict[str, Any] | None  # the alpha-beta projection (memdiag.analyze.projection)
    projection_error: str | None
    directory: NotRequired[str]


class EngineRow(TypedDict, total=False):
    """One (rank count, engine, mode) row of ``compare.json`` ``side_by_side`` (``--engine both``):
    the engine's own comparison row (maxima over the run's ranks; with --repeats the median peak) with
    the bytes the formula predicted for it from the shapes known before the run."""

    world_size: int
    engine: str
    mode: str
    status: str
    steady_peak_rss_bytes_median: float | None  # as in CompareRow
    peak_spread_bytes: float | None
    repeats: int
    peak_phase: str | None
    gathered_bytes_per_rank: int  # values and indices gathered per rank and step (padding included)
    lengths_bytes_per_rank: int  # MWMS's gathers of every worker's row count (not in gathered_bytes_per_rank)
    predicted_gathered_bytes_per_rank: int | None  # formula.gathered_bytes over the gathered tensors
    padding_bytes_per_rank: int | None  # MWMS's zero rows per rank and step (None: the engine pads nothing)
    predicted_padding_bytes_per_rank: int | None  # formula.padding_bytes from every worker's rows
    allreduce_bytes_per_rank: int
    run_dir: str


class EnginePeak(TypedDict):
    engine: str
    mode: str
    peak_rss_bytes: float


class EnginesVerdict(TypedDict, total=False):
    """The figures of the verdict across engines (``compare.json`` ``verdict``, ``--engine both``)."""

    world_size: int | None  # the largest rank count with a completed run
    peaks: list[EnginePeak]  # every completed (engine, mode) at that N, lowest first
    lead_bytes: float | None  # the second lowest peak less the lowest
    noise_bytes: float | None  # the larger of the engines' noise figures
    noise_source: str | None  # repeats (run-to-run) or ranks (the spread between one run's ranks)
    lead_beyond_noise: bool | None
    best_by_engine: dict[str, EnginePeak]  # each engine's lowest peak at that N
    engine_gap_bytes: float | None  # the other engine's lowest peak less the reference engine's
    engine_gap_beyond_noise: bool | None
    gathered_bytes: dict[str, int]  # engine -> gathered bytes per rank and step in mode sparse at that N
    gathered_ratio: float | None  # the other engine's gathered bytes / the reference engine's
    padding_bytes: int | None  # the padding engine's zero rows per rank and step, mode sparse, at that N
    rows_per_worker: dict[str, list[int]]  # per padded tensor: every worker's rows (the policy records)
    equal_rows: bool | None  # every worker had the same rows in every padded tensor: no padding
    formula_exact: dict[str, bool]  # engine -> measured gathered bytes equal the formula's in every sparse run


class EnginesCorrectness(TypedDict):
    """A comparison of engines' checks: each engine's own, and its runs against the reference engine's."""

    passed: bool | None
    by_engine: dict[str, bool | None]
    reduction_checked: list[str]  # the engines whose verification run ran
    across_engines: list[CrossEngineCheck]
    across_engines_passed: bool | None
    rtol: float
    atol: float


class EnginesComparison(TypedDict, total=False):
    """``compare.json`` of ``--engine both`` (memdiag.analyze.engines.build_engines, with what was compared)."""

    format: int
    engine: str  # both
    engine_order: list[str]  # the reference engine first
    workload: str
    preset: str | None
    headline: str | None
    side_by_side: list[EngineRow]
    verdict: EnginesVerdict
    correctness: EnginesCorrectness
    engines: dict[str, Comparison]  # each engine's own comparison
    all_ok: bool
    oversubscribed: bool
    memory_environment: dict[str, Any]
    rank_counts: list[int]
    modes: list[str]
    steps: int | None
    repeats: int
    directory: str


class CrossEngineCheck(TypedDict, total=False):
    """Final parameters of one engine's run against the reference engine's, same rank count and mode."""

    world_size: int
    mode: str
    engine: str
    against_engine: str
    passed: bool | None
    max_abs_diff: float | None
    max_rel_diff: float | None
    loss_max_rel_diff: float | None
    update_allowance: float | None
    terms: int | None
    worst_variable: str | None  # the variable with the largest |diff|
    note: str
    as_run_passed: bool  # present (False) where a second look decided: against the reference's rank-order run
    rank_order: RankOrderLook  # that second look
