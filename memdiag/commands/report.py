"""``memdiag report DIR [--format text|json|markdown|chrome] [--plots]``: re-render a run from its
directory alone."""

from __future__ import annotations

import argparse
import json
import sys

from rich.console import Console


class ReportCommand:
    help = "show the report of a run directory"

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("run_dir", help="directory written by `memdiag run` or `memdiag compare`")
        parser.add_argument("--format", choices=("text", "json", "markdown", "chrome"), default="text",
                            help="chrome: write a trace for Perfetto / chrome://tracing (default DIR/trace.json)")
        parser.add_argument("--output", metavar="FILE", help="where --format chrome writes the trace")
        parser.add_argument("--plots", action="store_true",
                            help="also write PNG plots: memory.png for a run, peak-vs-ranks.png for a comparison")

    def run(self, args: argparse.Namespace, script_args: list[str]) -> int:

        from memdiag import rundir
        from memdiag._errors import UserError
        from memdiag.analyze.summary import summarize
        from memdiag.collect import load_run

        if args.output and args.format != "chrome":
            raise UserError("--output is where --format chrome writes its trace; add --format chrome or drop --output")
        if rundir.kind(args.run_dir) == rundir.COMPARISON:
            from memdiag.commands.compare import render_compare_dir

            if args.format == "chrome":
                raise UserError(f"--format chrome traces one run: give a run directory inside {args.run_dir}")
            status = render_compare_dir(args.run_dir, args.format)
            if args.plots:
                _say_plots(_compare_plots(args.run_dir), args.format)
            return status
        run = load_run(args.run_dir)
        from memdiag.commands.collect import ended_without_word

        ended = ended_without_word(args.run_dir, run)
        if ended is not None:
            # Shown as `collect` would mark it; the directory itself is left as it is.
            run.manifest = {**run.manifest, "status": ended}
            print(f"note: {args.run_dir} was never completed by its launcher (killed, or its node lost); "
                  f"`memdiag collect {args.run_dir}` marks it and writes its summary", file=sys.stderr)
        if args.format == "chrome":
            from memdiag.report.trace import write_chrome_trace

            trace = write_chrome_trace(run, args.output)
            print(f"wrote {trace.path}: {trace.events} events, {trace.ranks} ranks"
                  + (f", {trace.horovod_events} from Horovod's timeline" if trace.horovod_events else "")
                  + " (open it in ui.perfetto.dev or chrome://tracing)")
            for note in trace.notes:
                print(f"note: {note}")
            if args.plots:
                from memdiag.report.plots import write_run_plots

                _say_plots(write_run_plots(run), args.format)
            return 0
        summary = summarize(run)  # always recomputed from the records: the directory is the truth
        if args.format == "json":
            print(json.dumps(summary, indent=2, default=str))
        elif args.format == "markdown":
            from memdiag.report.markdown import run_markdown

            print(run_markdown(summary, run.manifest))
        else:
            from memdiag.report.terminal import print_run

            print_run(summary, run.manifest, Console())
        if args.plots:
            from memdiag.report.plots import write_run_plots

            _say_plots(write_run_plots(run), args.format)
        return 0


def _compare_plots(path: str) -> list[str] | None:
    """``peak-vs-ranks.png`` of a comparison; with two engines one line per engine and mode."""
    import os
    from typing import cast

    from memdiag import rundir
    from memdiag.report.plots import PEAK_PLOT, plot_peak_vs_ranks, write_compare_plots
    from memdiag.schema import EnginesComparison

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
