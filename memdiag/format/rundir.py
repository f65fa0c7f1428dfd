"""The run directory: every file name in it, what kind of directory it is, and how it is written and read.

Three kinds of directory, each named by the file that makes it what it is:

- a run (``run.json``): one ``memdiag run``; ranks write ``rank-K.jsonl`` (records, docs/reference/records.md),
  ``rank-K.memray.bin`` with ``--memray``, and while a script's rank runs, ``rank-K.marks.bin`` and
  ``rank-K.marks.keys`` (deleted when it ends; replayed into its records when it was killed outright);
  rank 0 writes ``params.npz`` and, with a timeline, ``horovod-timeline.json``; the launcher writes
  ``mpirun.log`` and, at the end, ``summary.json``;
- a comparison (``compare.json``): one run directory per mode, rank count and repeat
  (:func:`compare_run_name`; MultiWorkerMirroredStrategy's runs prefixed ``tfd-``), plus the verification
  runs ``verify-nN`` and ``tfd-verify-nN`` (:func:`verify_run_name`) and, where a parameter check
  failed, ``verify-order-nN-MODE`` (:func:`order_run_name`);
- a scaling study (``scale.json``): one run directory per rank count.

JSON results are written atomically (a temporary file, then a rename), so a reader never sees half a
file and an interrupted write leaves the previous one. Records are streamed by the ranks and read by
:mod:`memdiag.format.reader`; Horovod's own timeline is read here, with one recovery rule for a file left
unterminated by a rank that was killed.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
import shutil
from dataclasses import dataclass, field
from typing import Any, cast

from memdiag._errors import UserError
from memdiag.format.layout import upgrade_policy
from memdiag.format.results import Comparison, EnginesComparison, RunSummary

RUN_MANIFEST = "run.json"
SUMMARY = "summary.json"
COMPARE_FILE = "compare.json"
SCALE_FILE = "scale.json"
HOROVOD_TIMELINE = "horovod-timeline.json"
MPIRUN_LOG = "mpirun.log"
PARAMETERS = "params.npz"  # rank 0's trained parameters, for the correctness check
INITIAL_PARAMETERS = "params_initial.npz"  # rank 0's parameters before the first update (their movement)
RANK_FILE = re.compile(r"rank-(\d+)\.jsonl$")
RANK_GLOB = "rank-*.jsonl"
MEMRAY_SUFFIX = ".memray.bin"
MEMRAY_GLOB = "rank-*" + MEMRAY_SUFFIX
MEMRAY_FILE = re.compile(r"rank-(\d+)" + re.escape(MEMRAY_SUFFIX) + "$")

RUN, COMPARISON, SCALE = "run", "comparison", "scale"


def rank_file(rank: int) -> str:
    return f"rank-{rank}.jsonl"


def marks_file(rank: int) -> str:
    """A script's rank's native marks and samples, kept in a file while it runs (memdiag.agent.replay)."""
    return f"rank-{rank}.marks.bin"


def keys_file(rank: int) -> str:
    """What each of those marks' keys stands for (memdiag.agent.replay)."""
    return f"rank-{rank}.marks.keys"


def memray_file(rank: int) -> str:
    return f"rank-{rank}{MEMRAY_SUFFIX}"


def compare_run_name(world_size: int, mode: str, repeat: int = 0, tf_distribute: bool = False) -> str:
    """A comparison's run directory: ``n{N}-{mode}``, ``-r{R}`` from the second repeat on; a run of
    MultiWorkerMirroredStrategy (``--engine tf-distribute``) is ``tfd-n{N}-{mode}``, so the engine shows."""
    return ("tfd-" if tf_distribute else "") + f"n{world_size}-{mode}" + (f"-r{repeat + 1}" if repeat else "")


def verify_run_name(world_size: int, tf_distribute: bool = False) -> str:
    """A comparison's verification run (the reduction check): ``verify-n{N}``, or for
    MultiWorkerMirroredStrategy ``tfd-verify-n{N}``."""
    return ("tfd-" if tf_distribute else "") + f"verify-n{world_size}"


def order_run_name(world_size: int, mode: str) -> str:
    """A comparison's second look at a failed parameter check: ``mode`` at ``world_size`` again, with
    MPI's allreduce summing in rank order (``verify-order-n{N}-{mode}``, a verification run)."""
    return f"verify-order-n{world_size}-{mode}"


