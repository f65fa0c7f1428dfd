"""Prediction at larger rank counts: collective bytes per rank (the formula) and peak memory (modelled).

Collective bytes follow :mod:`memdiag.formula`. Each added rank is assumed to bring as many rows as the
largest rank measured (``rows_largest_rank`` of the summaries): where the ranks' rows are equal that is
the formula exactly; where they differ (a script whose ranks look up different numbers of ids; only
``auto`` agrees on rows across ranks) it is N x the largest rank's rows, an upper bound as long as no
added rank looks up more than the largest one measured, which reports say. Rows unknown when the
graph was traced come from the run's records (rows.gradient_rows); a gradient whose sizes no run
recorded is named, with why, in ``not_predicted``, never silently left out.
Peak memory per rank has two regimes:

    peak(N) = max(compute_peak, collective_base + held(N)),   held(N) = k x G(N) over gathered tensors

- G(N) is the bytes one rank receives by allgather for one IndexedSlices gradient at N ranks (the
  formula). Which tensors are gathered depends on the mode: all in ``sparse``, none in ``dense``, those
  whose gathered bytes stay within the margin of their dense size in ``auto``, those the script left
  sparse in ``as-written``. Merged (``dedup``, and ``auto`` where it merges), G(N) counts the distinct
  rows U instead of the rows T: N x U_max x (row + index), U_max the largest U any rank measured in
  the runs (``distinct_rows`` records); auto's choice between the three is
  :func:`memdiag.policy.decide`'s.
- held(N) is what the gathered buffers hold at the peak, and follows the reduce op. Horovod's sparse
  path with op=Average divides the gathered values by N into a second tensor as large (TensorFlow's
  constant folding turns ``values / size`` into a multiplication by 1/N, ``BinaryOp<mul>``); the
  dividend is freed when that product is made. Horovod's background thread receives one response at a
  time, so one tensor's gathered output is alive at a time, beside at most one quotient (its own, or
  the previous tensor's until its update has consumed it): held(N) = max G_i(N) + max values_i(N), for
  one tensor about 2 G. memray's allocation records of the Transformer show exactly this sequence at
  N=2 and N=4 (docs/notes/memory.md, "What is alive in the collective window"). With op=Sum the
  gathered values are used as they are: held(N) = max G_i(N). The allgathers of one grouped call
  (``grouped`` records: grouped_allgather, grouped_allreduce, ``num_groups``/``groups=``) come in one
  response and count together (summary.json's ``allgather_groups``). Allgathers that Horovod fuses into
  one response without a grouped call (ready in the same cycle, together under the fusion threshold)
  are allocated together too: their sum would count instead, which the records do not show (a known limit).
  Horovod 0.28.1 has no allgather path for any other op (Adasum, Min, Max, Product raise
  NotImplementedError and ask for sparse_as_dense), so such a tensor is counted as a dense allreduce
  in every mode. k (held / gathered) is the one figure reports print.
- compute_peak is the peak outside collective windows (activations, optimizer slots, allocator slack):
  it does not grow with N. collective_base + held(N) is the peak inside the collective window.
  collective_base is anchored at the largest N measured (collective peak - held(N)): at small N the
  gathered buffers partly reuse memory the allocator already holds, so a straight fit over small N
  underestimates the slope (that fit is reported beside, for comparison).

At small N the compute regime can set the peak and hide the gathered buffers; the model names, per
mode, the rank count where the collective regime takes over.

Summaries written before the compute and collective peaks were recorded separately (no
``compute_peak_rss_bytes_max``) give one regime, as before: peak(N) = base + held(N), with the base
anchored on the overall peak.

Known limit: the dense allreduce buffers of a tensor that ``auto`` densifies only beyond the largest N
measured are not added to auto's collective base (they do not grow with N; ``dense`` mode's
prediction, anchored on runs where they exist, includes them).

Invariant: ``auto`` is not monotonic in N (a tensor that auto densifies stops growing and its
gathered buffers disappear), so a budget crossing is found by scanning every N up to the limit, not by
bisection over the whole range. The scan is exact and cheap: the set of gathered tensors changes only
at auto's per-tensor switch points, between which held(N) is linear and non-decreasing, so each such
interval is searched on its own (see :meth:`MemoryModel.ranks_over_budget`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any, cast

from memdiag._errors import UserError
from memdiag.format.results import Prediction, PredictionRow, RunSummary, ShapeFields, TensorRows
from memdiag.formula import SparseGradientShape
from memdiag.policy import decide, guarded_distinct_rows

AVERAGE, SUM = "average", "sum"
GATHERING_OPS = (AVERAGE, SUM)  # the only ops Horovod 0.28.1 reduces an IndexedSlices with by allgather
DEFAULT_REDUCE_OP = AVERAGE  # Horovod's default, and what policy records without reduce_op mean
SCAN_LIMIT = 1 << 20
COMPUTE, COLLECTIVES = "compute", "collectives"
REGIME_TOLERANCE = 0.01  # as memdiag.analyze.steady's: what the collectives add must pass 1% of the rest

# Where a mode was not measured, the model borrows the figures of a measured mode, nearest first.
_BORROW = {"auto": ("dense", "sparse"), "dense": ("sparse",), "as-written": ("sparse",), "dedup": ("sparse",)}


@dataclass
class MemoryModel:
    """What a run (or several) measured, reduced to what prediction needs."""

    tensors: dict[str, SparseGradientShape]
    dense_collective_bytes: int  # allreduce bytes per step of the always-dense gradients
    base: dict[str, float]  # per mode: collective_base, the peak in the collective window less held(N)
    compute_peak: dict[str, float] = field(default_factory=dict)  # per mode; absent: one regime
    reduce_ops: dict[str, str] = field(default_factory=dict)  # per tensor; absent: average
    script_densifies: frozenset[str] = frozenset()  # tensors the script itself densifies (as-written)
    fitted_from: list[int] = field(default_factory=list)
    margin: float = 1.0
    fitted_cost: float | None = None  # slope of a straight fit over the measured N, for comparison
    not_predicted: dict[str, str] = field(default_factory=dict)  # gradients left out, with why
    rows: dict[str, TensorRows] = field(default_factory=dict)  # per tensor: every rank's rows, as measured
    groups: list[frozenset[str]] = field(default_factory=list)  # tensors one grouped allgather holds together

    # -- the reduce op and what a gathered byte costs ---------------------------------------------

    def reduce_op(self, name: str) -> str:
        return (self.reduce_ops.get(name) or DEFAULT_REDUCE_OP).lower()

    def averages(self, name: str) -> bool:
        """Whether Horovod divides this tensor's gathered values by N into a second tensor (op=Average)."""
        return self.reduce_op(name) == AVERAGE

    @property
    def cost_per_gathered_byte(self) -> float:
        """k: what the gathered buffers hold at the peak per gathered byte, in ``sparse`` (every tensor
        gathered). It does not depend on N (every term grows as N): the one figure the report prints."""
        gathered = self.gathered_bytes("sparse", 2)
        return self.held_bytes("sparse", 2) / gathered if gathered else 1.0

    # -- bytes (the formula) ------------------------------------------------------------------------

    def reduction(self, name: str, mode: str, world_size: int) -> str:
        """How ``mode`` reduces tensor ``name`` at ``world_size`` ranks: sparse, dedup or dense."""
        if world_size == 1 or mode == "dense" or self.reduce_op(name) not in GATHERING_OPS:
            return "dense"  # one rank runs no collective; other ops have no allgather path
        t = self.tensors[name]
        if mode == "auto":
            return decide("auto", name, world_size, t, self.margin).reduction  # memdiag.policy's rule
        if mode == "as-written":
            return "dense" if name in self.script_densifies else "sparse"
        if mode == "dedup" and t.distinct_rows is not None:
            return "dedup"
        return "sparse"  # dedup without a measured U: counted as the allgather of every row

    def gathers(self, name: str, mode: str, world_size: int) -> bool:
        """Whether ``mode`` reduces tensor ``name`` by allgather (merged or not) at ``world_size`` ranks."""
        return self.reduction(name, mode, world_size) != "dense"

    def tensor_gathered(self, name: str, mode: str, world_size: int) -> int:
        """G(N) of one tensor in ``mode``: its rows T gathered, its distinct rows U, or 0 (dense)."""
        reduction, t = self.reduction(name, mode, world_size), self.tensors[name]
        if reduction == "dense":
            return 0
        merged = t.merged(world_size) if reduction == "dedup" else None
        return t.gathered(world_size) if merged is None else merged

    def tensor_gathered_values(self, name: str, mode: str, world_size: int) -> int:
        """The values part of :meth:`tensor_gathered`: what Horovod's averaging copies."""
        reduction, t = self.reduction(name, mode, world_size), self.tensors[name]
        if reduction == "dense":
            return 0
        rows = t.distinct_rows if reduction == "dedup" and t.distinct_rows is not None else t.rows_per_rank
        return world_size * rows * t.row_bytes

    def gathered_bytes(self, mode: str, world_size: int) -> int:
        return sum(self.tensor_gathered(name, mode, world_size) for name in self.tensors)

    def held_bytes(self, mode: str, world_size: int) -> float:
        """What the gathered buffers hold at the peak: the largest gathered output G(N) (merged: its U
        rows) plus, under op=Average, the largest quotient.

        Horovod reduces an IndexedSlices as ``allgather(values) / size``: the quotient is a second
        tensor of the gathered values' size, and the dividend is freed once the quotient is made. The
        tensors' allgathers complete one after another, and a quotient is alive until its tensor's
        update, which may come after the next tensor's gathered output arrives: so one gathered output
        and one quotient at a time, max G + max values (for one tensor G + values, about 2 G). The
        tensors of one grouped call (``groups``) are gathered in one response: their outputs, and their
        quotients, count together.
        """
        gathered, quotients = self._units_held(mode, world_size)
        return max(gathered, default=0) + max(quotients, default=0)

    def held_all_bytes(self, mode: str, world_size: int) -> float:
        """The other bound of :meth:`held_bytes`: every tensor's gathered output and quotient alive at once,
        as when the tensors' reductions overlap (memdiag.analyze.live_bytes.LiveStep.all_at_once_bytes)."""
        gathered, quotients = self._units_held(mode, world_size)
        return sum(gathered) + sum(quotients)

    def _units_held(self, mode: str, world_size: int) -> tuple[list[int], list[int]]:
        """Per unit (a tensor, or the tensors of one grouped call), its gathered bytes and its quotient's."""
        names = [name for name in self.tensors if self.gathers(name, mode, world_size)]
        # The allgathers of one grouped call are allocated together: a group counts as one tensor.
        units: list[list[str]] = [[n for n in group if n in names] for group in self.groups]
        grouped = {n for unit in units for n in unit}
        units += [[name] for name in names if name not in grouped]
        gathered = [sum(self.tensor_gathered(n, mode, world_size) for n in unit) for unit in units]
        quotients = [sum(self.tensor_gathered_values(n, mode, world_size) for n in unit if self.averages(n))
                     for unit in units]
        return gathered, quotients

    def collective_bytes(self, mode: str, world_size: int) -> int:
        """Bytes each rank receives per step, from the formula."""
        if world_size == 1:
            return 0
        densified = sum(t.dense() for name, t in self.tensors.items() if not self.gathers(name, mode, world_size))
        return self.dense_collective_bytes + self.gathered_bytes(mode, world_size) + densified

    # -- peak memory (modelled) -------------------------------------------------------------------

    def _for_mode(self, values: dict[str, float], mode: str) -> float | None:
        for candidate in (mode, *_BORROW.get(mode, ("sparse",))):
            if candidate in values:
                return values[candidate]
        return next(iter(values.values()), None)

    def collective_base(self, mode: str) -> float:
        base = self._for_mode(self.base, mode)
        return 0.0 if base is None else base

    def compute_peak_of(self, mode: str) -> float | None:
        """The compute regime's peak for ``mode``; None when the summaries did not record it."""
        return self._for_mode(self.compute_peak, mode)

    def collective_peak(self, mode: str, world_size: int) -> float:
        return self.collective_base(mode) + self.held_bytes(mode, world_size)

    def peak(self, mode: str, world_size: int) -> float:
        compute = self.compute_peak_of(mode)
        collective = self.collective_peak(mode, world_size)
        return collective if compute is None else max(compute, collective)

    def peak_all_at_once(self, mode: str, world_size: int) -> float:
        """:meth:`peak` with every gathered tensor's buffers alive at once (:meth:`held_all_bytes`) on the
        same collective base."""
        compute = self.compute_peak_of(mode)
        collective = self.collective_base(mode) + self.held_all_bytes(mode, world_size)
        return collective if compute is None else max(compute, collective)

    def regime(self, mode: str, world_size: int) -> str | None:
        """Which regime sets the peak at ``world_size``; None for one-regime (older) summaries. One rank
        runs no collective, so its peak is never the collectives'."""
        compute = self.compute_peak_of(mode)
        if compute is None:
            return None
        if world_size < 2:
            return COMPUTE
        return COLLECTIVES if self._collectives_set(mode, world_size, compute) else COMPUTE

    def _collectives_set(self, mode: str, world_size: int, compute: float) -> bool:
        """The collective window passes the compute peak, and what the gathered buffers hold is more than 1%
        of the rest of the peak (memdiag.analyze.steady.held_phase's rule): a window above the compute
        peak with nothing gathered is the backward pass that overlaps the reductions, not the collectives."""
        held = self.held_bytes(mode, world_size)
        collective = self.collective_base(mode) + held
        return collective > compute and held > REGIME_TOLERANCE * (max(compute, collective) - held)

    # -- scanning N -------------------------------------------------------------------------------

    def switch_points(self, mode: str, limit: int = SCAN_LIMIT) -> list[int]:
        """Rank counts where the set of gathered tensors may change: N=1 and 2 (no collective on one
        rank) and, in ``auto``, each tensor's last sparse N and the one after it."""
        points = {1, 2}
        if mode == "auto":
            for t in self.tensors.values():
                last = _last_sparse_ranks(t, self.margin)
                points.update({last, last + 1})
        return sorted(p for p in points if 1 <= p <= limit)

    def intervals(self, mode: str, limit: int = SCAN_LIMIT) -> Iterator[tuple[int, int]]:
        """[low, high] ranges of N, in order, covering 1..limit, within which the same tensors are
        gathered: held(N) is linear and non-decreasing inside each."""
        points = self.switch_points(mode, limit)
        for low, nxt in zip(points, points[1:] + [limit + 1]):
            yield low, nxt - 1

    def first_rank_count(self, mode: str, above: Callable[[int], bool], limit: int = SCAN_LIMIT) -> int | None:
        """Smallest N in 1..limit where ``above(N)`` holds, for a predicate that is monotonic (False
        then True) wherever held(N) is non-decreasing: each interval is checked at its end and
        bisected only inside, so a crossing that auto later undoes is still found."""
        for low, high in self.intervals(mode, limit):
            if not above(high):
                continue
            while low < high:
                mid = (low + high) // 2
                if above(mid):
                    high = mid
                else:
                    low = mid + 1
            return low
        return None

    def ranks_over_budget(self, mode: str, budget: float, limit: int = SCAN_LIMIT) -> int | None:
        """Smallest N whose predicted peak exceeds ``budget`` (None if none up to ``limit``)."""
        return self.first_rank_count(mode, lambda n: self.peak(mode, n) > budget, limit)

    def regime_change_ranks(self, mode: str, limit: int = SCAN_LIMIT) -> int | None:
        """Smallest N where the collective window sets the peak (collective_base + held(N) > compute_peak),
        from N=2 (one rank runs no collective); None when the compute peak is unknown or always higher
        up to ``limit``."""
        compute = self.compute_peak_of(mode)
        if compute is None:
            return None
        return self.first_rank_count(mode, lambda n: n >= 2 and self._collectives_set(mode, n, compute), limit)

    def compute_again_ranks(self, mode: str, limit: int = SCAN_LIMIT) -> int | None:
        """After the collective regime took over, the first N where compute sets the peak again (auto
        has densified the tensors that mattered); None if it never does up to ``limit``. held(N) only
        drops where an interval starts, so only interval starts need checking."""
        start = self.regime_change_ranks(mode, limit)
        if start is None:
            return None
        return next((low for low, _ in self.intervals(mode, limit)
                     if low > start and self.regime(mode, low) == COMPUTE), None)


