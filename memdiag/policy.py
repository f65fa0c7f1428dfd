"""Which way to reduce each IndexedSlices gradient: allgather (sparse) or dense allreduce.

``sparse`` is Horovod's default, ``dense`` is Horovod's all-or-nothing ``sparse_as_dense=True``, and
``auto`` decides per tensor from :mod:`memdiag.formula`, so it is never worse than the better of the two.
"""

from __future__ import annotations

from dataclasses import dataclass

from memdiag.formula import SparseGradientShape
from memdiag.units import format_bytes

MODES = ("sparse", "dense", "auto")
DEFAULT_MARGIN = 1.0


@dataclass(frozen=True)
class Decision:
    """The policy's choice for one gradient, with the figures behind it."""

    name: str
    densify: bool
    reason: str
    world_size: int
    shape: SparseGradientShape | None = None

    @property
    def gathered_bytes(self) -> int | None:
        return None if self.shape is None else self.shape.gathered(self.world_size)

    @property
    def dense_bytes(self) -> int | None:
        return None if self.shape is None else self.shape.dense()

    def as_record(self) -> dict:
        shape = self.shape
        return {
            "type": "policy",
            "name": self.name,
            "decision": "dense" if self.densify else "sparse",
            "reason": self.reason,
            "world_size": self.world_size,
            "gathered_bytes": self.gathered_bytes,
            "dense_bytes": self.dense_bytes,
            "rows_per_rank": None if shape is None else shape.rows_per_rank,
            "row_bytes": None if shape is None else shape.row_bytes,
            "index_bytes": None if shape is None else shape.index_bytes,
            "dense_rows": None if shape is None else shape.dense_rows,
            "row_elements": None if shape is None else shape.row_elements,
        }


def decide(
    mode: str,
    name: str,
    world_size: int,
    shape: SparseGradientShape | None,
    margin: float = DEFAULT_MARGIN,
) -> Decision:
    """Decide how to reduce the IndexedSlices gradient ``name`` on ``world_size`` ranks.

    ``shape`` is None when the row count is not known when the graph is built (dynamic batch);
    ``auto`` then keeps Horovod's default and says why.
    ``margin`` > 1 keeps the sparse path until the gathered bytes exceed the dense size by that factor.
    """
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}")
    if mode == "sparse":
        return Decision(name, False, "mode sparse: Horovod's allgather path", world_size, shape)
    if mode == "dense":
        return Decision(name, True, "mode dense: every IndexedSlices densified", world_size, shape)
    if shape is None:
        return Decision(name, False, "auto: rows per rank unknown when traced; kept allgather", world_size)
    gathered, dense = shape.gathered(world_size), shape.dense()
    densify = gathered > margin * dense
    relation = ">" if densify else "<="
    margin_text = "" if margin == 1.0 else f" x {margin:g}"
    reason = (
        f"auto: gathered {format_bytes(gathered)} (N={world_size} x {shape.rows_per_rank} rows) "
        f"{relation} dense {format_bytes(dense)}{margin_text}"
    )
    return Decision(name, densify, reason, world_size, shape)