def is_verify_run(name: str) -> bool:
    """Whether a directory name inside a comparison is a verification run (not a measured one)."""
    return name.removeprefix("tfd-").startswith("verify")


def kind(path: str) -> str | None:
    """``comparison``, ``scale``, ``run``, or None for a directory memdiag did not write."""
    for name, what in ((COMPARE_FILE, COMPARISON), (SCALE_FILE, SCALE), (RUN_MANIFEST, RUN)):
        if os.path.isfile(os.path.join(path, name)):
            return what
    return None


def runs_of(path: str) -> list[str]:
    """The measured run directories inside a comparison or scaling study (verification runs left out),
    or ``[path]`` for a run directory."""
    if kind(path) == RUN:
        return [path]
    return [os.path.join(path, d) for d in sorted(os.listdir(path))
            if kind(os.path.join(path, d)) == RUN and not is_verify_run(d)]


def new_dir_name(label: str) -> str:
    """``runs/LABEL-TIME``, with a counter when that exists already."""
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    base = os.path.join("runs", f"{label}-{stamp}")
    path, k = base, 1
    while os.path.exists(path):
        k += 1
        path = f"{base}-{k}"
    return path


def prepare(path: str, force: bool) -> None:
    """Create the directory; never overwrite an existing one unless asked to."""
    if os.path.exists(path):
        if not os.path.isdir(path):
            raise UserError(f"--out {path} exists and is not a directory; choose another path")
        if os.listdir(path):
            if not force:
                raise UserError(f"--out {path} already exists; choose another path or add --force to replace it")
            shutil.rmtree(path)
    try:
        os.makedirs(path, exist_ok=True)
        probe = os.path.join(path, ".write-test")
        with open(probe, "w") as f:
            f.write("")
        os.remove(probe)
    except OSError as exc:
        raise UserError(f"cannot write to --out {path} ({exc.strerror}); choose a writable directory") from None


def write_json(path: str, value: Any, indent: int | None = 2) -> None:
    """Write ``value`` as JSON atomically: readers see the old file or the new one, never a part."""
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(value, f, indent=indent, default=str, separators=None if indent else (",", ":"))
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


# compare.json's format: 2 names a row's peak for what it is, steady_peak_rss_bytes_median (the largest
# rank's steady peak, the median over the row's repeats), and a merged tensor's rows rows_largest_rank;
# 1 (no "format" field) called them peak_rss_bytes_max, the name summary.json gives the overall peak, and
# rows_per_rank, the name a policy record gave a rank's own or the agreed rows. read_comparison reads both.
COMPARE_FORMAT = 2
_OLD_ROW_PEAK, _ROW_PEAK = "peak_rss_bytes_max", "steady_peak_rss_bytes_median"


def read_comparison(path: str) -> Comparison | EnginesComparison:
    """A comparison directory's ``compare.json`` in the current format (an older one converted)."""
    result, _ = _read_versioned(os.path.join(path, COMPARE_FILE), "a comparison's result", COMPARE_FORMAT)
    return cast("Comparison | EnginesComparison", upgrade_comparison(result))


def _read_versioned(file: str, what: str, newest: int) -> tuple[dict[str, Any], int]:
    """A JSON object with a ``format`` field (absent: 1) and its format; one that is not an object, or of
    a format after ``newest``, is a one-line error."""
    value = read_json(file)
    if not isinstance(value, dict):
        raise UserError(f"{file} is not {what}; the directory is damaged")
    version = value.get("format", 1)
    if not isinstance(version, int) or not 1 <= version <= newest:
        raise UserError(f"{file} has format {version!r}, which this memdiag does not know; "
                        f"read it with the memdiag that wrote it (this one reads formats 1-{newest})")
    return value, version


# summary.json's format: 2 gives a policy entry's rows as agreed_rows and local_rows; 1 (no "format" field)
# gave rows_per_rank, the agreed rows in auto and a rank's own elsewhere. read_summary reads both.
SUMMARY_FORMAT = 2


def read_summary(run_dir: str) -> RunSummary:
    """A run directory's ``summary.json`` in the current format (an older one converted)."""
    summary, version = _read_versioned(os.path.join(run_dir, SUMMARY), "a run's summary", SUMMARY_FORMAT)
    if version < 2:
        policies = summary.get("policy")
        for entry in policies if isinstance(policies, list) else []:
            if isinstance(entry, dict):
                upgrade_policy(entry)
    summary["format"] = SUMMARY_FORMAT
    return cast(RunSummary, summary)


