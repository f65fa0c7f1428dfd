"""The byte formula for the three ways of reducing an IndexedSlices gradient.

One fact in one place: the policy, the prediction model and the reports all call these functions.

Horovod reduces a ``tf.IndexedSlices`` gradient with two allgathers (values and indices), so every
rank receives every other rank's rows::

    gathered bytes per rank = N x rows_per_rank x (row_bytes + index_bytes)

A dense gradient (or an IndexedSlices converted to dense) goes through one allreduce whose output has
the size of the variable, whatever the number of ranks::

    dense allreduce bytes = dense_rows x row_bytes

Between the two, memdiag's ``dedup`` first sums the rows of equal index on each rank (``tf.unique`` and
``tf.math.unsorted_segment_sum``), then gathers only the distinct rows (U <= T, U_max the most of any
rank, since every rank's gathered buffer is sized by Horovod's allgatherv to the sum of all ranks')::

    merged gathered bytes per rank <= N x U_max x (row_bytes + index_bytes)

(exactly N x U_max x ... when every rank has U_max distinct rows; the sum over ranks in general).

TensorFlow's MultiWorkerMirroredStrategy gathers an IndexedSlices padded with zero rows to the longest
worker's rows, so :func:`gathered_bytes` with rows_per_rank = the most rows of any worker is exact
there, and of it :func:`padding_bytes` are zero rows::

    padding bytes per worker = (N x max_rows - sum of rows) x (row_bytes + index_bytes)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# MPI counts are C ints: a gathered buffer of more elements than this cannot be described by one
# MPI_Allgatherv call (the 32-bit count overflow Horovod users report).
MPI_COUNT_LIMIT = 2**31 - 1


def gathered_bytes(world_size: int, rows_per_rank: int, row_bytes: int, index_bytes: int) -> int:
    """Bytes each rank receives when an IndexedSlices gradient is reduced by allgather."""
    return world_size * rows_per_rank * (row_bytes + index_bytes)


def gathered_values_bytes(world_size: int, rows_per_rank: int, row_bytes: int) -> int:
    """The values part alone of :func:`gathered_bytes` (the buffer that dominates)."""
    return world_size * rows_per_rank * row_bytes


def padding_bytes(rows_per_worker: Sequence[int], row_bytes: int, index_bytes: int) -> int:
    """Bytes of zero rows each worker receives when MultiWorkerMirroredStrategy gathers an IndexedSlices
    whose workers have ``rows_per_worker`` rows (one entry per worker): every worker's values and
    indices are padded to the longest's, so (N x max - sum) rows of padding; 0 when the rows are equal."""
    if not rows_per_worker:
        return 0
    return (len(rows_per_worker) * max(rows_per_worker) - sum(rows_per_worker)) * (row_bytes + index_bytes)


def merged_bytes(world_size: int, distinct_rows: int, row_bytes: int, index_bytes: int) -> int:
    """Bytes each rank receives when the duplicate rows are summed first and only the ``distinct_rows``
    (the most of any rank) are gathered: the allgather formula on U rows instead of T."""
    return gathered_bytes(world_size, distinct_rows, row_bytes, index_bytes)


def dense_bytes(dense_rows: int, row_bytes: int) -> int:
    """Bytes of the allreduce output when the gradient is reduced densely (independent of N)."""
    return dense_rows * row_bytes


def gathered_elements(world_size: int, rows_per_rank: int, row_elements: int) -> int:
    """Elements in the gathered values buffer: what MPI's 32-bit counts must hold."""
    return world_size * rows_per_rank * row_elements


def crossover_ranks(rows_per_rank: int, row_bytes: int, index_bytes: int, dense_rows: int) -> float:
    """The rank count above which the allgather receives more bytes than the dense allreduce."""
    per_rank = rows_per_rank * (row_bytes + index_bytes)
    return float("inf") if per_rank == 0 else dense_bytes(dense_rows, row_bytes) / per_rank


@dataclass(frozen=True)
class SparseGradientShape:
    """What the formula needs to know about one IndexedSlices gradient."""

    rows_per_rank: int
    row_bytes: int
    index_bytes: int
    dense_rows: int
    row_elements: int = 0  # elements per row: what MPI's 32-bit counts count
    distinct_rows: int | None = None  # U: distinct indices per rank (the most of any rank); None: not measured

    def overflow_ranks(self) -> int | None:
        """Smallest N whose gathered values no longer fit in MPI's 32-bit counts."""
        per_rank = self.rows_per_rank * self.row_elements
        return MPI_COUNT_LIMIT // per_rank + 1 if per_rank else None

    def merged_overflow_ranks(self) -> int | None:
        """Smallest N whose merged gathered values (U rows per rank) no longer fit in MPI's 32-bit
        counts; None when U was not measured."""
        if self.distinct_rows is None:
            return None
        per_rank = self.distinct_rows * self.row_elements
        return MPI_COUNT_LIMIT // per_rank + 1 if per_rank else None

    def gathered(self, world_size: int) -> int:
        return gathered_bytes(world_size, self.rows_per_rank, self.row_bytes, self.index_bytes)

    def merged(self, world_size: int) -> int | None:
        """Gathered bytes after duplicates are summed; None when the distinct rows were not measured."""
        if self.distinct_rows is None:
            return None
        return merged_bytes(world_size, self.distinct_rows, self.row_bytes, self.index_bytes)

    def gathered_values(self, world_size: int) -> int:
        return gathered_values_bytes(world_size, self.rows_per_rank, self.row_bytes)

    def dense(self) -> int:
        return dense_bytes(self.dense_rows, self.row_bytes)
