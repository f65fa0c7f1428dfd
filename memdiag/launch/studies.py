"""Studies made of several runs: ``memdiag compare`` (modes x rank counts, on one engine or both) and
``memdiag scale`` (rank counts, weak or strong).

A study holds one :class:`LaunchOptions` and derives each run's request from it with
:func:`dataclasses.replace`; every run is an ordinary ``memdiag run`` directory inside the study's
directory. Every run is checked before the first directory is made. What the runs show together is
worked out in :mod:`memdiag.analyze.compare` (:mod:`memdiag.analyze.engines` with both engines) and
:mod:`memdiag.analyze.scaling`.

``compare --engine both`` runs each (engine, rank count, mode) of a built-in workload, interleaved
as repeats are; the verification run (a reduction check) is one per engine: ``verify-nN`` (Horovod),
``tfd-verify-nN`` (MultiWorkerMirroredStrategy).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from memdiag._errors import UserError
from memdiag.agentconfig import ENGINES, HOROVOD, TF_DISTRIBUTE
from memdiag.analyze import compare as comparison
from memdiag.analyze import scaling
from memdiag.analyze.correctness import rank_order_candidates
from memdiag.analyze.engines import build_engines
from memdiag.format import rundir
from memdiag.format.results import Comparison, EnginesComparison, ScaleResult, Study
from memdiag.launch.options import LaunchOptions
from memdiag.launch.session import RunRequest, execute, is_script, label, validate
from memdiag.policy import AS_WRITTEN
from memdiag.workloads import check as check_workload
from memdiag.workloads import configs

# The preset setting that holds each built-in workload's per-rank batch (items per step).
PER_RANK_BATCH = {"transformer": "tokens_per_rank", "mixed": "tokens_per_rank", "resnet50": "batch_per_rank"}

# done of planned, the time taken and rich's estimate of the time left (from the pace so far)
_COLUMNS = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TextColumn("left"), TimeRemainingColumn())


def _progress(progress: Progress, task: TaskID) -> Callable[[int], None]:
    """Tell ``task`` how many steps rank 0 has finished."""
    return lambda done: progress.update(task, completed=done)


# -- memdiag compare ---------------------------------------------------------------------------------

BOTH = "both"  # compare --engine both: Horovod and MultiWorkerMirroredStrategy side by side
COMPARE_ENGINES = (*ENGINES, BOTH)
# Modes both engines run on a built-in workload (dedup is Horovod's alone, as-written is for scripts).
BOTH_MODES = ("sparse", "dense", "auto")


def default_modes(engine: str) -> list[str]:
    """The modes a comparison runs without --modes: with both engines, the two that change the most."""
    return ["sparse", "dense"] if engine == BOTH else ["sparse", "dense", "auto"]


@dataclass(frozen=True)
class CompareRequest:
    target: str
    rank_counts: list[int]
    modes: list[str]
    options: LaunchOptions = field(default_factory=LaunchOptions)
    out: str | None = None
    force: bool = False
    repeats: int = 1  # runs of each configuration, interleaved: the run-to-run spread is the noise
    fault: str | None = None  # injected on purpose by tests of the verification
    engine: str = HOROVOD  # one of COMPARE_ENGINES

    @property
    def engines(self) -> list[str]:
        """The engines whose runs are made, the reference (Horovod) first."""
        return list(ENGINES) if self.engine == BOTH else [self.engine]

    def check(self) -> None:
        """What a comparison needs beyond what each of its runs does (:func:`validate`)."""
        if self.engine not in COMPARE_ENGINES:
            raise UserError(f"--engine {self.engine!r}: choose one of {', '.join(COMPARE_ENGINES)}")
        if self.engine != BOTH:
            return
        if is_script(self.target):
            raise UserError(f"--engine {BOTH} compares a built-in workload (transformer, mixed): a script is "
                            f"written for one engine; compare {self.target} with --engine {HOROVOD} or "
                            f"--engine {TF_DISTRIBUTE}")
        other = [m for m in self.modes if m not in BOTH_MODES]
        if other:
            raise UserError(f"--engine {BOTH} runs modes both engines have ({', '.join(BOTH_MODES)}), not "
                            f"{', '.join(other)}; for {other[0]} use --engine {HOROVOD}")

    def run_request(self, world_size: int, mode: str, out: str, engine: str = HOROVOD) -> RunRequest:
        return RunRequest(self.target, world_size, mode, self.options, out=out, fault=self.fault, engine=engine,
                          fingerprint_gradients=True)

    def check_request(self, world_size: int, out: str, engine: str = HOROVOD) -> RunRequest:
        """The verification run: every IndexedSlices gradient reduced both ways and compared, one step.
        Not a measured run (it reduces twice on purpose), so no memory limit and no memray. Each
        engine's hooks make their own: Horovod's compare the allgather with the dense allreduce and the
        merged allgather, MultiWorkerMirroredStrategy's its padded gather with its dense all-reduce."""
        options = replace(self.options, steps=1, memray=False, mem_limit_bytes=None, max_warmup=0)
        # A script runs as written (its op, compression, process set).
        mode = AS_WRITTEN if is_script(self.target) else "sparse"
        return RunRequest(self.target, world_size, mode, options, out=out, fault=self.fault, check_reduction=True,
                          engine=engine, fingerprint_gradients=True)