def write_comparison(path: str, result: Comparison | EnginesComparison) -> None:
    """A comparison's result as its directory's ``compare.json``, in the current format."""
    result["format"] = COMPARE_FORMAT
    write_json(os.path.join(path, COMPARE_FILE), result)


def upgrade_comparison(result: dict[str, Any]) -> dict[str, Any]:
    """A ``compare.json`` of format 1 as format 2 (in place): its rows' peak renamed, in every engine's
    comparison too, and its merged tensors' rows. A result of the current format is returned as it is."""
    if result.get("format", 1) < 2:
        parts = [result, *(each for each in (result.get("engines") or {}).values() if isinstance(each, dict))]
        for part in parts:
            for row in [*(part.get("rows") or []), *(part.get("side_by_side") or [])]:
                if isinstance(row, dict) and _OLD_ROW_PEAK in row and _ROW_PEAK not in row:
                    row[_ROW_PEAK] = row.pop(_OLD_ROW_PEAK)
            for tensor in part.get("tensors") or []:
                dedup = tensor.get("dedup") if isinstance(tensor, dict) else None
                if isinstance(dedup, dict) and "rows_per_rank" in dedup:
                    dedup["rows_largest_rank"] = dedup.pop("rows_per_rank")
    result["format"] = COMPARE_FORMAT
    return result


def read_json(path: str) -> Any:
    """A JSON file of a run directory; a missing or damaged one is a one-line error."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise UserError(f"{path} is missing; the directory is incomplete or was not written by memdiag") from None
    except OSError as exc:
        raise UserError(f"cannot read {path} ({exc.strerror})") from None
    except (ValueError, UnicodeDecodeError):
        raise UserError(f"{path} is not valid JSON; the directory is damaged") from None


# -- Horovod's timeline ------------------------------------------------------------------------------

def wait_for_timeline_writer(path: str, quiet_s: float = 0.5, limit_s: float = 10.0) -> None:
    """Wait until Horovod's timeline at ``path`` has not grown for ``quiet_s`` (at most ``limit_s``).

    Horovod 0.28.1 writes its timeline from a queue in a thread of its own, and its shutdown stops
    that thread without draining the queue (``TimelineWriter::Shutdown`` in horovod/common/timeline.cc),
    so on a loaded host a run's last step can be missing from the file unless the process waits here
    before Horovod shuts down. A missing file counts as not growing.
    """
    import time

    deadline, last, quiet_since = time.monotonic() + limit_s, -1, time.monotonic()
    while time.monotonic() < deadline:
        size = os.path.getsize(path) if os.path.exists(path) else 0
        if size != last:
            last, quiet_since = size, time.monotonic()
        elif time.monotonic() - quiet_since >= quiet_s:
            return
        time.sleep(0.05)


@dataclass
class Timeline:
    """Horovod's Chrome-trace timeline, read as far as it goes."""

    events: list[dict[str, Any]] = field(default_factory=list)
    complete: bool = True  # False: the array was never closed (Horovod still running, or a rank killed)
    start_us: float | None = None  # wall-clock microseconds of Horovod's ts = 0, when the file says


def parse_timeline(text: str) -> Timeline:
    """Horovod writes its timeline incrementally: a JSON array that lacks its closing bracket until
    Horovod shuts down, and whose last event can be cut short. Keep every complete event."""
    decoder = json.JSONDecoder()
    timeline = Timeline(complete=False)
    i = len(text) - len(text.lstrip())
    if text[i:i + 1] != "[":
        return timeline
    i += 1
    while i < len(text):
        while i < len(text) and text[i] in " \t\r\n,":
            i += 1
        if i >= len(text):
            break
        if text[i] == "]":
            timeline.complete = True
            break
        try:
            event, i = decoder.raw_decode(text, i)
        except ValueError:
            break
        if isinstance(event, dict):
            timeline.events.append(event)
    for event in timeline.events:
        start = (event.get("args") or {}).get("start_time_since_epoch_in_micros") if event.get("ph") == "M" else None
        if isinstance(start, (int, float)):
            timeline.start_us = float(start)
            break
    return timeline


def read_timeline(path: str) -> Timeline | None:
    """The timeline at ``path``; None when there is none."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return parse_timeline(f.read())
    except OSError:
        return None
