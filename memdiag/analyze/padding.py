"""The padding of ``summary.json`` (``padding[]``): MultiWorkerMirroredStrategy's zero rows per gradient.

``--engine tf-distribute`` only: where an IndexedSlices gradient's rows differ between workers, the
strategy pads each worker's gathers to the longest worker's rows.
"""

from __future__ import annotations

from collections import defaultdict

from memdiag.format.reader import Run
from memdiag.format.results import PaddingSummary


def padding_summary(run: Run) -> list[PaddingSummary]:
    """``--engine tf-distribute``: per IndexedSlices gradient whose rows differ between workers, the zero
    rows MultiWorkerMirroredStrategy padded its gathers with (values and indices, ``pad_out_bytes``)
    and the bytes gathered, per worker and step: the step and worker with the most padding. Every
    worker receives the same bytes (N x the longest worker's rows), so the figures are the same on each."""
    if run.manifest.get("engine") != "tf-distribute":
        return []
    cells: dict[str, dict[tuple[int, int], list[int]]] = defaultdict(dict)
    for rank, records in run.ranks.items():
        for c in records.collectives:
            step = c.get("step")
            if c.get("part") not in ("values", "indices") or not isinstance(step, int) or step < 0:
                continue
            cell = cells[c["name"]].setdefault((rank, step), [0, 0])
            cell[0] += int(c.get("pad_out_bytes") or 0)
            cell[1] += int(c.get("bytes_out") or 0)
    policies = {p["name"]: p for records in run.ranks.values() for p in records.policies}
    entries: list[PaddingSummary] = []
    for name, found in sorted(cells.items()):
        padding, gathered = max(found.values())
        if not padding:
            continue  # equal rows: MWMS gathers without padding
        policy = policies.get(name)
        rows = policy.get("rows_per_worker") if policy else None
        entries.append({"name": name, "padding_bytes_per_step": padding, "gathered_bytes_per_step": gathered,
                        "padding_share": padding / gathered if gathered else None,
                        "rows_per_worker": rows})
    return entries
