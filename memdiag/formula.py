"""The byte formula for Horovod's two ways of reducing a gradient.

One fact in one place: the policy, the prediction model and the reports all call these functions.

Horovod reduces a ``tf.IndexedSlices`` gradient with two allgathers (values and indices), so every
rank receives every other rank's rows::

    gathered bytes per rank = N x rows_per_rank x (row_bytes + index_bytes)

A dense gradient (or an IndexedSlices converted to dense) goes through one allreduce whose output has
the size of the variable, whatever the number of ranks::

    dense allreduce bytes = dense_rows x row_bytes
"""

from __future__ import annotations

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

    def overflow_ranks(self) -> int | None:
        """Smallest N whose gathered values no longer fit in MPI's 32-bit counts."""
        per_rank = self.rows_per_rank * self.row_elements
        return MPI_COUNT_LIMIT // per_rank + 1 if per_rank else None

    def gathered(self, world_size: int) -> int:
        return gathered_bytes(world_size, self.rows_per_rank, self.row_bytes, self.index_bytes)

    def gathered_values(self, world_size: int) -> int:
        return gathered_values_bytes(world_size, self.rows_per_rank, self.row_bytes)

    def dense(self) -> int:
        return dense_bytes(self.dense_rows, self.row_bytes)
