"""memdiag's own failures in a rank (labelling, recording, reading a variable): counted by what failed,
the first of each recorded, never raised into the job.

One :class:`Failures` per rank, shared by the hooks and their collaborators (the policy applied, the
parameter records); the ``end`` record carries the counts (``bookkeeping_failures``) and the report names
them.
"""

from __future__ import annotations

import collections
import contextlib
import threading
from collections.abc import Callable
from typing import Any

from memdiag.format.records import BookkeepingRecord


class Failures:
    def __init__(self, tracer: Any) -> None:
        self.tracer = tracer
        self._counts: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()

    def first(self, what: str) -> bool:
        """Count a failure of ``what``: whether it is the first."""
        with self._lock:
            self._counts[what] += 1
            return self._counts[what] == 1

    def failed(self, what: str, exc: BaseException) -> None:
        """memdiag could not do ``what``: counted, and the first time recorded with its error (a
        ``bookkeeping`` record), so that the report names it. The job goes on as if unhooked."""
        if self.first(what):
            with contextlib.suppress(Exception):
                self.tracer.writer.add(BookkeepingRecord(type="bookkeeping", step=self.tracer.step, what=what,
                                                         error=f"{type(exc).__name__}: {exc}"[:400]))

    def guard(self, what: str, action: Callable[[], Any]) -> Any:
        """``action()``, or None where it fails (the failure counted)."""
        try:
            return action()
        except Exception as exc:  # noqa: BLE001 - recording never raises into the user's code
            self.failed(what, exc)
            return None

    def counts(self) -> dict[str, int]:
        """What failed, and how often."""
        with self._lock:
            return dict(self._counts)

    def __bool__(self) -> bool:
        with self._lock:
            return bool(self._counts)
