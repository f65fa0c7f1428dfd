"""TensorBoard output: each rank's figures per training step as scalars in TensorBoard's event
files, so memory can be read beside the job's own curves, and the runs of a comparison lie side by
side (docs/reference/outputs.md lists the series).

One memdiag run is one TensorBoard run, named after its directory: ``LOGDIR/<run>/events...``. A
comparison or scaling study writes one TensorBoard run per run directory in it (``n2-sparse``,
``n2-dense``, ...). Every series is named ``<figure>/rank-<R>``, the same in every run, so TensorBoard
draws the modes and rank counts of one rank in one chart. Steps are the script's own (0 on); the
set-up (step -1) is left out. The files are written with TensorBoard's own protocol buffers and
record writer, without importing TensorFlow.
"""

from __future__ import annotations

import glob
import os
import socket
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass

from memdiag._errors import UserError
from memdiag.format.reader import Run, load_run
from memdiag.report.reporter import Refusing, RunResult, StudyResult

MIB = 2**20
DEFAULT_LOGDIR = "tensorboard"  # inside the run or study directory
EVENTS_GLOB = "events.out.tfevents.*"

# The series, by figure: what each holds (docs/reference/outputs.md says the same)
PEAK_RSS = "peak_rss_MiB"  # the step's peak RSS (the largest sample, or the kernel's high-water mark)
END_RSS = "rss_at_step_end_MiB"  # the RSS sampled last in the step
STEP_TIME = "step_time_s"
GATHERED = "gathered_MiB"  # what the step's allgathers received (bytes out)
REDUCED = "reduced_MiB"  # what its allreduces returned
OTHER = "other_collectives_MiB"  # broadcasts, alltoalls, reducescatters (only where a step had one)
GATHERED_BY_TENSOR = "gathered_MiB_by_tensor"  # <figure>/rank-R/<tensor>[/<part>]


@dataclass(frozen=True)
class Point:
    tag: str
    step: int
    value: float
    wall_time: float


def run_points(run: Run) -> Iterator[Point]:
    """Every scalar of one run: per rank and per step (step >= 0), from its step, mem and
    collective records."""
    for rank, records in sorted(run.ranks.items()):
        who = f"rank-{rank}"
        steps = {s["step"]: s for s in records.steps if isinstance(s.get("step"), int) and s["step"] >= 0}
        end_rss = {m["step"]: m["rss_last"] for m in records.memory if "rss_last" in m and m.get("step") in steps}
        by_op: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
        by_tensor: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
        for c in records.collectives:
            step = c.get("step")
            if step not in steps:
                continue
            op, out = c.get("op"), int(c.get("bytes_out") or 0)
            figure = GATHERED if op == "allgather" else REDUCED if op == "allreduce" else OTHER
            by_op[figure][step] += out
            if op == "allgather":
                label = str(c.get("name")) + (f"/{c['part']}" if c.get("part") else "")
                by_tensor[label][step] += out
        for step, record in sorted(steps.items()):
            wall = float(record.get("t_end") or record.get("t") or 0.0)
            if "peak_rss_bytes" in record:
                yield Point(f"{PEAK_RSS}/{who}", step, record["peak_rss_bytes"] / MIB, wall)
            if step in end_rss:
                yield Point(f"{END_RSS}/{who}", step, end_rss[step] / MIB, wall)
            if record.get("step_time_s") is not None:
                yield Point(f"{STEP_TIME}/{who}", step, float(record["step_time_s"]), wall)
            for figure in (GATHERED, REDUCED):
                yield Point(f"{figure}/{who}", step, by_op[figure].get(step, 0) / MIB, wall)
            if step in by_op[OTHER]:
                yield Point(f"{OTHER}/{who}", step, by_op[OTHER][step] / MIB, wall)
            for label in sorted(by_tensor):
                if step in by_tensor[label]:
                    yield Point(f"{GATHERED_BY_TENSOR}/{who}/{label}", step, by_tensor[label][step] / MIB, wall)


@dataclass(frozen=True)
class Written:
    logdir: str
    runs: tuple[str, ...]
    series: int
    points: int


def write_runs(runs: dict[str, Run], logdir: str) -> Written:
    """One TensorBoard run per memdiag run (name -> its records) under ``logdir``. A name that already
    holds event files is refused before anything is written: TensorBoard would merge the two."""
    try:
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.plugins.scalar import metadata
        from tensorboard.summary.writer.record_writer import RecordWriter
        from tensorboard.util import tensor_util
    except ImportError:
        raise UserError("--format tensorboard needs the tensorboard package (TensorFlow installs it): "
                        "pip install tensorboard") from None
    import numpy as np

    taken = [name for name in runs if glob.glob(os.path.join(logdir, name, EVENTS_GLOB))]
    if taken:
        raise UserError(f"{os.path.join(logdir, taken[0])} already holds TensorBoard event files; "
                        "give another --output, or remove it first")
    scalar = metadata.create_summary_metadata(display_name=None, description=None)
    series: set[str] = set()
    points = 0
    for name, run in runs.items():
        by_step: dict[tuple[int, float], list[Point]] = defaultdict(list)
        for p in run_points(run):
            by_step[(p.step, p.wall_time)].append(p)
        directory = os.path.join(logdir, name)
        os.makedirs(directory, exist_ok=True)
        file = os.path.join(directory, f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.{os.getpid()}.memdiag")
        with open(file, "xb") as f:
            writer = RecordWriter(f)
            first = min((wall for _, wall in by_step), default=time.time())
            writer.write(event_pb2.Event(wall_time=first, file_version="brain.Event:2").SerializeToString())
            for (step, wall), group in sorted(by_step.items()):
                summary = summary_pb2.Summary()
                for p in group:
                    summary.value.add(tag=p.tag, metadata=scalar, tensor=tensor_util.make_tensor_proto(np.float32(p.value)))
                    series.add(f"{name}\0{p.tag}")
                points += len(group)
                writer.write(event_pb2.Event(wall_time=wall, step=step, summary=summary).SerializeToString())
    return Written(logdir, tuple(runs), len(series), points)


class TensorBoardReporter(Refusing):
    name = "tensorboard"
    output_help = "the TensorBoard log directory (default DIR/tensorboard)"

    def run(self, result: RunResult, output: str | None) -> None:
        name = os.path.basename(os.path.normpath(result.path))
        _say(write_runs({name: result.run}, output or os.path.join(result.path, DEFAULT_LOGDIR)))

    def study(self, result: StudyResult, output: str | None) -> None:
        paths = result.run_paths
        if not paths:
            raise UserError(f"{result.path} holds no run directories to write")
        runs = {os.path.basename(p): load_run(p) for p in paths}
        _say(write_runs(runs, output or os.path.join(result.path, DEFAULT_LOGDIR)))


def _say(written: Written) -> None:
    print(f"wrote {written.logdir}: {len(written.runs)} TensorBoard run(s) ({', '.join(written.runs)}), "
          f"{written.series} series, {written.points} points")
    print(f"view them with: tensorboard --logdir {written.logdir}")
