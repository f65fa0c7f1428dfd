"""``memdiag agent --out DIR [options] -- python train.py ARGS`` (or ``memdiag agent WORKLOAD --out DIR``):
one rank, started by the user's own launcher (``srun``, ``mpirun``, ``horovodrun``); see
:mod:`memdiag.launch.foreign`."""

from __future__ import annotations

import argparse

from memdiag.agentconfig import ENGINES, HOROVOD
from memdiag.commands._args import add_launch_options, mode_choice, positive_float


class AgentCommand:
    help = "run one rank under your own launcher: srun/mpirun/horovodrun ... memdiag agent --out DIR -- python train.py"

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("target", nargs="?", default=None,
                            help="a built-in workload (transformer, mixed, resnet50) or a script; or give the "
                                 "script after `--`: -- python train.py ARGS")
        parser.add_argument("--out", required=True,
                            help="run directory, the same for every rank (on a shared file system, or see --spool)")
        parser.add_argument("--mode", type=mode_choice, default=None,
                            help="as-written (a script's default) | sparse | dense | dedup | auto, as for memdiag run")
        parser.add_argument("--engine", choices=ENGINES, default=HOROVOD,
                            help=f"what reduces the gradients (default {HOROVOD})")
        parser.add_argument("--memray-ranks", metavar="RANKS", default=None,
                            help="track allocations with memray on these ranks only, e.g. 0,7 (--memray: every rank)")
        parser.add_argument("--trace-ranks", metavar="RANKS", default=None,
                            help="sample RSS every --sample-ms on these ranks only (the others every 100 ms; every rank "
                                 "still records its collectives, per-step peaks and VmHWM)")
        parser.add_argument("--start-timeout", type=positive_float("--start-timeout"), default=120.0,
                            metavar="SECONDS", help="how long ranks wait for each other before the script starts "
                                                    "(default 120)")
        add_launch_options(parser, default_steps=5)

    def run(self, args: argparse.Namespace, script_args: list[str]) -> int:
        from memdiag._errors import UserError
        from memdiag.launch.foreign import AgentRequest, parse_ranks, run_rank, user_target
        from memdiag.launch.options import LaunchOptions
        from memdiag.launch.session import RunRequest

        if args.hosts:
            raise UserError("--hosts is for memdiag run: under memdiag agent your launcher places the ranks; drop it")
        if args.timeout:
            raise UserError("--timeout is for memdiag run: under memdiag agent give your launcher's time limit "
                            "(sbatch -t, srun -t); drop it")
        command = tuple(script_args)  # as typed after `--`
        if args.target is None:
            target, script_args = user_target(script_args)
        else:
            target = args.target
        run = RunRequest(target, 1, args.mode, LaunchOptions.from_args(args, script_args), out=args.out,
                         force=args.force, engine=args.engine)
        request = AgentRequest(
            run=run,
            memray_ranks=None if args.memray_ranks is None else parse_ranks(args.memray_ranks, "--memray-ranks"),
            trace_ranks=None if args.trace_ranks is None else parse_ranks(args.trace_ranks, "--trace-ranks"),
            start_timeout_s=args.start_timeout,
            user_command=command,
        )
        return run_rank(request)

