"""``memdiag compare``: run each mode at each rank count, then analyse them together."""

from __future__ import annotations

import datetime as _dt
import json
import os
from dataclasses import dataclass, field
from typing import Any, Callable

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from memdiag.analyze import compare as analysis
from memdiag.launch.session import RunRequest, execute, prepare_run_dir, run_request_from, validate


@dataclass
class CompareRequest:
    target: str
    rank_counts: list[int]
    modes: list[str]
    steps: int = 3
    preset: str = "tiny"
    out: str | None = None
    force: bool = False
    hosts: str | None = None
    timeout_s: float | None = None
    margin: float = 1.0
    seed: int = 1234
    script_args: list[str] = field(default_factory=list)
    overrides: dict[str, str] = field(default_factory=dict)
    spool: str = "shared"
    fault: str | None = None
    memray: bool = False
    horovod_timeline: bool = False
    mem_limit_bytes: int | None = None
    threads_per_rank: int | None = None
    repeats: int = 1  # runs of each configuration, interleaved: the run-to-run spread is the noise

    def run_request(self, world_size: int, mode: str, out: str) -> RunRequest:
        return run_request_from(self, world_size=world_size, mode=mode, out=out)


def run_compare(request: CompareRequest, console: Console) -> dict[str, Any]:
    # Everything is checked before the first directory is made.
    for n in request.rank_counts:
        for mode in request.modes:
            validate(request.run_request(n, mode, out=""))
    if request.out is None:
        stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        label = request.run_request(1, "sparse", "").label
        request.out = os.path.join("runs", f"compare-{label}-{stamp}")
    prepare_run_dir(request.out, request.force)
    # Every configuration once, then again: a drift in the machine's load falls on all of them.
    runs = [(r, n, mode) for r in range(request.repeats) for n in request.rank_counts for mode in request.modes]
    verify_n = min((n for n in request.rank_counts if n > 1), default=None)
    run_dirs: dict[tuple[int, str], list[str]] = {}
    verify_dir = None
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        overall = progress.add_task("comparison", total=len(runs))
        for r, n, mode in runs:
            task = progress.add_task(f"  N={n} {mode}: steps", total=request.steps)
            out = os.path.join(request.out, f"n{n}-{mode}" + (f"-r{r + 1}" if r else ""))
            run_dirs.setdefault((n, mode), []).append(
                execute(request.run_request(n, mode, out), on_steps=_progress(progress, task)))
            progress.remove_task(task)
            progress.advance(overall)
            console.print(f"  finished N={n} {mode}" + (f" (repeat {r + 1})" if request.repeats > 1 else ""),
                          highlight=False)
        if verify_n is not None:
            # A separate short run reduces every IndexedSlices gradient both ways and compares the
            # results; kept apart so that its extra collectives never touch the measured runs.
            progress.update(overall, description=f"reduction check at N={verify_n}")
            # A script runs as written (its op, compression, process set) with both reductions compared.
            check_mode = "as-written" if request.run_request(1, "sparse", "").is_script else "sparse"
            check = request.run_request(verify_n, check_mode, os.path.join(request.out, f"verify-n{verify_n}"))
            check.steps, check.check_reduction, check.memray = 1, True, False
            check.mem_limit_bytes = None  # not a measured run: it reduces twice on purpose
            verify_dir = execute(check)
    preset = None if request.run_request(1, "sparse", "").is_script else request.preset
    result = analysis.build(request.run_request(1, "sparse", "").label, preset, run_dirs, verify_dir)
    result["rank_counts"] = request.rank_counts
    result["modes"] = request.modes
    result["steps"] = request.steps
    result["repeats"] = request.repeats
    with open(os.path.join(request.out, "compare.json"), "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2, default=str)
    return result


def _progress(progress: Progress, task: TaskID) -> Callable[[int], None]:
    """Tell ``task`` how many steps rank 0 has finished."""
    return lambda done: progress.update(task, completed=done)
