"""Helpers of the tests: running the real CLI as a user would, reading what it wrote."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# The Python that runs memdiag and the scripts under test: pytest's own, or another environment's
# (`make test-tf-latest` runs the tf-distribute tests with .venv-tf-latest's, where Horovod is absent).
PYTHON = os.environ.get("MEMDIAG_TEST_PYTHON") or sys.executable


def memdiag(*args: str, timeout: float = 600, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run ``memdiag ARGS`` in a subprocess, as a user types it."""
    env = {**os.environ, "COLUMNS": "160"}
    return subprocess.run([PYTHON, "-m", "memdiag", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd or ROOT, env=env, stdin=subprocess.DEVNULL)


def read_json(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def read_records(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def keras_variable_name(run_dir: Path, layer: str, variable: str) -> str:
    """A layer's variable named as the run's Keras names it (from rank 0's start record): Keras 2 gives
    ``embeddings:0``, Keras 3 prefixes the layer's path, ``table/embeddings:0``."""
    [start] = [r for r in read_records(Path(run_dir) / "rank-0.jsonl") if r["type"] == "start"]
    keras = start["versions"].get("keras") or ""
    return f"{layer}/{variable}:0" if keras.startswith("3.") else f"{variable}:0"


def undeclared_record_fields(run_dir: Path) -> dict[str, list[str]]:
    """Per record type, the fields the ranks wrote (every ``rank-K.jsonl`` under ``run_dir``) that
    memdiag.format.records does not declare for that type: what readers would meet undeclared."""
    from memdiag.format.records import undeclared_fields

    found: dict[str, set[str]] = {}
    for path in sorted(Path(run_dir).rglob("rank-*.jsonl")):
        for record in read_records(path):
            fields = undeclared_fields(record)
            if fields:
                found.setdefault(str(record.get("type")), set()).update(fields)
    return {kind: sorted(fields) for kind, fields in found.items()}


class CannedTransport:
    """A transport (memdiag.agreement) for one rank among others whose figures are given: every exchange
    returns this rank's payload and, for each other rank, the same key digest with that rank's next
    figures from ``others`` (rank -> list of tuples, one per exchange). ``sent`` keeps this rank's."""

    def __init__(self, rank: int, others: dict[int, list[tuple[int, ...]]]) -> None:
        self.rank, self.size = rank, len(others) + 1
        self.others = {r: list(figures) for r, figures in others.items()}
        self.sent: list[tuple[int, ...]] = []

    def exchange(self, seq: int, payload: tuple[int, ...], timeout_s: float) -> list[tuple[int, ...]]:
        self.sent.append(payload[1:])
        return [payload if r == self.rank else (payload[0], *self.others[r][seq]) for r in range(self.size)]


class ThreadRanks:
    """``size`` ranks as threads of one process, exchanging through shared memory: transport(r) is rank
    r's (memdiag.agreement's Transport). An exchange waits for every rank's payload of the same
    sequence number, up to the deadline (TimeoutError past it)."""

    def __init__(self, size: int) -> None:
        import threading

        self.size = size
        self._cond = threading.Condition()
        self._posted: dict[int, dict[int, tuple[int, ...]]] = {}

    def transport(self, rank: int):
        ranks = self

        class _Transport:
            def __init__(self) -> None:
                self.rank, self.size = rank, ranks.size

            def exchange(self, seq, payload, timeout_s):
                with ranks._cond:
                    ranks._posted.setdefault(seq, {})[rank] = payload
                    ranks._cond.notify_all()
                    if not ranks._cond.wait_for(lambda: len(ranks._posted[seq]) == ranks.size, timeout_s):
                        raise TimeoutError
                    return [ranks._posted[seq][r] for r in range(ranks.size)]

        return _Transport()


def run_ranks(size: int, body, timeout_s: float = 5.0):
    """``body(rank, agreement)`` on ``size`` ranks, a thread each, agreeing through :class:`ThreadRanks`
    (memdiag.agreement.Agreement with a deadline of ``timeout_s``): each rank's result or exception,
    and the agreements."""
    import threading

    from memdiag.agreement import Agreement

    ranks = ThreadRanks(size)
    agreements = [Agreement(ranks.transport(r), timeout_s) for r in range(size)]
    results: list = [None] * size

    def run(r: int) -> None:
        try:
            results[r] = body(r, agreements[r])
        except Exception as exc:  # noqa: BLE001 - the test reads it
            results[r] = exc

    threads = [threading.Thread(target=run, args=(r,)) for r in range(size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return results, agreements


def native_marks(tmp_path_factory) -> Any:
    """memdiag's native mark op, loaded: the package's library, or where it is missing or older than its
    source, one built for the tests (as scripts/setup.sh builds it into the package)."""
    from memdiag import nativemarks

    library = nativemarks.LIBRARY
    built = nativemarks.BUILT_FOR
    if not library.exists() or not built.exists() or built.stat().st_mtime < nativemarks.SOURCE.stat().st_mtime:
        library = tmp_path_factory.mktemp("native") / "_memdiag_mark.so"
        assert nativemarks.build(library) is None
    return nativemarks.Marks(library)
