"""What a long run costs in records, and what reading them back costs.

Runs ``memdiag run transformer --preset tiny -n 2 --steps S`` into a fresh directory under /tmp, then
prints:

* the run: steps, wall time, peak memory of the job (the sum of the RSS of mpirun and its ranks);
* the records: bytes of ``rank-K.jsonl`` per rank, bytes per step, and which record types take them;
* the readers: wall time and peak memory of ``memdiag report DIR``, ``memdiag report DIR --format
  json`` and ``memdiag predict DIR --ranks 8``, each in its own process.

With ``--memray`` it also runs ``memdiag run transformer --preset tiny -n 2 --steps 3 --memray``, removes
the attribution cache (``attribution.json``) and times ``memdiag report DIR``, which then reads the
memray files to attribute each rank's high-water mark; then once more with the cache.

Each command's wall time, CPU time (user + system of the command and the children it waited for: on a
shared machine the steadier figure) and peak memory, given two ways: ``maxrss``, the largest RSS of
any one process of the command (``wait4``'s ``ru_maxrss``), and ``tree``, the largest sum of the RSS
of the command and all its descendants at one moment (sampled every 50 ms from /proc: processes
reading memray files at the same time are counted together).

``--run-dir DIR`` measures the records and readers of an existing run; ``--memray-dir DIR`` the
attribution of an existing ``--memray`` run; ``--source DIR`` runs memdiag from another source tree
(e.g. ``git archive`` of an earlier commit, unpacked) for before/after figures. docs/notes/performance.md
has the figures.

Examples::

    .venv/bin/python probes/longrun_bench.py --steps 2000            # quick: the rate per step
    .venv/bin/python probes/longrun_bench.py                          # 10,000 steps
    .venv/bin/python probes/longrun_bench.py --skip-run --memray      # memray attribution only
    .venv/bin/python probes/longrun_bench.py --run-dir DIR --source OLD  # readers of DIR, old code
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MEMDIAG = [sys.executable, "-m", "memdiag"]
_PAGE = os.sysconf("SC_PAGE_SIZE")
MIB = 2**20
SOURCE = [ROOT]  # the source tree memdiag runs from (--source)


@dataclass
class Measured:
    command: list[str]
    returncode: int
    seconds: float
    cpu_seconds: float  # user + system of the command and the children it waited for
    maxrss_bytes: int  # largest RSS of one process (wait4)
    tree_bytes: int  # largest summed RSS of the process tree (sampled)
    stdout: str
    stderr: str


def _tree_rss(root: int) -> int:
    """RSS of ``root`` and every descendant, now."""
    parents: dict[int, int] = {}
    rss: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
            with open(f"/proc/{name}/statm", "rb") as f:
                pages = int(f.read().split()[1])
        except (OSError, ValueError, IndexError):
            continue
        fields = stat[stat.rfind(b")") + 2:].split()
        pid = int(name)
        parents[pid] = int(fields[1])
        rss[pid] = pages * _PAGE
    total = 0
    for pid in rss:
        p, seen = pid, 0
        while p and p != root and seen < 64:
            p, seen = parents.get(p, 0), seen + 1
        if p == root:
            total += rss[pid]
    return total


def measure(command: list[str], quiet_stdout: bool = True) -> Measured:
    """Run ``command``; its wall time, largest single-process RSS and largest process-tree RSS."""
    out = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - read and closed below, after the process ends
    err = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115
    start = time.perf_counter()
    proc = subprocess.Popen(command, cwd=SOURCE[0], stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                            env={**os.environ, "COLUMNS": "160"})
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.05):
            peak[0] = max(peak[0], _tree_rss(proc.pid))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    done.set()
    sampler.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    out.seek(0)
    err.seek(0)
    return Measured(command, proc.returncode, seconds, usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024, peak[0],
                    "" if quiet_stdout else out.read(), err.read())


def _show(cmd: list[str]) -> str:
    return " ".join(["memdiag", *cmd[len(MEMDIAG):]] if cmd[:len(MEMDIAG)] == MEMDIAG else cmd)


def _line(label: str, m: Measured) -> str:
    status = "" if m.returncode == 0 else f"  EXIT {m.returncode}"
    return (f"  {label:<34} {m.seconds:8.2f} s  cpu {m.cpu_seconds:8.2f} s  maxrss {m.maxrss_bytes / MIB:8.1f} MiB  "
            f"tree {m.tree_bytes / MIB:8.1f} MiB{status}")


def record_sizes(run_dir: str) -> dict[int, dict[str, Any]]:
    """Per rank: bytes of rank-K.jsonl, steps recorded, and bytes and lines per record type."""
    sizes: dict[int, dict[str, Any]] = {}
    for name in sorted(os.listdir(run_dir)):
        if not (name.startswith("rank-") and name.endswith(".jsonl")):
            continue
        rank = int(name[5:-6])
        by_type: dict[str, list[int]] = {}
        steps = 0
        with open(os.path.join(run_dir, name), "rb") as f:
            for line in f:
                try:
                    kind = json.loads(line).get("type", "?")
                except ValueError:
                    kind = "(unreadable)"
                entry = by_type.setdefault(kind, [0, 0])
                entry[0] += len(line)
                entry[1] += 1
                if kind == "step":
                    steps += 1
        sizes[rank] = {"bytes": os.path.getsize(os.path.join(run_dir, name)), "steps": steps, "by_type": by_type}
    return sizes


def load_average() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.1f} (1 min), {five:.1f} (5 min) on {os.cpu_count()} cores"


def bench_readers(run_dir: str, predict: bool, results: dict[str, Any]) -> None:
    commands = {
        "report": [*MEMDIAG, "report", run_dir],
        "report --format json": [*MEMDIAG, "report", run_dir, "--format", "json"],
    }
    if predict:
        commands["predict --ranks 8"] = [*MEMDIAG, "predict", run_dir, "--ranks", "8"]
    print("readers (each in its own process):")
    for label, cmd in commands.items():
        m = measure(cmd)
        print(_line(label, m))
        if m.returncode:
            print("    " + m.stderr.strip().replace("\n", "\n    ")[-2000:])
        results["readers"][label] = {"command": _show(cmd), "seconds": m.seconds, "cpu_seconds": m.cpu_seconds,
                                     "maxrss_bytes": m.maxrss_bytes,
                                     "tree_bytes": m.tree_bytes, "returncode": m.returncode}


def bench_records(run_dir: str, steps: int, results: dict[str, Any]) -> None:
    sizes = record_sizes(run_dir)
    print("records:")
    for rank, s in sizes.items():
        per_step = s["bytes"] / max(1, steps)
        print(f"  rank-{rank}.jsonl  {s['bytes']:>14,} bytes  ({s['bytes'] / MIB:8.1f} MiB)  "
              f"{per_step:10,.0f} bytes/step  ({s['steps']} step records, set-up included)")
        for kind, (b, n) in sorted(s["by_type"].items(), key=lambda kv: -kv[1][0]):
            print(f"      {kind:<16} {b:>14,} bytes  {n:>9,} lines  {b / max(1, steps):10,.0f} bytes/step")
    results["records"] = {str(r): s for r, s in sizes.items()}


def bench_long_run(args: argparse.Namespace, root: str, results: dict[str, Any]) -> str:
    out = os.path.join(root, f"tiny-n{args.ranks}-s{args.steps}")
    cmd = [*MEMDIAG, "run", "transformer", "--preset", args.preset, "-n", str(args.ranks), "--steps", str(args.steps),
           "--out", out]
    print(f"$ {_show(cmd)}")
    m = measure(cmd)
    print(_line(f"run ({args.steps} steps)", m))
    if m.returncode:
        print(m.stderr[-3000:])
    results["run"] = {"command": _show(cmd), "steps": args.steps, "seconds": m.seconds,
                      "seconds_per_step": m.seconds / args.steps, "maxrss_bytes": m.maxrss_bytes,
                      "tree_bytes": m.tree_bytes, "returncode": m.returncode}
    print(f"  {m.seconds / args.steps * 1000:.1f} ms per step, all in (start-up included)")
    return out


def bench_memray(args: argparse.Namespace, root: str, results: dict[str, Any]) -> None:
    out = args.memray_dir or os.path.join(root, f"tiny-n{args.ranks}-memray")
    if not args.memray_dir:
        cmd = [*MEMDIAG, "run", "transformer", "--preset", args.preset, "-n", str(args.ranks),
               "--steps", str(args.memray_steps), "--memray", "--out", out]
        print(f"$ {_show(cmd)}")
        m = measure(cmd)
        print(_line("run --memray (attribution included)", m))
        if m.returncode:
            print(m.stderr[-3000:])
        results["memray_run"] = {"command": _show(cmd), "seconds": m.seconds, "maxrss_bytes": m.maxrss_bytes,
                                 "tree_bytes": m.tree_bytes}
    files = sorted(f for f in os.listdir(out) if f.endswith(".memray.bin"))
    for name in files:
        print(f"  {name}: {os.path.getsize(os.path.join(out, name)) / MIB:.1f} MiB")
    cache = os.path.join(out, "attribution.json")
    report = [*MEMDIAG, "report", out]
    print(f"$ rm {cache}; {_show(report)}")
    figures = []
    for i in range(args.memray_repeats):
        if os.path.exists(cache):
            os.remove(cache)
        m = measure(report, quiet_stdout=False)
        print(_line(f"report, attribution computed ({i + 1})", m))
        if m.returncode:
            print(m.stderr[-3000:])
        figures.append({"seconds": m.seconds, "cpu_seconds": m.cpu_seconds, "maxrss_bytes": m.maxrss_bytes,
                        "tree_bytes": m.tree_bytes})
    cached = measure(report)
    print(_line("report, attribution from its cache", cached))
    if os.path.exists(cache):
        with open(cache, encoding="utf-8") as f:
            attribution = json.load(f)
        for r in attribution.get("ranks", []):
            print(f"  rank {r['rank']}: peak {r['peak_bytes']:,} bytes (memray's {r['memray_peak_bytes']:,}), "
                  f"{r['records']:,} records: " + ", ".join(f"{g['group']} {g['bytes'] / MIB:.1f} MiB"
                                                          for g in r["groups"]))
        for w in attribution.get("warnings", []):
            print(f"  warning: {w}")
    results["memray"] = {"dir": out, "report_command": _show(report), "computed": figures,
                         "cached": {"seconds": cached.seconds, "maxrss_bytes": cached.maxrss_bytes,
                                    "tree_bytes": cached.tree_bytes},
                         "files": {n: os.path.getsize(os.path.join(out, n)) for n in files}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10000, help="training steps of the long run (default 10000)")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--root", help="directory to create the runs in (default: a new one under /tmp)")
    parser.add_argument("--run-dir", help="measure the records and readers of this existing run; run nothing")
    parser.add_argument("--skip-run", action="store_true", help="no long run (with --memray: memray only)")
    parser.add_argument("--no-predict", action="store_true", help="leave `memdiag predict` out")
    parser.add_argument("--memray", action="store_true",
                        help="also time the memray attribution of a short run (`report` without the cache)")
    parser.add_argument("--memray-steps", type=int, default=3)
    parser.add_argument("--memray-dir", help="attribute the memray files of this existing run instead")
    parser.add_argument("--memray-repeats", type=int, default=1)
    parser.add_argument("--keep", action="store_true", help="keep the run directories (always kept with --root)")
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    parser.add_argument("--source", metavar="DIR",
                        help="run memdiag from this source tree (e.g. `git archive` of an earlier commit): before/after")
    args = parser.parse_args(argv)
    if args.source:
        SOURCE[0] = os.path.abspath(args.source)

    root = args.root or tempfile.mkdtemp(prefix="memdiag-longrun-", dir="/tmp")
    os.makedirs(root, exist_ok=True)
    results: dict[str, Any] = {"readers": {}, "load_before": os.getloadavg()}
    print(f"{load_average()}; runs in {root}; memdiag from {SOURCE[0]}")
    try:
        if args.run_dir or not args.skip_run:
            if args.run_dir:
                run_dir = args.run_dir
                with open(os.path.join(run_dir, "run.json"), encoding="utf-8") as f:
                    steps = json.load(f).get("steps") or 1
            else:
                run_dir, steps = bench_long_run(args, root, results), args.steps
            bench_records(run_dir, steps, results)
            bench_readers(run_dir, not args.no_predict, results)
        if args.memray or args.memray_dir:
            bench_memray(args, root, results)
    finally:
        results["load_after"] = os.getloadavg()
        print(load_average())
        if args.json:
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump(results, f, indent=1)
        if not (args.keep or args.root):
            shutil.rmtree(root, ignore_errors=True)
        else:
            print(f"kept {root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
