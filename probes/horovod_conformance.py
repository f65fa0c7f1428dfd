"""Horovod's own TensorFlow tests, under plain mpirun and under `memdiag run` as written, side by side.

memdiag promises to measure a job without changing it. Horovod's test suite is a demanding "user
script": graph and eager code, process sets, bad arguments that must raise Horovod's own errors. This
probe runs each test file twice on the same ranks, through probes/horovod_suite_runner.py:

    mpirun -np N python probes/horovod_suite_runner.py FILE OUT        (plain)
    memdiag run probes/horovod_suite_runner.py -n N -- FILE OUT        (as written)

and prints, per file, the outcome counts and exit codes of both, then every test or subtest whose
outcome differs. Transparency holds where no outcome differs and memdiag exits as plain mpirun does.
Also printed: wall time and the largest per-rank VmHWM of each, and their ratios, and with ``--slowest K``
the K tests whose calls took rank 0 the most seconds more under memdiag (where a collective-heavy job's
added time goes).

The tests are not part of memdiag, nor of Horovod's package archive: take them from Horovod's public
repository at the tag of the installed version (``test/parallel`` and ``test/utils``, with
``test/conftest.py``). They need ``pytest``, ``mock`` and ``parameterized``::

    .venv/bin/pip install mock parameterized
    .venv/bin/python probes/horovod_conformance.py --horovod-src ~/horovod-0.28.1 [--files test_tensorflow.py]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import time

from rich.console import Console
from rich.table import Table

HERE = os.path.dirname(os.path.abspath(__file__))
RUNNER = os.path.join(HERE, "horovod_suite_runner.py")
FILES = ("test_tensorflow.py", "test_tensorflow_keras.py", "test_tensorflow2_keras.py",
         "test_tensorflow_process_sets.py", "test_tensorflow2_keras_process_sets.py", "test_adasum_tensorflow.py")


def _memdiag() -> str:
    beside = os.path.join(os.path.dirname(sys.executable), "memdiag")
    return beside if os.path.exists(beside) else "memdiag"


def _run(command: list[str], log: str, timeout: float) -> tuple[int, float]:
    start = time.perf_counter()
    with open(log, "w", encoding="utf-8") as out:
        try:
            code = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            code = -9
    return code, time.perf_counter() - start


def _outcomes(out_dir: str, ranks: int) -> tuple[dict[tuple[int, str, str, str], str], list[int | None], int | None]:
    """(rank, test, subtest, phase) -> outcome, per-rank pytest exit codes, the largest VmHWM."""
    outcomes: dict[tuple[int, str, str, str], str] = {}
    exits: list[int | None] = []
    hwm: int | None = None
    for rank in range(ranks):
        path = os.path.join(out_dir, f"outcomes-rank-{rank}.json")
        if not os.path.exists(path):
            exits.append(None)
            continue
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        exits.append(data.get("exit"))
        if data.get("vmhwm_bytes"):
            hwm = max(hwm or 0, data["vmhwm_bytes"])
        seen: collections.Counter[tuple[str, str, str]] = collections.Counter()
        for e in data["entries"]:
            key = (e["test"], e["subtest"] or "", e["when"])
            seen[key] += 1
            # a subtest description can repeat within a test: keep each occurrence apart
            name = key[1] if seen[key] == 1 else f"{key[1]} #{seen[key]}"
            outcomes[(rank, key[0], name, key[2])] = e["outcome"]
    return outcomes, exits, hwm


def _durations(out_dir: str) -> dict[str, float]:
    """Rank 0's seconds per test: its call phases, subtests included."""
    path = os.path.join(out_dir, "outcomes-rank-0.json")
    if not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as f:
        entries = json.load(f)["entries"]
    seconds: dict[str, float] = collections.defaultdict(float)
    for entry in entries:
        if entry.get("when") == "call":
            seconds[entry["test"]] += float(entry.get("duration_s") or 0.0)
    return dict(seconds)


