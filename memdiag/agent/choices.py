"""The script's own choices of Horovod's options (sparse_as_dense, op, compression, process set, groups): ``choices`` records.

The constructors (``DistributedGradientTape``, ``DistributedOptimizer``, also Keras') and Horovod's
gradient reduction are called with the script's arguments: each distinct set of them is recorded once.
"""

from __future__ import annotations

from typing import Any, cast

from memdiag.agent.naming import var_name
from memdiag.densify import process_set_size
from memdiag.format.records import ChoicesRecord


class ScriptChoices:
    """The ``choices`` records of one rank, and the names of Horovod's reduce ops."""

    def __init__(self, tracer: Any) -> None:
        self.tracer = tracer
        self.ops: dict[int, str] = {}  # Horovod's reduce ops by value (memdiag.policy.horovod_op_names), when installed
        self._seen: set[str] = set()

    def record(self, choices: dict[str, Any]) -> None:
        key = repr(sorted(choices.items()))
        if key in self._seen:
            return
        self._seen.add(key)
        # an open record (OPEN_RECORD_TYPES): the script's arguments, whatever Horovod's API takes
        record = ChoicesRecord(type="choices", step=self.tracer.step)
        cast("dict[str, Any]", record).update(choices)
        self.tracer.writer.add(record)

    def describe(self, key: str, value: Any) -> Any:
        """A JSON value for one of the script's arguments to Horovod."""
        if key == "op":
            return self.op_name(value)
        if key == "compression":
            return getattr(value, "__name__", type(value).__name__)
        if key == "process_set":
            return describe_process_set(value)
        if key in ("groups", "num_groups") and isinstance(value, (list, tuple)):
            return [[var_name(v) for v in group] for group in value]
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        return repr(value)

    def op_name(self, op: Any) -> str:
        if op is None:
            return "average"  # Horovod's default
        return self.ops.get(int(op), str(op))


def describe_process_set(process_set: Any) -> dict[str, Any] | None:
    if process_set is None:
        return None
    return {"id": getattr(process_set, "process_set_id", None), "size": process_set_size(process_set),
            "ranks": list(process_set.ranks) if getattr(process_set, "ranks", None) is not None else None}