def run_compare(request: CompareRequest, console: Console) -> Comparison | EnginesComparison:
    # Everything is checked before the first directory is made.
    request.check()
    for engine in request.engines:
        for n in request.rank_counts:
            for mode in request.modes:
                validate(request.run_request(n, mode, out="", engine=engine))
    out = request.out or rundir.new_dir_name(f"compare-{label(request.target)}")
    rundir.prepare(out, request.force)
    # Every configuration once, then again: a drift in the machine's load falls on all of them. The
    # engines alternate at each rank count, so that a drift falls on both alike.
    runs = [(r, n, engine, mode) for r in range(request.repeats) for n in request.rank_counts
            for engine in request.engines for mode in request.modes]
    verify_n = min((n for n in request.rank_counts if n > 1), default=None)
    run_dirs: dict[str, dict[tuple[int, str], list[str]]] = {engine: {} for engine in request.engines}
    verify_dirs: dict[str, str] = {}
    steps = None if is_script(request.target) else request.options.steps  # a script runs the steps it runs
    named = request.engine == BOTH
    with Progress(*_COLUMNS, console=console, transient=True) as progress:
        overall = progress.add_task("comparison", total=len(runs))
        for r, n, engine, mode in runs:
            what = f"{engine} N={n} {mode}" if named else f"N={n} {mode}"
            task = progress.add_task(f"  {what}: steps", total=steps)
            run_out = os.path.join(out, rundir.compare_run_name(n, mode, r, engine == TF_DISTRIBUTE))
            run_dirs[engine].setdefault((n, mode), []).append(
                execute(request.run_request(n, mode, run_out, engine), on_steps=_progress(progress, task)))
            progress.remove_task(task)
            progress.advance(overall)
            console.print(f"  finished {what}" + (f" (repeat {r + 1})" if request.repeats > 1 else ""),
                          highlight=False)
        # A separate short run per engine, kept apart so that its extra collectives never touch the
        # measured runs.
        for engine in request.engines if verify_n is not None else []:
            assert verify_n is not None
            progress.update(overall, description=f"{engine} reduction check at N={verify_n}" if named else
                            f"reduction check at N={verify_n}")
            run_out = os.path.join(out, rundir.verify_run_name(verify_n, engine == TF_DISTRIBUTE))
            verify_dirs[engine] = execute(request.check_request(verify_n, run_out, engine))
        order_dirs = {engine: _rank_order_runs(request, out, engine, run_dirs[engine], progress, overall, console)
                      for engine in request.engines if engine == HOROVOD}
    preset = None if is_script(request.target) else request.options.preset
    def what_was_compared(result: Comparison | EnginesComparison) -> None:
        result.update({"rank_counts": request.rank_counts, "modes": request.modes, "steps": steps,
                       "repeats": request.repeats, "directory": out})

    result: Comparison | EnginesComparison
    if request.engine == BOTH:
        result = build_engines(label(request.target), preset, run_dirs, verify_dirs, order_dirs)
        for each in result["engines"].values():
            what_was_compared(each)
    else:
        [engine] = request.engines
        result = comparison.build(label(request.target), preset, run_dirs[engine], verify_dirs.get(engine),
                                  order_dirs.get(engine))
        if engine != HOROVOD:
            result["engine"] = engine  # Horovod's compare.json stays as it was before engines
    what_was_compared(result)
    rundir.write_comparison(out, result)
    return result


