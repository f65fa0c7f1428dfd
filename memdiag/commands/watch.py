"""``memdiag watch DIR``: follow a run directory while its ranks write it, under any launcher (``memdiag
run``, or ``memdiag agent`` under srun, sbatch or your own mpirun), until the run ends."""

from __future__ import annotations

import argparse
import os
import time
from typing import TYPE_CHECKING

from rich.console import Console

from memdiag._errors import UserError
from memdiag.format import rundir
from memdiag.format.manifest import read_manifest

if TYPE_CHECKING:
    from memdiag.launch.session import RankProgress


class WatchCommand:
    help = "follow a run directory being written (memdiag run or memdiag agent): each rank's steps and memory"

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("run_dir", help="the run directory (memdiag run --out, memdiag agent --out)")
        parser.add_argument("--interval", type=float, default=1.0, help="seconds between readings (default 1)")

    def run(self, args: argparse.Namespace, script_args: list[str]) -> int:
        if args.interval <= 0:
            raise UserError(f"--interval must be a positive number of seconds, not {args.interval:g}")
        out = args.run_dir
        if rundir.kind(out) != rundir.RUN:
            raise UserError(f"{out} is not a memdiag run directory (no {rundir.RUN_MANIFEST}); give the --out of "
                            "memdiag run or memdiag agent")
        console = Console(stderr=True)
        try:
            status, ranks = watch(out, args.interval, console)
        except KeyboardInterrupt:
            return 130
        from memdiag.launch.session import progress_parts

        where = progress_parts("", 0, ranks)[1:]
        Console().print(" · ".join([f"{out}: status {status}", *where]), highlight=False, markup=False)
        return 0


def watch(out: str, interval_s: float, console: Console) -> tuple[str, list[RankProgress]]:
    """Show where the ranks of the run in ``out`` are until ``run.json`` leaves ``running``; its status
    and where the ranks ended."""
    from memdiag.commands._live import live_display
    from memdiag.launch.session import StepWatcher

    watchers: dict[int, StepWatcher] = {}
    what = f"watching {out}"
    with console.status(what) as shown:
        show = live_display(what, shown, console)
        while True:
            manifest = read_manifest(out)
            size = int(manifest.get("world_size") or 0)
            ranks = set(range(size)) | {int(m.group(1)) for name in os.listdir(out)
                                        if (m := rundir.RANK_FILE.match(name))}
            for rank in sorted(ranks - set(watchers)):
                watchers[rank] = StepWatcher(os.path.join(out, rundir.rank_file(rank)))
            for watcher in watchers.values():
                watcher.poll()
            show([watchers[rank].progress for rank in sorted(watchers)])
            if manifest.get("status") != "running":
                return str(manifest.get("status")), [watchers[rank].progress for rank in sorted(watchers)]
            time.sleep(interval_s)
