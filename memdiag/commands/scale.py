"""``memdiag scale WORKLOAD --ranks 1,2,4 --weak|--strong [--project 64,300,1200]``"""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

from rich.console import Console

if TYPE_CHECKING:
    from memdiag.analyze.scaling import ProjectionRequest

from memdiag.commands._args import add_launch_options, add_launcher_option, mode_choice, positive_float


class ScaleCommand:
    help = "run a workload at several rank counts (weak or strong scaling) and project to larger ones"

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("target", nargs="?", help="built-in workload or path to a .py script")
        parser.add_argument("-n", "--ranks", default="1,2,4", help="comma-separated rank counts (default 1,2,4)")
        kind = parser.add_mutually_exclusive_group()
        kind.add_argument("--weak", dest="scaling", action="store_const", const="weak",
                          help="keep the batch per rank: the global batch grows with N")
        kind.add_argument("--strong", dest="scaling", action="store_const", const="strong",
                          help="keep the global batch (the preset's per-rank batch at N=1), divided among N ranks")
        parser.add_argument("--mode", type=mode_choice, default="sparse",
                            help="sparse (Horovod's default) | dense (densify every IndexedSlices) | auto")
        parser.add_argument("--out", help="directory for the study (default runs/scale-NAME-KIND-TIME)")
        parser.add_argument("--from", dest="from_dir", metavar="DIR",
                            help="analyse an existing scale or run directory again instead of running")
        project = parser.add_argument_group("projection (alpha-beta model of ring collectives, docs/explanation/projection.md)")
        project.add_argument("--project", metavar="N,N,...",
                             help="rank counts to project weak and strong efficiency to, e.g. 64,400,1200")
        project.add_argument("--alpha", type=positive_float("--alpha"), metavar="SECONDS",
                             help="latency per message hop (default 5e-6: a 100 Gb/s fabric)")
        project.add_argument("--beta", type=positive_float("--beta"), metavar="BYTES_PER_S",
                             help="bandwidth per link (default 10e9: a 100 Gb/s fabric)")
        project.add_argument("--network", metavar="JSON",
                             help="fit alpha and beta to the rows of probes/collective_bench.py --json")
        project.add_argument("--fusion-threshold", metavar="SIZE",
                             help="Horovod fusion buffer (default HOROVOD_FUSION_THRESHOLD or 128M, Horovod's own default)")
        project.add_argument("--step-compute", type=positive_float("--step-compute"), metavar="SECONDS",
                             help="compute time per step at the measured batch, instead of the measured one")
        project.add_argument("--project-batch", type=positive_float("--project-batch"), metavar="ITEMS",
                             help="per-rank batch (tokens or images) to project at; compute time and "
                                  "IndexedSlices rows are scaled from the measured batch")
        add_launch_options(parser, default_steps=4)
        add_launcher_option(parser)

    def run(self, args: argparse.Namespace, script_args: list[str]) -> int:
        from memdiag._errors import UserError
        from memdiag.analyze.scaling import analyze_dir
        from memdiag.launch.options import LaunchOptions
        from memdiag.launch.studies import ScaleRequest, run_scale
        from memdiag.report.scale import print_scale
        from memdiag.units import parse_rank_list

        projection = _projection_request(args)
        if args.from_dir:
            if args.target or args.scaling:
                raise UserError("--from DIR analyses runs that exist; leave out the workload and --weak/--strong")
            result = analyze_dir(args.from_dir, projection)
            print_scale(result, Console())
            return 0 if result["projection_error"] is None else 2
        if not args.target:
            raise UserError("name a workload (e.g. memdiag scale resnet50 --ranks 1,2 --weak) or give --from DIR")
        if not args.scaling:
            raise UserError("choose --weak (same batch per rank) or --strong (same global batch)")
        request = ScaleRequest(args.target, parse_rank_list(args.ranks, "--ranks"), args.scaling, args.mode,
                               LaunchOptions.from_args(args, script_args), out=args.out, force=args.force)
        result = run_scale(request, projection, Console(stderr=True, quiet=getattr(args, "quiet", False)))
        print_scale(result, Console())
        Console().print(f"scale directory: {result['directory']}")
        ok = all(row["status"] == "ok" for row in result["rows"]) and result["projection_error"] is None
        return 0 if ok else 1


def _projection_request(args: argparse.Namespace) -> ProjectionRequest | None:
    from memdiag._errors import UserError
    from memdiag.analyze import projection as model
    from memdiag.analyze.scaling import ProjectionRequest
    from memdiag.units import parse_rank_list, parse_size

    asked = [flag for flag, value in (("--alpha", args.alpha), ("--beta", args.beta), ("--network", args.network),
                                      ("--fusion-threshold", args.fusion_threshold),
                                      ("--step-compute", args.step_compute),
                                      ("--project-batch", args.project_batch)) if value is not None]
    if not args.project:
        if asked:
            raise UserError(f"{asked[0]} only matters for a projection; add --project N,N,... (e.g. 64,400,1200)")
        return None
    if args.network and (args.alpha is not None or args.beta is not None):
        raise UserError("give either --network JSON or --alpha/--beta, not both")
    if args.network:
        network = model.load_network(args.network)
    else:
        given = args.alpha is not None or args.beta is not None
        network = model.Network(model.DEFAULT_ALPHA_S if args.alpha is None else args.alpha,
                                model.DEFAULT_BETA_BYTES_PER_S if args.beta is None else args.beta,
                                "command line" if given else "default: 100 Gb/s fabric")
    threshold = args.fusion_threshold or os.environ.get("HOROVOD_FUSION_THRESHOLD")
    fusion = model.DEFAULT_FUSION_BYTES if threshold is None else parse_size(threshold, "--fusion-threshold")
    return ProjectionRequest(parse_rank_list(args.project, "--project"), network, fusion, args.step_compute,
                             args.project_batch)