def _rank_order_runs(request: CompareRequest, out: str, engine: str, runs: dict[tuple[int, str], list[str]],
                     progress: Progress, overall: TaskID, console: Console) -> dict[tuple[int, str], str]:
    """Where a densifying mode's final parameters fail the check against sparse, that mode again at
    that rank count, with Open MPI's allreduce summing in rank order (as the allgather path sums), so
    that the comparison can tell summation order's rounding from a wrong reduction
    (:func:`memdiag.analyze.correctness.rank_order_check`). A verification run: not measured, not in the
    table. Horovod over MPI only: MultiWorkerMirroredStrategy's all-reduce is its own."""
    firsts = {key: paths[0] for key, paths in runs.items()}
    shared = rank_order_candidates(firsts)
    made: dict[tuple[int, str], str] = {}
    for (n, mode), owner in shared.items():
        if owner in made:
            made[(n, mode)] = made[owner]
            continue
        progress.update(overall, description=f"N={n} {mode} again, MPI's allreduce in rank order")
        console.print(f"  N={n} {mode}: parameters beyond the tolerance against sparse; running it again with "
                      "MPI's allreduce summing in rank order", highlight=False)
        options = replace(request.options, memray=False, mem_limit_bytes=None, max_warmup=0)
        rerun = replace(request.run_request(n, mode, os.path.join(out, rundir.order_run_name(n, mode)), engine),
                        options=options, rank_order_allreduce=True)
        made[(n, mode)] = execute(rerun)
    return made


# -- memdiag scale -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class ScaleRequest:
    target: str
    rank_counts: list[int]
    scaling: str  # "weak": same batch per rank; "strong": same global batch divided among the ranks
    mode: str = "sparse"
    options: LaunchOptions = field(default_factory=LaunchOptions)
    out: str | None = None
    force: bool = False

    @property
    def is_script(self) -> bool:
        return is_script(self.target)

    @property
    def label(self) -> str:
        return label(self.target)

    def batch_overrides(self, world_size: int) -> dict[str, str]:
        """The preset settings for one rank count: strong scaling divides the global batch by N."""
        overrides = dict(self.options.overrides)
        if self.scaling == "weak":
            return overrides
        if self.is_script or self.label not in PER_RANK_BATCH:
            raise UserError(f"--strong needs a built-in workload ({', '.join(PER_RANK_BATCH)}); for a script, "
                            "run --weak and pass the per-rank batch yourself")
        check_workload(self.label, self.options.preset)
        key = PER_RANK_BATCH[self.label]
        config = configs.with_overrides(configs.PRESETS[self.label][self.options.preset], overrides)
        total = getattr(config, key)
        per_rank = total // world_size
        if key == "tokens_per_rank":
            # Whole sequences only, so that the tokens counted are the tokens trained on.
            per_rank -= per_rank % config.seq_len
        if per_rank < 1:
            raise UserError(f"--strong: a global batch of {total} ({key}) leaves nothing for each of "
                            f"{world_size} ranks; raise it with --set {key}=... or use fewer ranks")
        return {**overrides, key: str(per_rank)}

    def run_request(self, world_size: int, overrides: dict[str, str], out: str) -> RunRequest:
        # Time in collectives is read from Horovod's timeline: always recorded in a scaling study.
        options = replace(self.options, overrides=overrides, horovod_timeline=True)
        return RunRequest(self.target, world_size, self.mode, options, out=out)


def run_scale(request: ScaleRequest, projection: scaling.ProjectionRequest | None,
              console: Console) -> ScaleResult:
    """Run every rank count, write scale.json and return it."""
    if len(set(request.rank_counts)) != len(request.rank_counts):
        raise UserError(f"--ranks {','.join(map(str, request.rank_counts))}: give each rank count once")
    rank_counts = sorted(request.rank_counts)
    # Everything is checked before the first directory is made.
    plans = {n: request.batch_overrides(n) for n in rank_counts}
    for n in rank_counts:
        validate(request.run_request(n, plans[n], out=""))
    out = request.out or rundir.new_dir_name(f"scale-{request.label}-{request.scaling}")
    rundir.prepare(out, request.force)
    run_dirs: dict[int, str] = {}
    with Progress(*_COLUMNS, console=console, transient=True) as progress:
        overall = progress.add_task(f"{request.scaling} scaling", total=len(rank_counts))
        for n in rank_counts:
            task = progress.add_task(f"  N={n}: steps", total=request.options.steps)
            run_dirs[n] = execute(request.run_request(n, plans[n], os.path.join(out, f"n{n}")),
                                  on_steps=_progress(progress, task))
            progress.remove_task(task)
            progress.advance(overall)
            console.print(f"  finished N={n}", highlight=False)
    study: Study = {
        "workload": request.label,
        "preset": None if request.is_script else request.options.preset,
        "scaling": request.scaling,
        "mode": request.mode,
        "steps": request.options.steps,
        "rank_counts": rank_counts,
        "hosts": request.options.hosts,
        "overrides": dict(request.options.overrides),
        "batch_overrides": {str(n): plans[n] for n in rank_counts},
        "mem_limit_bytes": request.options.mem_limit_bytes,
    }
    result = scaling.build_result(study, run_dirs, projection)
    result["directory"] = out
    rundir.write_json(os.path.join(out, rundir.SCALE_FILE), result)
    return result
