"""Which way to reduce each IndexedSlices gradient: allgather, merge-then-allgather, or dense allreduce.

``as-written`` keeps what the script asked for (Horovod's ``sparse_as_dense``, False by default): memdiag
observes and changes nothing. ``sparse`` and ``dense`` are explicit overrides (Horovod's default path and
its all-or-nothing ``sparse_as_dense=True``). ``dedup`` sums the rows of equal index on each rank first,
then lets Horovod gather only the distinct rows. ``auto`` decides per tensor from :mod:`memdiag.formula`,
choosing the cheapest of the three in gathered bytes.

Invariant: a decision changes which collective every rank issues, so it must be the same on every rank
of the process set. ``auto`` therefore decides from the largest row count, and the largest distinct row
count, over those ranks (agreed by the caller, see :class:`memdiag.densify.DensifyPolicy`), never from
one rank's own.

The distinct rows U depend on the data and are measured at the first step only: ``auto`` chooses
``dedup`` only if it still beats both others with U x ``DEDUP_GUARD`` (capped at the T rows, which U can
never exceed), so that U may grow by that factor in later steps before the choice stops being the
cheapest. U is recorded every step (``distinct_rows`` records) so a report can show when it does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from memdiag.format.records import PolicyRecord
from memdiag.formula import SparseGradientShape, padding_bytes
from memdiag.units import format_bytes

AS_WRITTEN = "as-written"
MODES = (AS_WRITTEN, "sparse", "dense", "auto", "dedup")
REDUCTIONS = ("sparse", "dedup", "dense")  # allgather, merge then allgather, dense allreduce
DEFAULT_MARGIN = 1.0
# The reductions for which Horovod gathers an IndexedSlices (None: its default, average); under any
# other it raises, so auto densifies.
GATHERED_OPS = (None, "average", "sum")
HOROVOD_OPS = ("Average", "Sum", "Adasum", "Min", "Max", "Product")  # Horovod's reduce ops, by attribute name


def horovod_op_names(hvd: Any) -> dict[int, str]:
    """Horovod's reduce ops (``hvd.Adasum`` ...) by value -> the names the policy takes (``adasum``)."""
    return {int(getattr(hvd, name)): name.lower() for name in HOROVOD_OPS}
# Deliberately wrong reductions, for tests of the verification: densified gradients summed instead of
# averaged; duplicate rows dropped (the first kept) instead of summed when merging.
FAULTS = ("sum-densified", "drop-duplicates")
# auto picks dedup only if it wins with the first step's U times this (capped at T): U may grow by 25%.
DEDUP_GUARD = 1.25


def guarded_distinct_rows(distinct_rows: int, rows_per_rank: int, guard: float = DEDUP_GUARD) -> int:
    """The distinct row count auto plans for: U x guard, rounded up, never more than the T rows."""
    return min(rows_per_rank, math.ceil(distinct_rows * guard))


@dataclass(frozen=True)
class Decision:
    """The policy's choice for one gradient, with the figures behind it.

    ``reduction`` is one of :data:`REDUCTIONS`. ``shape.rows_per_rank`` is the agreed row count (the
    largest over the ranks), ``shape.distinct_rows`` the agreed distinct row count (None: not measured);
    ``local_rows`` and ``local_distinct_rows`` are this rank's own. ``script_densifies`` is what the
    script asked for (its ``sparse_as_dense``).
    """

    name: str
    reduction: str
    reason: str
    world_size: int
    shape: SparseGradientShape | None = None
    script_densifies: bool = False
    local_rows: int | None = None
    mode: str = AS_WRITTEN
    local_distinct_rows: int | None = None
    guard: float = DEDUP_GUARD
    # --engine tf-distribute: every worker's rows (agreed: the same tuple on every worker), for the padding.
    rows_per_worker: tuple[int, ...] | None = None
    engine: str | None = None
    # auto: the gathered rows summed into a dense gradient before this optimizer's update, whose sparse
    # update was measured to hold more than its dense one (memdiag.optimizer_input); None: as reduced
    dense_update_by: str | None = None

    @property
    def densify(self) -> bool:
        return self.reduction == "dense"

    @property
    def merge(self) -> bool:
        return self.reduction == "dedup"

    @property
    def overridden(self) -> bool:
        """True when this run reduces the tensor otherwise than the script asked."""
        return self.reduction != ("dense" if self.script_densifies else "sparse")

    @property
    def gathered_bytes(self) -> int | None:
        return None if self.shape is None else self.shape.gathered(self.world_size)

    @property
    def merged_bytes(self) -> int | None:
        return None if self.shape is None else self.shape.merged(self.world_size)

    @property
    def guarded_merged_bytes(self) -> int | None:
        """The merged bytes auto compared: with U x guard (capped at T)."""
        shape = self.shape
        if shape is None or shape.distinct_rows is None:
            return None
        rows = guarded_distinct_rows(shape.distinct_rows, shape.rows_per_rank, self.guard)
        return replace(shape, distinct_rows=rows).merged(self.world_size)

    @property
    def dense_bytes(self) -> int | None:
        return None if self.shape is None else self.shape.dense()

    @property
    def padding_bytes(self) -> int | None:
        """Of :attr:`gathered_bytes`, the zero rows MultiWorkerMirroredStrategy pads with (None: not
        that engine, or rows unknown)."""
        if self.shape is None or self.rows_per_worker is None:
            return None
        return padding_bytes(self.rows_per_worker, self.shape.row_bytes, self.shape.index_bytes)

    @property
    def rows_agreed(self) -> bool:
        """Whether the ranks agreed on the rows the decision used (auto; every mode of
        MultiWorkerMirroredStrategy, which pads its gathers to the longest worker's rows)."""
        return self.mode == "auto" or self.engine is not None

    def as_record(self, step: int | None = None) -> PolicyRecord:
        """The decision as a ``policy`` record (of step ``step``, where given)."""
        shape = self.shape
        record = PolicyRecord(
            type="policy",
            name=self.name,
            mode=self.mode,
            decision=self.reduction,
            reason=self.reason,
            world_size=self.world_size,
            script_sparse_as_dense=self.script_densifies,
            overridden=self.overridden,
            # unagreed, the decision's rows are this rank's own
            local_rows=self.local_rows if self.local_rows is not None or shape is None or self.rows_agreed
            else shape.rows_per_rank,
            local_distinct_rows=self.local_distinct_rows,
            gathered_bytes=self.gathered_bytes,
            merged_bytes=self.merged_bytes,
            guarded_merged_bytes=self.guarded_merged_bytes,
            dedup_guard=self.guard,
            dense_bytes=self.dense_bytes,
            # The rows the decision used, where every rank agreed on them (auto, and MultiWorkerMirroredStrategy
            # in every mode): the most of any rank. Elsewhere each rank used its own (local_rows).
            agreed_rows=None if shape is None or not self.rows_agreed else shape.rows_per_rank,
            distinct_rows=None if shape is None else shape.distinct_rows,
            row_bytes=None if shape is None else shape.row_bytes,
            index_bytes=None if shape is None else shape.index_bytes,
            dense_rows=None if shape is None else shape.dense_rows,
            row_elements=None if shape is None else shape.row_elements,
        )
        if self.dense_update_by is not None:
            record["optimizer_input"], record["optimizer"] = "dense", self.dense_update_by
        if self.engine is not None:  # fields of --engine tf-distribute only: Horovod's records are unchanged
            record["engine"] = self.engine
            record["rows_per_worker"] = None if self.rows_per_worker is None else list(self.rows_per_worker)
            record["rows_total"] = None if self.rows_per_worker is None else sum(self.rows_per_worker)
            record["padding_bytes"] = self.padding_bytes
        if step is not None:
            record["step"] = step
        return record


