"""``memdiag predict DIR --ranks 16,64,300,1200 [--mem-per-rank SIZE]``"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from memdiag.format.results import RunSummary


class PredictCommand:
    help = "predict collective bytes and peak memory per rank at larger rank counts from measured runs"

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("run_dir", help="a run directory, or a comparison directory (better: it has several N)")
        parser.add_argument("--ranks", default="16,64,300,1200", help="rank counts to predict (default 16,64,300,1200)")
        parser.add_argument("--mem-per-rank", help="memory budget per rank, e.g. 4G: say where each mode passes it")
        parser.add_argument("--modes", default="sparse,dense,auto")
        parser.add_argument("--fit-max-ranks", type=int, default=None, metavar="N",
                            help="fit only from runs with at most N ranks (to check a prediction against a larger run)")
        parser.add_argument("--engine", default=None,
                            help="the engine whose runs to fit, for a comparison made with --engine both "
                                 "(horovod or tf-distribute; default: the one engine the runs used)")
        from memdiag.report.reporter import formats_for

        parser.add_argument("--format", choices=formats_for("prediction"), default="text")

    def run(self, args: argparse.Namespace, script_args: list[str]) -> int:
        from memdiag.analyze.model import build_model, prediction_table
        from memdiag.commands.compare import _modes
        from memdiag.report import reporter
        from memdiag.units import parse_rank_list, parse_size

        summaries = of_one_engine(load_summaries(args.run_dir), args.engine, args.run_dir)
        ranks = parse_rank_list(args.ranks, "--ranks")
        budget = parse_size(args.mem_per_rank, "--mem-per-rank") if args.mem_per_rank else None
        fitted = [s for s in summaries if args.fit_max_ranks is None or s["world_size"] <= args.fit_max_ranks]
        if not fitted:
            from memdiag._errors import UserError

            raise UserError(f"no run in {args.run_dir} has at most {args.fit_max_ranks} ranks; raise --fit-max-ranks")
        model = build_model(fitted)
        table = prediction_table(model, ranks, _modes(args.modes), budget)
        # The model predicts the steady-state peak (step 0's tracing left out) where summaries record it.
        table["measured"] = [{"world_size": s["world_size"], "mode": s["mode"],
                              "peak_rss_bytes": s.get("steady_peak_rss_bytes_max") or s["peak_rss_bytes_max"],
                              "collective_bytes_per_rank": max((r["collective_bytes_per_step"] for r in s["ranks"]),
                                                               default=0)}
                             for s in summaries if s["world_size"] in ranks]
        reporter.write(reporter.PredictionResult(table), args.format)
        return 0


def of_one_engine(summaries: list[RunSummary], engine: str | None, path: str) -> list[RunSummary]:
    """The runs of one engine: Horovod's and MultiWorkerMirroredStrategy's buffers differ (a comparison
    made with --engine both holds both), so one model is never fitted to a mix of them."""
    from memdiag._errors import UserError

    engines = sorted({s.get("engine", "horovod") for s in summaries})
    if engine is None:
        if len(engines) > 1:
            raise UserError(f"{path} holds runs of the engines {' and '.join(engines)}: choose one with "
                            f"--engine {engines[0]} or --engine {engines[1]}")
        return summaries
    chosen = [s for s in summaries if s.get("engine", "horovod") == engine]
    if not chosen:
        raise UserError(f"--engine {engine}: {path} holds runs of {', '.join(engines)} only; choose one of them")
    return chosen


def load_summaries(path: str) -> list[RunSummary]:
    """summary.json of a run directory, or of every run in a comparison directory."""
    from memdiag._errors import UserError
    from memdiag.analyze.summary import summarize
    from memdiag.format import rundir
    from memdiag.format.reader import load_run

    dirs = rundir.runs_of(path) if rundir.kind(path) == rundir.COMPARISON else [path]
    summaries = []
    for run_dir in dirs:
        summaries.append(summarize(load_run(run_dir)))
    if not summaries:
        raise UserError(f"{path} holds no runs; give a directory written by `memdiag run` or `memdiag compare`")
    return summaries