def _last_sparse_ranks(t: SparseGradientShape, margin: float) -> int:
    """The largest N at which auto still gathers ``t``, merged or not, exactly. Both gathered costs
    grow through 0 as N, so the choice between them does not change with N; only the dense cost is
    flat: the last N is where the cheaper of the two (with U x guard) still stays within margin x dense."""
    def gathers(n: int) -> bool:
        return decide("auto", "t", n, t, margin).reduction != "dense"

    per_rank = t.gathered(1)
    if t.distinct_rows is not None:
        per_rank = min(per_rank, guarded_distinct_rows(t.distinct_rows, t.rows_per_rank)
                       * (t.row_bytes + t.index_bytes))
    if not per_rank:
        return SCAN_LIMIT
    n = int(margin * t.dense() // per_rank)
    while n < SCAN_LIMIT and gathers(n + 1):  # float margin: settle the rounding on the rule itself
        n += 1
    while n > 0 and not gathers(n):
        n -= 1
    return max(n, 1)


# -- from summaries -------------------------------------------------------------------------------

_SIZES = ("row_bytes", "index_bytes", "dense_rows", "row_elements")
_WHY = {
    "rows_per_rank": "its rows per rank were unknown when the graph was traced and no run recorded them (no "
                     "allgather of it and no distinct_rows record; a sparse run records them)",
    "dense_rows": "its table's row count was not recorded (the graph was traced without the gradient's shape "
                  "and no run densified it; a dense run records it)",
    "row_bytes": "its row width was not recorded (the graph was traced without the gradient's shape and no "
                 "run gathered it; a sparse run records it)",
}


def gradient_fields(summary: RunSummary) -> dict[str, dict[str, Any]]:
    """Per IndexedSlices gradient of one run, what prediction needs, None where the run did not know it:
    ``rows_per_rank`` the largest rank's rows (what every added rank is assumed to bring; summaries
    older than ``rows_largest_rank`` give the agreed rows, else the first policy record's own), the sizes of the formula, U (the
    most distinct rows any rank measured at any step; older summaries have none) and, for the
    report, every rank's rows and the rows gathered."""
    distinct = {d["name"]: d["distinct_rows_max"] for d in summary.get("distinct_rows", [])}
    fields = {}
    for p in summary.get("policy", []):
        largest = p.get("rows_largest_rank")
        if largest is None:
            largest = p.get("agreed_rows") if p.get("agreed_rows") is not None else p.get("local_rows")
        fields[p["name"]] = {"rows_per_rank": largest,
                             **{k: p.get(k) for k in _SIZES}, "distinct_rows": distinct.get(p["name"]),
                             "own_rows_by_rank": p.get("own_rows_by_rank"), "rows_gathered": p.get("rows_gathered"),
                             "rows_from": p.get("rows_from"), "own_rows_range": p.get("own_rows_range"),
                             "world_size": summary.get("world_size")}
    return fields


def shapes_from_fields(fields: dict[str, dict[str, Any]]) -> tuple[dict[str, SparseGradientShape], dict[str, str]]:
    """The gradients whose every size is known, and the others by name with why they are not: no
    gradient is left out of a prediction without saying so."""
    tensors: dict[str, SparseGradientShape] = {}
    not_predicted: dict[str, str] = {}
    for name, f in fields.items():
        missing = [k for k in ("rows_per_rank", *_SIZES) if f.get(k) is None]
        if missing:
            reasons = dict.fromkeys(_WHY["row_bytes" if k in ("index_bytes", "row_elements") else k] for k in missing)
            not_predicted[name] = "; ".join(reasons)
            continue
        tensors[name] = SparseGradientShape(**{k: f[k] for k in ("rows_per_rank", *_SIZES)},
                                            distinct_rows=f.get("distinct_rows"))
    return tensors, not_predicted


def merged_fields(summaries: list[RunSummary]) -> dict[str, dict[str, Any]]:
    """:func:`gradient_fields` over several runs: each field from the run of the most ranks that knows
    it (a sparse run records the rows, a dense run the table's size)."""
    merged: dict[str, dict[str, Any]] = {}
    for summary in sorted(summaries, key=lambda s: s["world_size"]):
        for name, f in gradient_fields(summary).items():
            entry = merged.setdefault(name, {})
            entry.update({k: v for k, v in f.items() if v is not None})
    return merged


def gradients_from_summaries(summaries: list[RunSummary]) -> tuple[dict[str, SparseGradientShape], dict[str, str]]:
    """The IndexedSlices gradients of the runs that can be predicted, and those that cannot, with why."""
    return shapes_from_fields(merged_fields(summaries))


def dense_collective_bytes(summary: RunSummary) -> int:
    """Per-step allreduce bytes of gradients that are dense whatever the mode."""
    return sum(c["bytes_out_per_rank"] * round(c["calls_per_step"]) for c in summary["collectives"]
               if c["op"] == "allreduce" and not c["sparse"])


def collective_window_peak(summary: RunSummary) -> float | None:
    """The peak the collective regime is anchored on: inside collective windows where the summary
    records it, else the steady-state or overall peak (older summaries, and one-rank runs, which have
    no collective window)."""
    peak = (summary.get("collective_peak_rss_bytes_max") or summary.get("steady_peak_rss_bytes_max")
            or summary.get("peak_rss_bytes_max"))
    return float(peak) if peak else None


def _runs_to_fit(summaries: list[RunSummary], mode: str) -> list[RunSummary]:
    """A mode's runs with a peak; those with N >= 2 where there are any: one rank runs no collective
    and allocates none of Horovod's buffers (fusion buffer, background thread), so it says nothing
    about either regime at N >= 2."""
    runs = [s for s in summaries if s["mode"] == mode and collective_window_peak(s) is not None]
    several = [s for s in runs if s["world_size"] > 1]
    return sorted(several or runs, key=lambda s: s["world_size"])


def fit_compute_peak(runs: list[RunSummary]) -> float | None:
    """The compute regime's peak: the MAX over the runs of ``compute_peak_rss_bytes_max``.

    Max, not median: the compute peak does not depend on N, so the runs differ only by measurement
    (allocator slack, which step set the peak); a budget check must not promise less memory than a
    run already needed, and with the two or three rank counts a comparison measures a median would
    be the mean of two and fall below a measured peak.
    """
    values = [float(peak) for s in runs if (peak := s.get("compute_peak_rss_bytes_max"))]
    return max(values) if values else None


def build_model(summaries: list[RunSummary], margin: float = 1.0) -> MemoryModel:
    """From one run or several (a comparison): tensors and reduce ops, and per mode the compute peak
    and the collective base anchored at the largest N measured."""
    fields = merged_fields(summaries)
    tensors, not_predicted = shapes_from_fields(fields)
    reduce_ops: dict[str, str] = {}
    script_densifies: set[str] = set()
    for summary in sorted(summaries, key=lambda s: s["world_size"]):
        for p in summary.get("policy", []):
            if p.get("reduce_op"):
                reduce_ops[p["name"]] = p["reduce_op"]
            if p.get("script_sparse_as_dense"):
                script_densifies.add(p["name"])
    dense_bytes = max((dense_collective_bytes(s) for s in summaries if s["world_size"] > 1), default=0)
    rows: dict[str, TensorRows] = {
        name: {"rows_per_rank": fields[name].get("rows_per_rank"), "own_rows_by_rank": fields[name].get("own_rows_by_rank"),
               "rows_gathered": fields[name].get("rows_gathered"), "rows_from": fields[name].get("rows_from"),
               "own_rows_range": fields[name].get("own_rows_range"),
               "world_size": fields[name].get("world_size")} for name in tensors}
    groups = {frozenset(n for n in group if n in tensors) for s in summaries for group in s.get("allgather_groups", [])}
    model = MemoryModel(tensors, dense_bytes, {}, reduce_ops=reduce_ops, script_densifies=frozenset(script_densifies),
                        fitted_from=[s["world_size"] for s in summaries], margin=margin,
                        not_predicted=not_predicted, rows=rows, groups=sorted((g for g in groups if len(g) > 1), key=sorted))
    for mode in sorted({s["mode"] for s in summaries}):
        runs = _runs_to_fit(summaries, mode)
        if not runs:
            continue
        anchor = runs[-1]
        peak = collective_window_peak(anchor)
        if peak is None:
            continue
        model.base[mode] = peak - model.held_bytes(mode, anchor["world_size"])
        compute = fit_compute_peak(runs)
        if compute is not None:
            model.compute_peak[mode] = compute
    if not model.base:
        raise UserError("no run recorded a peak RSS (did every rank fail before its first step?); "
                        "predict needs at least one run that completed a step")
    # The straight fit, for comparison: over N >= 2 where two such N were measured, else over all.
    sparse = sorted((s for s in summaries if s["mode"] == "sparse" and collective_window_peak(s) is not None),
                    key=lambda s: s["world_size"])
    several = [s for s in sparse if s["world_size"] > 1]
    fitted = several if len({s["world_size"] for s in several}) >= 2 else sparse
    fit = linear_fit([_gathered_as_run(model, s) for s in fitted],
                     [float(collective_window_peak(s) or 0.0) for s in fitted])
    model.fitted_cost = None if fit is None else fit[0]
    return model


def _gathered_as_run(model: MemoryModel, summary: RunSummary) -> float:
    """The bytes a sparse run gathered per rank by the formula with its own rows (the sum over its ranks
    where the summary has it), not the model's extrapolation from the largest rank."""
    n = summary["world_size"]
    fields = gradient_fields(summary)
    total = 0
    for name, t in model.tensors.items():
        if not model.gathers(name, "sparse", n):
            continue
        rows = (fields.get(name) or {}).get("rows_gathered")
        total += t.gathered(n) if rows is None or n == 1 else rows * (t.row_bytes + t.index_bytes)
    return float(total)


def prediction_table(model: MemoryModel, rank_counts: list[int], modes: list[str],
                     budget: float | None = None) -> Prediction:
    """Per rank count and mode: collective bytes, peak and which regime sets it; per mode: where the
    budget is passed and where the collective regime takes over; per tensor: where its gathered count
    passes MPI's 32-bit limit."""
    rows: list[PredictionRow] = [
            {"world_size": n, "mode": mode, "collective_bytes_per_rank": model.collective_bytes(mode, n),
             "gathered_bytes_per_rank": model.gathered_bytes(mode, n), "peak_rss_bytes": model.peak(mode, n),
             "peak_rss_all_at_once_bytes": model.peak_all_at_once(mode, n),
             "regime": model.regime(mode, n),
             "over_budget": None if budget is None else model.peak(mode, n) > budget}
            for n in rank_counts for mode in modes]
    return {
        "rows": rows,
        "budget_bytes": budget,
        "scan_limit_ranks": SCAN_LIMIT,
        "ranks_over_budget": {m: (None if budget is None else model.ranks_over_budget(m, budget)) for m in modes},
        "regime_change_ranks": {m: model.regime_change_ranks(m) for m in modes},
        "compute_again_ranks": {m: model.compute_again_ranks(m) for m in modes},
        "compute_peak_bytes": {m: model.compute_peak_of(m) for m in modes},
        "collective_base_bytes": {m: model.collective_base(m) for m in modes},
        "count_overflow": {name: shape.overflow_ranks() for name, shape in model.tensors.items()},
        # merging first gathers U rows per rank, not T: its own limit, where U was measured
        "count_overflow_merged": {name: shape.merged_overflow_ranks() for name, shape in model.tensors.items()
                                  if shape.merged_overflow_ranks() is not None},
        "cost_per_gathered_byte": model.cost_per_gathered_byte,
        "reduce_ops": {name: model.reduce_op(name) for name in model.tensors},
        "fitted_cost_per_gathered_byte": model.fitted_cost,
        "base_bytes": model.base,
        "fitted_from_world_sizes": sorted(set(model.fitted_from)),
        "tensors": {name: cast(ShapeFields, asdict(shape)) for name, shape in model.tensors.items()},
        # what every added rank is assumed to bring: the largest rank's rows, beside what was measured
        "tensor_rows": model.rows,
        "not_predicted": model.not_predicted,
    }


def linear_fit(xs: list[float], ys: list[float]) -> tuple[float, float] | None:
    """Least-squares slope and intercept of y = slope * x + intercept (None under two points)."""
    points = [(x, y) for x, y in zip(xs, ys) if y is not None]
    if len({x for x, _ in points}) < 2:
        return None
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    sxx = sum((x - mean_x) ** 2 for x, _ in points)
    sxy = sum((x - mean_x) * (y - mean_y) for x, y in points)
    slope = sxy / sxx
    return slope, mean_y - slope * mean_x
