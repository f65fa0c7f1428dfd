"""The steps of ``summary.json`` (``steps_detail``, ``consistency``): each step across the ranks.

Per step: the mean loss, the slowest rank's time, the highest peak, and whether the parameters agree.
"""

from __future__ import annotations

import statistics
from collections import defaultdict

from memdiag.analyze.rank_summary import training_steps
from memdiag.format.reader import Run
from memdiag.format.records import StepRecord
from memdiag.format.results import Consistency, StepDetail


def step_summary(run: Run) -> tuple[list[StepDetail], Consistency]:
    """Per step across ranks: loss, slowest rank, highest peak, and whether parameters agree."""
    by_step: dict[int, list[StepRecord]] = defaultdict(list)
    for records in run.ranks.values():
        for s in training_steps(records):
            by_step[s["step"]].append(s)
    rows: list[StepDetail] = []
    mismatched: list[int] = []
    checked = 0
    for step in sorted(by_step):
        entries = by_step[step]
        digests = {e["param_digest"] for e in entries if "param_digest" in e}
        identical = None
        if digests and len(entries) == len(run.ranks):
            checked += 1
            identical = len(digests) == 1
            if not identical:
                mismatched.append(step)
        losses = [e["loss"] for e in entries if e.get("loss") is not None]
        rows.append({
            "step": step,
            "loss_mean": statistics.fmean(losses) if losses else None,
            "step_time_s_max": max(e["step_time_s"] for e in entries),
            "peak_rss_bytes_max": max(e["peak_rss_bytes"] for e in entries),
            "params_identical_across_ranks": identical,
        })
    consistency: Consistency = {"checked_steps": checked, "ranks_identical": not mismatched if checked else None,
                   "mismatched_steps": mismatched}
    return rows, consistency
