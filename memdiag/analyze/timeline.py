"""What Horovod itself says it ran: the collectives in its timeline, to check memdiag's records against.

Horovod's timeline (``HOROVOD_TIMELINE``, written by rank 0) has one process per tensor; each collective
is a ``B`` event named after the operation (ALLREDUCE, ALLGATHER, ...) whose matching ``E`` event carries
the output's dtype and shape (for the operations that report them: not BROADCAST in 0.28.1, which is
then counted by operation alone). Sub-activities (NEGOTIATE_*, MPI_*, memcpy) nest inside it.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from typing import Any, Optional

# Horovod's activity names for the collectives themselves, as memdiag names the operation.
TIMELINE_OPS = {"ALLREDUCE": "allreduce", "ADASUM": "allreduce", "ALLGATHER": "allgather",
                "BROADCAST": "broadcast", "ALLTOALL": "alltoall", "REDUCESCATTER": "reducescatter"}

Collective = tuple[str, Optional[str], Optional[tuple[int, ...]]]  # (op, dtype, output shape); 3.9: no `|` at run time


def timeline_collectives(events: Iterable[dict[str, Any]]) -> Counter[Collective]:
    """Every collective in Horovod's timeline events, counted by (op, dtype, output shape)."""
    stacks: dict[Any, list[str]] = {}
    found: Counter[Collective] = Counter()
    for event in events:
        phase, pid = event.get("ph"), event.get("pid")
        if phase == "B":
            stacks.setdefault(pid, []).append(str(event.get("name")))
        elif phase == "E" and stacks.get(pid):
            name = stacks[pid].pop()
            args = event.get("args") or {}
            if name in TIMELINE_OPS:
                shaped = "shape" in args
                found[(TIMELINE_OPS[name], str(args.get("dtype")) if shaped else None,
                       _shape(args["shape"]) if shaped else None)] += 1
    return found


def record_collectives(records: Iterable[dict[str, Any]], unshaped: Iterable[str] = ()) -> Counter[Collective]:
    """memdiag's collective records of one rank, counted the same way; ops in ``unshaped`` by op alone."""
    unshaped = set(unshaped)
    return Counter((r["op"], None, None) if r["op"] in unshaped else (r["op"], r["dtype"], tuple(r["shape_out"]))
                   for r in records if r.get("type") == "collective")


def unshaped_ops(found: Counter[Collective]) -> set[str]:
    """Operations the timeline counts without a shape."""
    return {op for op, dtype, shape in found if shape is None}


def _shape(text: Any) -> tuple[int, ...]:
    value = json.loads(text) if isinstance(text, str) else text
    return tuple(int(d) for d in value)