def decide(
    mode: str,
    name: str,
    world_size: int,
    shape: SparseGradientShape | None,
    margin: float = DEFAULT_MARGIN,
    script_densifies: bool = False,
    local_rows: int | None = None,
    local_distinct_rows: int | None = None,
    guard: float = DEDUP_GUARD,
    reduce_op: str | None = None,
) -> Decision:
    """Decide how to reduce the IndexedSlices gradient ``name`` on ``world_size`` ranks.

    ``shape`` carries the row count (and, if measured, the distinct row count) agreed over all ranks;
    it is None when no row count could be had (``auto`` then keeps the script's choice and says why).
    ``margin`` > 1 keeps the gathered paths until they exceed the dense size by that factor; ``guard``
    is the growth of U that ``dedup`` must survive to be chosen (see :data:`DEDUP_GUARD`).
    Ties go to the path that changes least: allgather, then merging, then dense. ``reduce_op`` is
    the script's reduction (None: Horovod's default, average): Horovod gathers an IndexedSlices for
    average and sum only, so under any other (adasum, min, max, product) ``auto`` densifies.
    """
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}")

    def made(reduction: str, reason: str, with_shape: SparseGradientShape | None = shape) -> Decision:
        return Decision(name, reduction, reason, world_size, with_shape, script_densifies, local_rows, mode,
                        local_distinct_rows, guard)

    asked = f"the script asked for sparse_as_dense={script_densifies}"
    if mode == AS_WRITTEN:
        return made("dense" if script_densifies else "sparse", f"as written: {asked}")
    if mode == "sparse":
        return made("sparse", "mode sparse: Horovod's allgather path" + ("" if not script_densifies else f"; {asked}"))
    if mode == "dense":
        return made("dense", "mode dense: every IndexedSlices densified" + ("" if script_densifies else f"; {asked}"))
    if mode == "dedup":
        return made("dedup", "mode dedup: duplicate rows summed on each rank, then allgather of the distinct rows"
                    + ("" if not script_densifies else f"; {asked}"))
    if reduce_op not in GATHERED_OPS:
        return made("dense", f"auto: op {reduce_op} has no allgather path for an IndexedSlices in Horovod (average "
                             f"and sum only): densified")
    if shape is None:
        return made("dense" if script_densifies else "sparse",
                    f"auto: row count unknown; kept what {asked[4:]}", None)
    gathered, dense = shape.gathered(world_size), shape.dense()
    margin_text = "" if margin == 1.0 else f" x {margin:g}"
    costs = {"sparse": float(gathered), "dense": margin * dense}
    parts = {"sparse": f"allgather {format_bytes(gathered)} (N={world_size} x {shape.rows_per_rank} rows, "
                       f"the most of any rank)",
             "dense": f"dense {format_bytes(dense)}{margin_text}"}
    if shape.distinct_rows is not None:
        planned = guarded_distinct_rows(shape.distinct_rows, shape.rows_per_rank, guard)
        merged = replace(shape, distinct_rows=planned).merged(world_size)
        assert merged is not None
        costs["dedup"] = float(merged)
        parts["dedup"] = (f"merged {format_bytes(merged)} (N={world_size} x {planned} rows: "
                          f"{shape.distinct_rows} distinct, the most of any rank, x guard {guard:g})")
    chosen = min((r for r in REDUCTIONS if r in costs), key=lambda r: costs[r])  # stable: ties to the earlier
    others = [r for r in REDUCTIONS if r in costs and r != chosen]
    relations = ", ".join(f"{'<' if costs[chosen] < costs[r] else '<='} {parts[r]}" for r in others)
    reason = f"auto: {parts[chosen]} {relations}"
    if shape.distinct_rows is None:
        reason += "; distinct rows not measured, merging not considered"
    return made(chosen, reason)
