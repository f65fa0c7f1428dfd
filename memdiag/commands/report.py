"""``memdiag report DIR [--format text|json|markdown|chrome|tensorboard] [--output PATH] [--plots]``:
re-render a run, comparison or scaling study from its directory alone (memdiag.report.reporter)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from memdiag.report.reporter import RunResult, StudyResult


class ReportCommand:
    help = "show the report of a run directory, or write it in another format"

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        from memdiag.report.reporter import formats_for

        parser.add_argument("run_dir", help="directory written by `memdiag run`, `memdiag compare` or `memdiag scale`")
        parser.add_argument("--format", choices=formats_for("run"), default="text",
                            help="text: the terminal report; json, markdown: on stdout; chrome: a trace for Perfetto / "
                                 "chrome://tracing (default DIR/trace.json); tensorboard: event files, one TensorBoard "
                                 "run per run directory (default DIR/tensorboard)")
        parser.add_argument("--output", "--out", metavar="PATH", dest="output",
                            help="where --format chrome writes its trace (a file) or --format tensorboard its event "
                                 "files (a log directory)")
        parser.add_argument("--plots", action="store_true",
                            help="also write PNG plots: memory.png for a run, peak-vs-ranks.png for a comparison")

    def run(self, args: argparse.Namespace, script_args: list[str]) -> int:
        from memdiag.format import rundir
        from memdiag.report import reporter

        result = load(args.run_dir)
        reporter.write(result, args.format, args.output)
        if args.plots:
            if isinstance(result, reporter.RunResult):
                from memdiag.report.plots import write_run_plots

                _say_plots(write_run_plots(result.run), args.format)
            elif result.kind == rundir.COMPARISON:
                _say_plots(_compare_plots(args.run_dir), args.format)
        return 0


def load(path: str) -> RunResult | StudyResult:
    """The result a directory holds: a run, or a comparison or scaling study of runs."""
    from memdiag.commands.collect import ended_without_word
    from memdiag.format import rundir
    from memdiag.format.reader import load_run
    from memdiag.report.reporter import RunResult, StudyResult

    what = rundir.kind(path)
    if what == rundir.COMPARISON:
        return StudyResult(path, what, dict(rundir.read_comparison(path)))
    if what == rundir.SCALE:
        return StudyResult(path, what, rundir.read_json(os.path.join(path, rundir.SCALE_FILE)))
    run = load_run(path)
    ended = ended_without_word(path, run)
    if ended is not None:
        # Shown as `collect` would mark it; the directory itself is left as it is.
        run.manifest = {**run.manifest, "status": ended}
        print(f"note: {path} was never completed by its launcher (killed, or its node lost); "
              f"`memdiag collect {path}` marks it and writes its summary", file=sys.stderr)
    return RunResult(path, run)


def _compare_plots(path: str) -> list[str] | None:
    """``peak-vs-ranks.png`` of a comparison; with two engines one line per engine and mode."""
    import os
    from typing import cast

    from memdiag.format import rundir
    from memdiag.format.results import EnginesComparison
    from memdiag.report.plots import PEAK_PLOT, plot_peak_vs_ranks, write_compare_plots

    comparison = rundir.read_comparison(path)
    if comparison.get("engine") != "both":
        return write_compare_plots(path)
    result = cast(EnginesComparison, comparison)
    rows = [{**r, "mode": f"{r['engine']} {r['mode']}"} for r in result["side_by_side"]]
    title = f"{result.get('workload', '?')} ({result.get('preset', '?')}): peak memory per rank, two engines"
    written = plot_peak_vs_ranks(rows, os.path.join(path, PEAK_PLOT), title)
    return None if written is None else [written]


def _say_plots(paths: list[str] | None, fmt: str) -> None:
    """Where the plots went; on stderr when stdout carries JSON."""
    import sys

    from memdiag.report.plots import MISSING

    out = sys.stderr if fmt == "json" else sys.stdout
    for line in ([MISSING] if paths is None else [f"wrote {p}" for p in paths]):
        print(line, file=out)
