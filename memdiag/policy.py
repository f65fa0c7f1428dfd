"""Which way to reduce each IndexedSlices gradient: allgather (sparse) or dense allreduce.

``as-written`` keeps what the script asked for (Horovod's ``sparse_as_dense``, False by default): memdiag
observes and changes nothing. ``sparse`` and ``dense`` are explicit overrides (Horovod's default path and
its all-or-nothing ``sparse_as_dense=True``). ``auto`` decides per tensor from :mod:`memdiag.formula`, so
it is never worse than the better of the two.

Invariant: a decision changes which collective every rank issues, so it must be the same on every rank
of the process set. ``auto`` therefore decides from the largest row count over those ranks (agreed by
the caller, see :class:`memdiag.densify.DensifyPolicy`), never from one rank's own rows.
"""

from __future__ import annotations

from dataclasses import dataclass

from memdiag.formula import SparseGradientShape
from memdiag.units import format_bytes

AS_WRITTEN = "as-written"
MODES = (AS_WRITTEN, "sparse", "dense", "auto")
DEFAULT_MARGIN = 1.0


@dataclass(frozen=True)
class Decision:
    """The policy's choice for one gradient, with the figures behind it.

    ``shape.rows_per_rank`` is the agreed row count (the largest over the ranks); ``local_rows`` is
    this rank's own. ``script_densifies`` is what the script asked for (its ``sparse_as_dense``).
    """

    name: str
    densify: bool
    reason: str
    world_size: int
    shape: SparseGradientShape | None = None
    script_densifies: bool = False
    local_rows: int | None = None
    mode: str = AS_WRITTEN

    @property
    def overridden(self) -> bool:
        """True when this run reduces the tensor otherwise than the script asked."""
        return self.densify != self.script_densifies

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
            "mode": self.mode,
            "decision": "dense" if self.densify else "sparse",
            "reason": self.reason,
            "world_size": self.world_size,
            "script_sparse_as_dense": self.script_densifies,
            "overridden": self.overridden,
            "local_rows": self.local_rows,
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
    script_densifies: bool = False,
    local_rows: int | None = None,
) -> Decision:
    """Decide how to reduce the IndexedSlices gradient ``name`` on ``world_size`` ranks.

    ``shape`` carries the row count agreed over all ranks; it is None when no row count could be had
    (``auto`` then keeps the script's choice and says why).
    ``margin`` > 1 keeps the sparse path until the gathered bytes exceed the dense size by that factor.
    """
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}")

    def made(densify: bool, reason: str, with_shape: SparseGradientShape | None = shape) -> Decision:
        return Decision(name, densify, reason, world_size, with_shape, script_densifies, local_rows, mode)

    asked = f"the script asked for sparse_as_dense={script_densifies}"
    if mode == AS_WRITTEN:
        return made(script_densifies, f"as written: {asked}")
    if mode == "sparse":
        return made(False, "mode sparse: Horovod's allgather path" + ("" if not script_densifies else f"; {asked}"))
    if mode == "dense":
        return made(True, "mode dense: every IndexedSlices densified" + ("" if script_densifies else f"; {asked}"))
    if shape is None:
        return made(script_densifies, f"auto: row count unknown; kept what {asked[4:]}", None)
    gathered, dense = shape.gathered(world_size), shape.dense()
    densify = gathered > margin * dense
    relation = ">" if densify else "<="
    margin_text = "" if margin == 1.0 else f" x {margin:g}"
    reason = (
        f"auto: gathered {format_bytes(gathered)} (N={world_size} x {shape.rows_per_rank} rows, "
        f"the most of any rank) {relation} dense {format_bytes(dense)}{margin_text}"
    )
    return made(densify, reason)
