"""Argument types shared by the verbs: each rejects bad input with a message that says what to do."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

from memdiag.launch.options import (
    DEFAULT_LAUNCHER,
    DEFAULT_RECORD_EVERY_S,
    DEFAULT_SAMPLE_MS,
    DEFAULTS,
    LAUNCHERS,
    LIMIT_SAMPLE_MS,
    MAX_RECORD_EVERY_S,
    MAX_SAMPLE_MS,
    MIN_SAMPLE_MS,
    SPOOLS,
)
from memdiag.policy import MODES


def whole_number(what: str, minimum: int) -> Callable[[str], int]:
    """A whole number of at least ``minimum`` (0 or 1)."""
    least = "0 or more" if minimum == 0 else f"at least {minimum}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{what} must be a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{what} must be {least}, got {value}")
        return value

    return parse


def positive_int(what: str) -> Callable[[str], int]:
    return whole_number(what, 1)


def non_negative_int(what: str) -> Callable[[str], int]:
    return whole_number(what, 0)


def finite_number(what: str, zero: bool) -> Callable[[str], float]:
    """A finite number above 0 (or, with ``zero``, 0 too)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{what} must be a number, got {text!r}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{what} must be a finite number, got {text}")
        if value < 0 or (value == 0 and not zero):
            raise argparse.ArgumentTypeError(f"{what} must be {'0 or more' if zero else 'positive'}, got {text}")
        return value

    return parse


def positive_float(what: str) -> Callable[[str], float]:
    return finite_number(what, zero=False)


def non_negative_float(what: str) -> Callable[[str], float]:
    return finite_number(what, zero=True)


def size_arg(what: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        from memdiag._errors import UserError
        from memdiag.units import parse_size

        try:
            value = parse_size(text, what)
        except UserError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{what} must be positive, got {text!r}")
        return value

    return parse


def key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"--set takes key=value, got {text!r}")
    return key.strip(), value.strip()


def add_launch_options(parser: argparse.ArgumentParser, default_steps: int,
                       default_warmup: int = DEFAULTS.max_warmup) -> None:
    """Options common to every verb that starts ranks."""
    parser.add_argument("--quiet", "-q", action="store_true",
                        help="no progress while the job runs (the report and errors still print)")
    parser.add_argument("--steps", type=positive_int("--steps"), default=default_steps,
                        help=f"training steps per run (default {default_steps})")
    parser.add_argument("--preset", default=DEFAULTS.preset,
                        help=f"preset of a built-in workload (default {DEFAULTS.preset})")
    parser.add_argument("--set", dest="overrides", type=key_value, action="append", default=[],
                        metavar="KEY=VALUE", help="override one preset setting, e.g. --set vocab_size=33945")
    parser.add_argument("--margin", type=positive_float("--margin"), default=DEFAULTS.margin,
                        help=f"auto: densify when gathered bytes exceed dense bytes x margin (default {DEFAULTS.margin})")
    parser.add_argument("--hosts", help="hosts passed to mpirun -H, e.g. node1:4,node2:4")
    parser.add_argument("--timeout", type=positive_float("--timeout"), default=None, metavar="SECONDS",
                        help="end the job if it runs longer than this")
    parser.add_argument("--mem-limit", type=size_arg("--mem-limit"), default=None, metavar="SIZE",
                        help="per rank: kill a rank whose RSS passes SIZE (e.g. 1.5G), as a batch system does")
    parser.add_argument("--seed", type=int, default=DEFAULTS.seed,
                        help=f"seed of data and initial parameters (default {DEFAULTS.seed})")
    parser.add_argument("--spool", choices=SPOOLS, default=DEFAULTS.spool,
                        help="shared: ranks write into the run directory; local: ranks write to "
                             "node-local storage and stream their records to rank 0 over MPI while the job runs "
                             "(about once a second)")
    parser.add_argument("--force", action="store_true", help="replace an existing output directory")
    parser.add_argument("--memray", action="store_true",
                        help="track every allocation with memray (native stacks) in each rank: "
                             "rank-K.memray.bin, and what holds memory at the peak in the report")
    parser.add_argument("--threads-per-rank", type=positive_int("--threads-per-rank"), default=None,
                        metavar="K", help="set TensorFlow's intra-op threads per rank to K (inter-op 1); "
                                          "a script's own thread settings are kept otherwise")
    parser.add_argument("--max-warmup", type=non_negative_int("--max-warmup"), default=default_warmup,
                        metavar="K", help="built-in workloads: after --steps, up to K more steps while the per-step "
                                          "peak has not settled (its last 3 steps within 1%%, no trend) on every "
                                          f"rank (default {default_warmup})")
    parser.add_argument("--horovod-timeline", action="store_true",
                        help="record Horovod's own timeline (rank 0) into the run directory")
    parser.add_argument("--sample-ms", type=positive_float("--sample-ms"), default=None, metavar="MS",
                        help=f"how often every rank samples its RSS, in milliseconds (default {DEFAULT_SAMPLE_MS:g}, "
                             f"{LIMIT_SAMPLE_MS:g} with --mem-limit; {MIN_SAMPLE_MS:g} to {MAX_SAMPLE_MS:g}): each "
                             "sample costs the rank CPU, a longer period less; a step's peak stays exact (the "
                             "kernel's high-water mark) and every collective's start and end is sampled anyway; "
                             "the memory series between them gets fewer samples")
    parser.add_argument("--record-every", type=non_negative_float("--record-every"), default=None, metavar="S",
                        help=f"turn a script's marks of its collectives inside graphs into records every S seconds "
                             f"(default {DEFAULT_RECORD_EVERY_S:g}; 0 with --mem-limit or --spool local; up to "
                             f"{MAX_RECORD_EVERY_S:g}), or 0: at every step, which costs a script with short steps "
                             "several times more of memdiag's CPU. The marks wait in a file in the run directory, "
                             "so a rank killed outright (the kernel's OOM killer, kill -9) still loses only the "
                             "step it was in; with --spool local that file stays on the node, and such a rank "
                             "loses up to S seconds of records")


def mode_choice(text: str) -> str:
    if text not in MODES:
        raise argparse.ArgumentTypeError(f"mode must be one of {', '.join(MODES)}, got {text!r}")
    return text


def add_launcher_option(parser: argparse.ArgumentParser) -> None:
    """``--launcher mpirun|srun``: what starts the ranks (run and compare)."""
    parser.add_argument("--launcher", choices=LAUNCHERS, default=DEFAULT_LAUNCHER,
                        help="what starts the ranks: mpirun (default) or srun, inside a Slurm allocation (sbatch, "
                             "salloc); run's -n then defaults to the allocation's SLURM_NTASKS")


def ranks_from_allocation(given: int | None, what: str = "-n") -> int:
    """``-n`` as given, or inside a Slurm allocation its task count (SLURM_NTASKS)."""
    import os

    from memdiag._errors import UserError

    if given is not None:
        return given
    tasks = os.environ.get("SLURM_NTASKS", "")
    if tasks.isdigit() and int(tasks) > 0:
        return int(tasks)
    raise UserError(f"give the number of ranks with {what} N (only inside a Slurm allocation does it default to "
                    "SLURM_NTASKS)")