def _counts(outcomes: dict[tuple[int, str, str, str], str]) -> str:
    """Rank 0's counts, as pytest prints them: tests and subtests apart."""
    tests: collections.Counter[str] = collections.Counter()
    subtests: collections.Counter[str] = collections.Counter()
    for (rank, _, subtest, _), outcome in outcomes.items():
        if rank == 0:
            (subtests if subtest else tests)[outcome] += 1
    parts = [f"{n} {o}" for o, n in sorted(tests.items())]
    parts += [f"{n} subtests {o}" for o, n in sorted(subtests.items())]
    return ", ".join(parts) or "no outcomes"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--horovod-src", required=True, help="a checkout of Horovod's repository (with test/parallel)")
    parser.add_argument("--files", default=",".join(FILES), help="comma-separated test files of test/parallel")
    parser.add_argument("--np", type=int, default=2, help="ranks (default 2)")
    parser.add_argument("--out", default="runs/horovod-conformance", help="where logs and run directories go")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per run")
    parser.add_argument("--slowest", type=int, default=0, metavar="K",
                        help="list the K tests with the most seconds added under memdiag (rank 0)")
    args = parser.parse_args()
    parallel = os.path.join(args.horovod_src, "test", "parallel")
    if not os.path.isdir(parallel):
        parser.error(f"{parallel} is missing: give a checkout of Horovod's repository with --horovod-src")
    if os.path.exists(args.out):
        parser.error(f"{args.out} exists: give a new --out")
    os.makedirs(args.out)
    console = Console(width=160)
    table = Table(title=f"Horovod's tests on {args.np} ranks: plain mpirun vs memdiag run (as written)")
    table.add_column("file", no_wrap=True)
    for column in ("plain mpirun", "exit", "memdiag run", "exit", "differing", "wall ratio", "VmHWM ratio"):
        table.add_column(column)
    differences: list[str] = []
    added: list[tuple[float, str, float, float]] = []  # (seconds added, test, plain, memdiag)
    for name in [f.strip() for f in args.files.split(",") if f.strip()]:
        test_file = os.path.join(parallel, name)
        stem = name.removesuffix(".py")
        plain_out = os.path.join(args.out, f"{stem}-plain")
        memdiag_out = os.path.join(args.out, f"{stem}-memdiag")
        plain_code, plain_s = _run(
            ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(args.np), sys.executable, RUNNER,
             test_file, plain_out], plain_out + ".log", args.timeout)
        memdiag_code, memdiag_s = _run(
            [_memdiag(), "run", RUNNER, "-n", str(args.np), "--out", memdiag_out + "-run", "--timeout",
             str(int(args.timeout)), "--", test_file, memdiag_out], memdiag_out + ".log", args.timeout + 60)
        plain, plain_exits, plain_hwm = _outcomes(plain_out, args.np)
        under, under_exits, under_hwm = _outcomes(memdiag_out, args.np)
        differing = sorted(k for k in set(plain) | set(under) if plain.get(k) != under.get(k))
        plain_tests, under_tests = _durations(plain_out), _durations(memdiag_out)
        added += [(under_tests[t] - plain_tests[t], t, plain_tests[t], under_tests[t])
                  for t in set(plain_tests) & set(under_tests)]
        if plain_code != memdiag_code:
            differences.append(f"{name}: plain mpirun exited {plain_code}, memdiag run {memdiag_code}")
        for rank, test, subtest, when in differing:
            differences.append(f"{name} rank {rank} {test} {subtest} [{when}]: plain "
                               f"{plain.get((rank, test, subtest, when), 'absent')}, memdiag "
                               f"{under.get((rank, test, subtest, when), 'absent')}")
        table.add_row(name, _counts(plain), f"{plain_code} {plain_exits}", _counts(under),
                      f"{memdiag_code} {under_exits}", str(len(differing)),
                      f"{memdiag_s / plain_s:.2f} ({plain_s:.0f} s / {memdiag_s:.0f} s)",
                      f"{under_hwm / plain_hwm:.2f} ({plain_hwm / 2**20:.0f} / {under_hwm / 2**20:.0f} MiB)"
                      if plain_hwm and under_hwm else "-")
    console.print(table)
    if args.slowest and added:
        slow = Table(title=f"The {args.slowest} tests with the most seconds added under memdiag (rank 0, call phases)")
        for column in ("test", "plain", "memdiag", "added"):
            slow.add_column(column, justify="left" if column == "test" else "right")
        for extra, test, before, after in sorted(added, reverse=True)[:args.slowest]:
            slow.add_row(test, f"{before:.2f} s", f"{after:.2f} s", f"{extra:+.2f} s")
        total_plain, total_under = sum(a[2] for a in added), sum(a[3] for a in added)
        slow.add_row("all tests", f"{total_plain:.1f} s", f"{total_under:.1f} s", f"{total_under - total_plain:+.1f} s")
        console.print(slow)
    for line in differences:
        console.print(line, markup=False)
    if not differences:
        console.print("Every test and subtest has the same outcome on every rank under memdiag as under plain mpirun.")
    shutil.copy(RUNNER, os.path.join(args.out, os.path.basename(RUNNER)))
    return 1 if differences else 0


if __name__ == "__main__":
    sys.exit(main())
