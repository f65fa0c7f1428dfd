"""The formula's bytes for what a run gathered, from its policy records: per rank and step, and MWMS's padding.

From every rank's own rows in, never the gathered bytes out: an independent prediction of the measured
bytes (:func:`memdiag.analyze.compare.predicted_growth`, :mod:`memdiag.analyze.engines`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memdiag import formula
from memdiag.format.results import PolicySummary, RunSummary


def gathered_policies(summary: RunSummary) -> list[PolicySummary]:
    """The policy records of the IndexedSlices gradients the run gathered, with their shapes."""
    return [p for p in summary.get("policy", []) if _rows_gathered(p, 1) is not None and p.get("decision") != "dense"
            and p.get("row_bytes") is not None and p.get("index_bytes") is not None]


def _row_and_index_bytes(policy: PolicySummary) -> tuple[int, int]:
    """A gathered policy's bytes per row and per index (:func:`gathered_policies` keeps only those with both)."""
    row, index = policy.get("row_bytes"), policy.get("index_bytes")
    assert row is not None and index is not None, "gathered_policies keeps the policies with shapes"
    return row, index


def _rows_gathered(policy: Mapping[str, Any], world_size: int) -> int | None:
    """The rows each rank receives per step for this gradient: the summary's ``rows_gathered`` (the sum
    over the ranks of their own rows, MWMS: N x the longest's), or for summaries older than it, N x the
    policy's agreed rows, or the own rows of whichever rank was read first."""
    if policy.get("rows_gathered") is not None:
        return int(policy["rows_gathered"])
    rows = policy.get("agreed_rows") if policy.get("agreed_rows") is not None else policy.get("local_rows")
    return None if rows is None else world_size * rows


def predicted_gathered(summary: RunSummary, world_size: int) -> int | None:
    """Bytes per rank and step the formula gives for the tensors the run gathered: the rows gathered x
    (row_bytes + index_bytes), each rank's own rows summed (exact for Horovod's allgatherv whatever the
    ranks' rows, and for MWMS's padded gathers); merged, the bound N x U_max. None when no record has
    shapes, or a gathered tensor's are unknown (a sum without it would pass for the whole)."""
    if world_size == 1:
        return 0  # one rank runs no collective: neither engine reduces anything (nor records a policy)
    policies = summary.get("policy", [])
    if not any(_rows_gathered(p, world_size) is not None for p in policies):
        return None
    if len(gathered_policies(summary)) < sum(p.get("decision") != "dense" for p in policies):
        return None
    total = 0
    for p in gathered_policies(summary):
        if p["decision"] == "dedup":
            distinct = p.get("distinct_rows")
            if distinct is None:
                return None
            total += formula.merged_bytes(world_size, distinct, *_row_and_index_bytes(p))
        else:
            total += formula.gathered_bytes(1, _rows_gathered(p, world_size) or 0, *_row_and_index_bytes(p))
    return total


def predicted_padding(summary: RunSummary) -> int:
    """MWMS's zero rows per worker and step from every worker's rows in the policy records."""
    return sum(formula.padding_bytes(rows, *_row_and_index_bytes(p))
               for p in gathered_policies(summary) if (rows := p.get("rows_per_worker")))
