"""What `memdiag run` shows while the job runs: each rank's steps, memory and peak, read from the record
files as they grow."""

from __future__ import annotations

import io
import json

from rich.console import Console

from memdiag.commands import _live
from memdiag.commands import run as run_command
from memdiag.launch.session import RankProgress, StepWatcher, progress_line

MiB = 2**20


def _line(record: dict) -> str:
    return json.dumps(record, separators=(",", ":")) + "\n"


def test_the_watcher_follows_a_growing_rank_file_and_ignores_the_set_up_step_and_a_half_written_line(tmp_path):
    path = tmp_path / "rank-0.jsonl"
    watcher = StepWatcher(str(path))
    # GIVEN no file yet
    assert watcher.poll() == 0 and watcher.progress == RankProgress()
    # WHEN the set-up step and step 0 are written, and step 1's record only in part
    with open(path, "w", encoding="utf-8") as f:
        f.write(_line({"type": "step", "step": -1, "peak_rss_bytes": 900 * MiB}))
        f.write(_line({"type": "mem", "step": -1, "rss_last": 850 * MiB}))
        f.write(_line({"type": "step", "step": 0, "peak_rss_bytes": 500 * MiB}))
        f.write(_line({"type": "mem", "step": 0, "rss_last": 400 * MiB}))
        step_1 = _line({"type": "step", "step": 1, "peak_rss_bytes": 700 * MiB})
        f.write(step_1[:20])
    # THEN one step is finished, with step 0's figures (the set-up step's are not a training step's)
    assert watcher.poll() == 1
    assert watcher.progress == RankProgress(steps=1, rss_bytes=400 * MiB, peak_bytes=500 * MiB)
    # AND when the line is completed, and step 2 peaks lower, the peak stays the largest so far
    with open(path, "a", encoding="utf-8") as f:
        f.write(step_1[20:])
        f.write(_line({"type": "mem", "step": 1, "rss_last": 650 * MiB}))
        f.write(_line({"type": "step", "step": 2, "peak_rss_bytes": 600 * MiB}))
    assert watcher.poll() == 3
    assert watcher.progress == RankProgress(steps=3, rss_bytes=650 * MiB, peak_bytes=700 * MiB)


def test_the_line_names_each_of_a_few_ranks_and_summarises_many():
    few = progress_line("running x", 83.9, [RankProgress(4, 400 * MiB, 500 * MiB), RankProgress()])
    assert few.startswith("running x · 1:23 · rank 0: 4 steps, ")
    assert "rank 1: starting" in few
    many = progress_line("running x", 5, [RankProgress(3, MiB, 10 * MiB)] * 5 + [RankProgress(2, MiB, 30 * MiB)])
    assert "steps 2-3 done" in many and "(rank 5)" in many and "rank 0:" not in many


def test_without_a_terminal_a_line_is_printed_only_after_the_interval_and_when_a_rank_moved_on(monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr("time.monotonic", lambda: clock[0])
    out = io.StringIO()
    console = Console(file=out, force_terminal=False)
    show = _live.live_display("running x", None, console)
    show([RankProgress(1, MiB, MiB)])  # too soon
    clock[0] += _live.PLAIN_PROGRESS_EVERY_S
    show([RankProgress(2, MiB, MiB)])  # printed
    clock[0] += _live.PLAIN_PROGRESS_EVERY_S
    show([RankProgress(2, MiB, MiB)])  # no rank moved on
    lines = out.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].startswith("running x · 0:30 · rank 0: 2 steps")


def test_a_failed_runs_log_tail_leads_with_sshs_own_error_from_the_top_of_the_log(tmp_path):
    # GIVEN an mpirun.log whose ssh error sits above OpenMPI's long message about daemons
    log = ["ssh: Could not resolve hostname node1: Name or service not known",
           *[f"ORTE line {i}" for i in range(40)]]
    (tmp_path / "mpirun.log").write_text("\n".join(log) + "\n")
    out = io.StringIO()
    run_command._print_log_tail(str(tmp_path), Console(file=out, width=200), lines=15)
    printed = out.getvalue().splitlines()
    # THEN ssh's line comes first, then the last 15 lines
    assert printed[1] == log[0] and printed[-1] == "ORTE line 39" and "ORTE line 24" not in printed
