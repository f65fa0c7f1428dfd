"""What every verb that starts ranks shares: the launch options, stated and checked once.

``memdiag run``, ``compare`` and ``scale`` each hold one :class:`LaunchOptions`; a study changes
what differs per run with :func:`dataclasses.replace`, never by copying fields by name, so an
option given on the command line reaches every run of the study or fails to type-check.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass, field

from memdiag._errors import UserError

SPOOLS = ("shared", "local")
# What starts the ranks: Open MPI's mpirun (the default), or Slurm's srun inside an allocation.
LAUNCHERS = ("mpirun", "srun")
DEFAULT_LAUNCHER = "mpirun"
# --sample-ms: what a rank's sampling thread may be asked (below 1 ms its wakes alone take a good share
# of a core, measured: docs/explanation/overhead.md#the-sampling-thread; above a second, the memory
# limit and the once-a-second flush would wait on it)
MIN_SAMPLE_MS, MAX_SAMPLE_MS = 1.0, 1000.0
# Its default. Every collective's start and end is sampled where the job reaches it (native marks read
# RSS in the graph; Python marks and eager calls when they are made), so the timer's samples are only
# what lies between them: 20 ms. Under --mem-limit the timer is the limit's watchdog: 5 ms.
DEFAULT_SAMPLE_MS, LIMIT_SAMPLE_MS = 20.0, 5.0
# --record-every: at most this long between two drains of the native marks (their ring holds 4,096 marks,
# and is drained early when half full, so a longer wait only risks more records lost with a killed rank)
MAX_RECORD_EVERY_S = 10.0
# Its default: a script's marks made records once a second, kept in a file meanwhile (memdiag.agent.replay), so
# that a rank killed outright still loses at most the step it was in. Not under --mem-limit (its watchdog reads
# every sample as it is taken) nor --spool local (the file would stay on the rank's node): 0 there.
DEFAULT_RECORD_EVERY_S = 1.0


@dataclass(frozen=True)
class LaunchOptions:
    steps: int = 5
    preset: str = "tiny"  # preset of a built-in workload (ignored for a script)
    overrides: Mapping[str, str] = field(default_factory=dict)  # --set KEY=VALUE
    script_args: tuple[str, ...] = ()  # what follows `--` on the command line
    margin: float = 1.0  # auto: densify when gathered bytes exceed dense bytes x margin
    seed: int = 1234
    hosts: str | None = None  # mpirun -H, e.g. node1:4,node2:4
    timeout_s: float | None = None
    mem_limit_bytes: int | None = None  # per rank: a rank passing it is killed, as a batch system does
    spool: str = "shared"  # shared: ranks write into the run directory; local: node-local, sent to rank 0
    memray: bool = False  # a memray tracker (native stacks) in every rank
    horovod_timeline: bool = False  # Horovod's own timeline, written by rank 0
    threads_per_rank: int | None = None  # set TF's thread pools (a script's own are kept otherwise)
    # RSS sampling period of every rank; 0: DEFAULT_SAMPLE_MS, or LIMIT_SAMPLE_MS under a memory limit
    sample_interval_s: float = 0.0
    # Built-in workloads: after --steps, up to this many more steps while any rank's per-step peak
    # has not settled (the last 3 steps within 1% with no trend over the run, memdiag.analyze.steady).
    max_warmup: int = 0
    launcher: str = DEFAULT_LAUNCHER  # one of LAUNCHERS
    # --record-every: native marks turned into records every this many seconds rather than at every sampler
    # wake (0); None: DEFAULT_RECORD_EVERY_S, or 0 under a memory limit or a node-local spool
    record_every_s: float | None = None

    def __post_init__(self) -> None:
        # A copy of its own: a study's runs cannot change each other's options.
        object.__setattr__(self, "overrides", dict(self.overrides))
        object.__setattr__(self, "script_args", tuple(self.script_args))
        if not self.sample_interval_s:
            default = LIMIT_SAMPLE_MS if self.mem_limit_bytes is not None else DEFAULT_SAMPLE_MS
            object.__setattr__(self, "sample_interval_s", default / 1000)
        if self.record_every_s is None:
            batched = self.mem_limit_bytes is None and self.spool == "shared"
            object.__setattr__(self, "record_every_s", DEFAULT_RECORD_EVERY_S if batched else 0.0)

    def validate(self) -> None:
        """Checks that need no target; :func:`memdiag.launch.session.validate` checks the rest."""
        from memdiag.launch import mpirun

        if self.steps < 1:
            raise UserError(f"--steps {self.steps}: run at least 1 step")
        if self.margin <= 0:
            raise UserError(f"--margin {self.margin}: the margin must be a positive factor, e.g. 1.0")
        if self.spool not in SPOOLS:
            raise UserError(f"--spool {self.spool!r}: choose one of {', '.join(SPOOLS)}")
        if self.timeout_s is not None and self.timeout_s <= 0:
            raise UserError(f"--timeout {self.timeout_s}: give a positive number of seconds")
        if self.mem_limit_bytes is not None and self.mem_limit_bytes <= 0:
            raise UserError("--mem-limit must be a positive size, e.g. 1.5G")
        if self.max_warmup < 0:
            raise UserError(f"--max-warmup {self.max_warmup}: give 0 (no warm-up steps) or more")
        if self.threads_per_rank is not None and self.threads_per_rank < 1:
            raise UserError(f"--threads-per-rank {self.threads_per_rank}: give at least 1")
        if not MIN_SAMPLE_MS <= self.sample_interval_s * 1000 <= MAX_SAMPLE_MS:
            raise UserError(f"--sample-ms {self.sample_interval_s * 1000:g}: give {MIN_SAMPLE_MS:g} to "
                            f"{MAX_SAMPLE_MS:g} milliseconds")
        every = self.record_every_s or 0.0
        if not 0 <= every <= MAX_RECORD_EVERY_S:
            raise UserError(f"--record-every {every:g}: give 0 (records at every step) "
                            f"to {MAX_RECORD_EVERY_S:g} seconds")
        if self.launcher not in LAUNCHERS:
            raise UserError(f"--launcher {self.launcher!r}: choose one of {', '.join(LAUNCHERS)}")
        if self.hosts:
            if self.launcher == "srun":
                raise UserError("--hosts is mpirun's host list; under srun the allocation decides where ranks run "
                                "(sbatch/salloc -N, --nodelist): drop --hosts")
            mpirun.parse_hosts(self.hosts)

    @classmethod
    def from_args(cls, args: argparse.Namespace, script_args: list[str]) -> LaunchOptions:
        """The options of :func:`memdiag.commands._args.add_launch_options`, as parsed."""
        return cls(steps=args.steps, preset=args.preset, overrides=dict(args.overrides),
                   script_args=tuple(script_args), margin=args.margin, seed=args.seed, hosts=args.hosts,
                   timeout_s=args.timeout, mem_limit_bytes=args.mem_limit, spool=args.spool,
                   memray=args.memray, horovod_timeline=args.horovod_timeline,
                   threads_per_rank=args.threads_per_rank, max_warmup=args.max_warmup,
                   sample_interval_s=0.0 if args.sample_ms is None else args.sample_ms / 1000,
                   record_every_s=args.record_every,
                   # --launcher is run's and compare's (add_launcher_option), not every verb's
                   launcher=getattr(args, "launcher", None) or DEFAULT_LAUNCHER)


DEFAULTS = LaunchOptions()
