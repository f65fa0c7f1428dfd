"""Live collective bytes per step: the collective outputs of one rank's step alive at once, by the live model.

Modelled from the records, not measured (:class:`LiveStep` states what it assumes); also the tensors
whose allgathers one grouped call made alive together.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from memdiag.format.reader import CollectiveLog


class LiveStep:
    """The collective outputs of one step that the live model counts as alive at once (modelled from
    the records, not measured):

    - every output but an allgather's is alive until the step's update: summed;
    - Horovod completes allgathers one after another and frees each gathered output once its quotient
      (values / N under op=Average) is made: one tensor's gathered outputs at a time, the largest,
      beside one quotient, the largest;
    - but the allgathers of one grouped call (``grouped`` records: Horovod's grouped_allgather, and
      grouped_allreduce or ``num_groups``/``groups=`` of IndexedSlices, values then indices) are
      allocated in one response and alive together: they count as one, their quotients too;
    - a tensor is its name and its occurrence in the step: the k-th allgather of one name and part in
      a step (an unnamed one from one line of code, ``allgather@file.py:12[shape]``, called in a loop)
      is a tensor of its own, not added to the first's.

    Its other bound (:attr:`all_at_once_bytes`): every gathered output and every quotient of the step
    alive at once, as when the tensors' reductions overlap (the second gathered while the first's
    outputs are still held). A step holds between the two; with one gathered tensor they are equal.
    """

    def __init__(self) -> None:
        self.other = 0
        self.units: list[list[int]] = []  # per unit alive together: [gathered bytes, quotient bytes]
        self.names: list[set[str]] = []
        self._unit_of: dict[tuple[str, int], int] = {}  # (name, occurrence) -> unit
        self._seen: dict[tuple[str, Any], int] = defaultdict(int)  # (name, part) -> occurrences so far
        self._run: int | None = None  # the unit of the grouped call being read
        self._run_part: Any = None

    def add(self, c: dict[str, Any], bytes_out: int) -> None:
        if c.get("op") != "allgather":
            self.other += bytes_out
            self._run = None
            return
        name, part = str(c.get("name")), c.get("part")
        occurrence = self._seen[(name, part)]
        self._seen[(name, part)] += 1
        key = (name, occurrence)
        grouped = bool(c.get("grouped"))
        # a grouped IndexedSlices call gathers every values part, then every indices part: a values part
        # after an indices part starts another call
        if not grouped or (self._run_part == "indices" and part == "values"):
            self._run = None
        unit = self._unit_of.get(key)
        if unit is None:
            unit = self._run if grouped and self._run is not None else len(self.units)
            if unit == len(self.units):
                self.units.append([0, 0])
                self.names.append(set())
            self._unit_of[key] = unit
        if grouped:
            self._run, self._run_part = unit, part
        self.units[unit][0] += bytes_out
        self.names[unit].add(name)
        if part == "values" and c.get("reduce_op") in (None, "average"):
            self.units[unit][1] += bytes_out

    @property
    def live_bytes(self) -> int:
        return self.other + self.added_bytes

    @property
    def all_at_once_bytes(self) -> int:
        """The live bytes with every unit's gathered outputs and quotient alive at once (the class's
        other bound)."""
        return self.other + sum(u[0] for u in self.units) + sum(u[1] for u in self.units)

    @property
    def added_bytes(self) -> int:
        """What the collectives add to what the step holds: the gathered outputs and the quotient alive at
        once. Every other output (an allreduce's, a broadcast's) replaces an input as large, which its
        consumer frees."""
        return max((u[0] for u in self.units), default=0) + max((u[1] for u in self.units), default=0)


def live_collective_bytes(log: CollectiveLog) -> tuple[dict[int, int], list[list[str]]]:
    """Per training step of one rank, the collective outputs alive at once by :class:`LiveStep`'s model;
    and the sets of tensors whose allgathers were alive together (grouped calls, more than one tensor)."""
    steps, groups = live_steps(log)
    return {s: live.live_bytes for s, live in steps.items()}, groups


def live_steps(log: CollectiveLog) -> tuple[dict[int, LiveStep], list[list[str]]]:
    """Per training step of one rank, its :class:`LiveStep`; and the sets of tensors whose allgathers were
    alive together (grouped calls, more than one tensor)."""
    kind, step, _, bytes_out = log.columns()
    whole = dict(log.whole())
    steps: dict[int, LiveStep] = {}
    for i, (k, s, b) in enumerate(zip(kind.tolist(), step.tolist(), bytes_out.tolist())):
        c = whole[i] if k < 0 else log.kinds[k]
        if k < 0:
            s, b = c.get("step"), c.get("bytes_out")
        if not isinstance(s, int) or s < 0 or not isinstance(b, int):
            continue
        steps.setdefault(s, LiveStep()).add(c, b)
    groups = sorted({tuple(sorted(names)) for live in steps.values() for names in live.names if len(names) > 1})
    return steps, [list(g) for g in groups]
