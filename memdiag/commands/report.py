"""``memdiag report DIR [--format text|json|markdown]``: re-render a run from its directory alone."""

from __future__ import annotations

import argparse
import json

from rich.console import Console


class ReportCommand:
    help = "show the report of a run directory"

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("run_dir", help="directory written by `memdiag run` or `memdiag compare`")
        parser.add_argument("--format", choices=("text", "json", "markdown"), default="text")

    def run(self, args: argparse.Namespace, script_args: list[str]) -> int:
        import os

        from memdiag.analyze.summary import summarize
        from memdiag.collect import load_run

        if os.path.exists(os.path.join(args.run_dir, "compare.json")):
            from memdiag.commands.compare import render_compare_dir

            return render_compare_dir(args.run_dir, args.format)
        run = load_run(args.run_dir)
        summary = summarize(run)  # always recomputed from the records: the directory is the truth
        if args.format == "json":
            print(json.dumps(summary, indent=2, default=str))
        elif args.format == "markdown":
            from memdiag.report.markdown import run_markdown

            print(run_markdown(summary, run.manifest))
        else:
            from memdiag.report.terminal import print_run

            print_run(summary, run.manifest, Console())
        return 0
