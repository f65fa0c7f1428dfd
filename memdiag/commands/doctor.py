"""``memdiag doctor [-n N] [--format text|json]``: is this host ready to run memdiag, and how to fix
what is not."""

from __future__ import annotations

import argparse

from memdiag.commands._args import positive_int


class DoctorCommand:
    help = "check TensorFlow, Horovod's build, mpirun, memray and memory, and say how to fix problems"

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("-n", "--ranks", dest="world_size", type=positive_int("-n"), default=4,
                            help="ranks you plan to run on this host (for the memory check, default 4)")
        from memdiag.report.reporter import formats_for

        parser.add_argument("--format", choices=formats_for("doctor"), default="text",
                            help="text: a table with the fixes; json: every check and the failed ones, for scripts")

    def run(self, args: argparse.Namespace, script_args: list[str]) -> int:
        from memdiag.doctor import run_checks
        from memdiag.report import reporter

        checks = run_checks(args.world_size)
        reporter.write(reporter.DoctorResult(checks), args.format)
        return 1 if any(c.status == "fail" for c in checks) else 0
