"""``memdiag run WORKLOAD|SCRIPT -n N [--mode ...] [-- script args]``"""

from __future__ import annotations

import argparse

from rich.console import Console

from memdiag.agentconfig import ENGINES, HOROVOD, TF_DISTRIBUTE
from memdiag.commands._args import add_launch_options, add_launcher_option, mode_choice, positive_int, ranks_from_allocation
from memdiag.format.manifest import RunManifest


class RunCommand:
    help = "run a workload or a training script on N ranks with per-rank tracing"

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("target", help="built-in workload (transformer, mixed, resnet50) or path to a .py script")
        parser.add_argument("-n", "--ranks", dest="world_size", type=positive_int("-n"), default=None,
                            help="number of MPI ranks (inside a Slurm allocation: its SLURM_NTASKS by default)")
        parser.add_argument("--mode", type=mode_choice, default=None,
                            help="as-written (a script's default: change nothing) | sparse (allgather every "
                                 "IndexedSlices, a workload's default) | dense (densify every one) | dedup (sum "
                                 "duplicate rows, then allgather) | auto (the cheapest of the three, per tensor)")
        parser.add_argument("--engine", choices=ENGINES, default=HOROVOD,
                            help=f"what reduces the gradients: {HOROVOD} (default) or {TF_DISTRIBUTE} (TensorFlow's "
                                 "MultiWorkerMirroredStrategy; scripts and the transformer and mixed workloads, "
                                 "modes as-written, sparse, dense, auto)")
        parser.add_argument("--out", help="run directory to create (default runs/NAME-MODE-nN-TIME)")
        add_launch_options(parser, default_steps=5)
        add_launcher_option(parser)

    def run(self, args: argparse.Namespace, script_args: list[str]) -> int:

        from memdiag.commands._live import live_display
        from memdiag.format import rundir
        from memdiag.format.reader import load_run
        from memdiag.launch.options import LaunchOptions
        from memdiag.launch.session import RunRequest, execute
        from memdiag.report.terminal import print_run

        world_size = ranks_from_allocation(args.world_size)
        request = RunRequest(args.target, world_size, args.mode, LaunchOptions.from_args(args, script_args),
                             out=args.out, force=args.force, engine=args.engine)
        console = Console(stderr=True)
        engine = "" if request.engine == HOROVOD else f", engine {request.engine}"
        what = f"running {request.label} on {request.world_size} rank(s), mode {request.mode}{engine}"
        if args.quiet:
            out = execute(request)
        else:
            with console.status(what) as status:
                out = execute(request, on_ranks=live_display(what, status, console))
        run = load_run(out)
        summary = rundir.read_summary(out)
        print_run(summary, run.manifest, Console())
        Console().print(f"run directory: {out}")
        if run.manifest.get("status") != "ok":
            _print_log_tail(out, console)
            return script_exit_status(run.manifest)
        return 0


def script_exit_status(manifest: RunManifest) -> int:
    """A failed run's exit status: the launcher's (for a script, the status its failing rank exited
    with, as under plain mpirun), else 1 (a timeout, a signal, memdiag's own failure)."""
    code = manifest.get("returncode")
    return code if isinstance(code, int) and 0 < code < 128 and not manifest.get("timed_out") else 1


def _print_log_tail(out: str, console: Console, lines: int = 15) -> None:
    import os

    from memdiag.format import rundir

    path = os.path.join(out, rundir.MPIRUN_LOG)
    if os.path.exists(path):
        with open(path, encoding="utf-8", errors="replace") as f:
            log = f.read().splitlines()
        tail = log[-lines:]
        # mpirun's daemons start over ssh: ssh's own error is at the top, above OpenMPI's long message
        ssh = [line for line in log[:-lines] if line.startswith("ssh: ") or _SSH_FAILURE in line
               or "Permission denied (" in line][:5]
        if ssh:
            console.print(f"ssh's error in {path}:", style="yellow")
            for line in ssh:
                console.print(line, markup=False, highlight=False)
        console.print(f"last lines of {path}:", style="yellow")
        for line in tail:
            console.print(line, markup=False, highlight=False)


_SSH_FAILURE = "Host key verification failed"
