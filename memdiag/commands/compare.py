"""``memdiag compare sparse-vs-dense WORKLOAD -n 1,2,4 [--engine horovod|tf-distribute|both]``: every mode
at every rank count (on each engine), one verdict."""

from __future__ import annotations

import argparse

from rich.console import Console

from memdiag.commands._args import add_launch_options, add_launcher_option, positive_int
from memdiag.policy import FAULTS


class CompareCommand:
    help = "run sparse, dense and auto at several rank counts and compare memory, speed and results"

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("what", choices=("sparse-vs-dense",), help="the comparison to make")
        parser.add_argument("target", help="built-in workload or path to a .py script")
        parser.add_argument("-n", "--ranks", dest="ranks", default="1,2,4",
                            help="comma-separated rank counts (default 1,2,4)")
        parser.add_argument("--modes", default=None,
                            help="modes to run (default sparse,dense,auto, with --engine both sparse,dense; "
                                 "dedup and as-written on request)")
        # Checked by CompareRequest.check, where the engines a comparison can take are stated.
        parser.add_argument("--engine", default="horovod",
                            help="what reduces the gradients: horovod (default), tf-distribute "
                                 "(MultiWorkerMirroredStrategy), or both side by side (built-in workloads)")
        parser.add_argument("--out", help="directory for the comparison (default runs/compare-NAME-TIME)")
        parser.add_argument("--repeats", type=positive_int("--repeats"), default=1,
                            help="runs of each configuration, interleaved; their spread is the noise (default 1)")
        parser.add_argument("--inject-fault", choices=FAULTS, help=argparse.SUPPRESS)
        # Its figures are steady-state peaks: let the built-in workloads warm up until they settle.
        add_launch_options(parser, default_steps=4, default_warmup=3)
        add_launcher_option(parser)

    def run(self, args: argparse.Namespace, script_args: list[str]) -> int:
        from memdiag.launch.options import LaunchOptions
        from memdiag.launch.studies import CompareRequest, default_modes, run_compare
        from memdiag.report.compare import print_compare
        from memdiag.units import parse_rank_list

        modes = default_modes(args.engine) if args.modes is None else _modes(args.modes)
        request = CompareRequest(args.target, parse_rank_list(args.ranks), modes,
                                 LaunchOptions.from_args(args, script_args), out=args.out, force=args.force,
                                 repeats=args.repeats, fault=args.inject_fault, engine=args.engine)
        result = run_compare(request, Console(stderr=True, quiet=args.quiet))
        print_compare(result, Console())
        Console().print(f"comparison directory: {result['directory']}")
        return 0 if result["all_ok"] and result["correctness"]["passed"] is not False else 1


def _modes(text: str) -> list[str]:
    from memdiag._errors import UserError
    from memdiag.policy import MODES

    modes = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        raise UserError(f"--modes {text!r}: choose from {', '.join(MODES)}, e.g. sparse,dense,auto")
    return modes
