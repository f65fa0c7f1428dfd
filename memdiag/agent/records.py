"""The rank's record file: ``rank-K.jsonl``, one JSON object a line, append-only.

Records of a step are buffered and written with one flush when the step ends, so a rank that is
killed loses at most the step it was in. Every record carries ``type``; see docs/records.md.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any


class RecordWriter:
    def __init__(self, path: str, rank: int) -> None:
        self.path = path
        self.rank = rank
        self._lock = threading.Lock()
        self._pending: list[str] = []
        # O_APPEND: a restarted or concurrent writer can never truncate what is there.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._file = os.fdopen(fd, "w", encoding="utf-8")

    def add(self, record: dict[str, Any]) -> None:
        """Queue a record; it reaches the file at the next :meth:`flush`."""
        record.setdefault("rank", self.rank)
        record.setdefault("t", time.time())
        line = json.dumps(record, separators=(",", ":"), default=_jsonable)
        with self._lock:
            self._pending.append(line)

    def write_now(self, record: dict[str, Any]) -> None:
        self.add(record)
        self.flush()

    def flush(self) -> None:
        with self._lock:
            lines, self._pending = self._pending, []
            if lines:
                self._file.write("\n".join(lines) + "\n")
            self._file.flush()

    def close(self) -> None:
        self.flush()
        self._file.close()


def _jsonable(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    if hasattr(value, "item"):
        return value.item()
    return str(value)
