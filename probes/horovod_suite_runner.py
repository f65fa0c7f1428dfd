"""Run one of Horovod's own test files in this process, as a user's script would run its training.

    mpirun -np 2 python probes/horovod_suite_runner.py TEST_FILE OUT_DIR
    memdiag run probes/horovod_suite_runner.py -n 2 -- TEST_FILE OUT_DIR

Each rank calls ``pytest.main`` on TEST_FILE and writes ``OUT_DIR/outcomes-rank-K.json``: one entry per
test and per subtest (node id, subtest description, phase, outcome, duration), so that two runs can be
compared test by test (probes/horovod_conformance.py). The exit status is pytest's.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any


class _Outcomes:
    """A pytest plugin that keeps every report's outcome (subtests included) in order."""

    def __init__(self) -> None:
        self.entries: list[dict[str, Any]] = []

    def pytest_runtest_logreport(self, report: Any) -> None:
        context = getattr(report, "context", None)  # a subtest's report carries its description
        subtest = None
        if context is not None:
            kwargs = getattr(context, "kwargs", None) or {}
            subtest = " ".join(filter(None, [str(getattr(context, "msg", None) or ""),
                                             " ".join(f"{k}={v!r}" for k, v in sorted(kwargs.items()))])) or "-"
        if report.when != "call" and report.outcome == "passed":
            return  # set-up and tear-down that passed say nothing
        outcome = report.outcome
        if getattr(report, "wasxfail", None) is not None:
            outcome = "xfailed" if report.skipped else "xpassed"
        self.entries.append({"test": report.nodeid, "subtest": subtest, "when": report.when, "outcome": outcome,
                             "duration_s": round(float(getattr(report, "duration", 0.0) or 0.0), 4)})


def _vmhwm() -> int | None:
    """The kernel's high-water mark of this process's resident memory (VmHWM), in bytes."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: horovod_suite_runner.py TEST_FILE OUT_DIR", file=sys.stderr)
        return 2
    test_file, out_dir = os.path.abspath(argv[0]), os.path.abspath(argv[1])
    import pytest

    rank = os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMIX_RANK", "0"))
    plugin = _Outcomes()
    code = pytest.main([test_file, "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                        "--rootdir", os.path.dirname(os.path.dirname(test_file))], plugins=[plugin])
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, f"outcomes-rank-{rank}.json"), "w", encoding="utf-8") as f:
        json.dump({"exit": int(code), "entries": plugin.entries, "vmhwm_bytes": _vmhwm()}, f, indent=1)
    return int(code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
