"""``summary.json``: one run's records reduced to per-rank and per-tensor figures.

The entry point, :func:`summarize`, puts a :class:`RunSummary` together from the parts' modules:
:mod:`memdiag.analyze.rank_summary` (one rank's figures), :mod:`memdiag.analyze.live_bytes` (the collective
outputs alive at once per step), :mod:`memdiag.analyze.collective_table` (one entry per tensor),
:mod:`memdiag.analyze.rows` (each IndexedSlices gradient's rows), :mod:`memdiag.analyze.padding`
(tf-distribute's zero rows) and :mod:`memdiag.analyze.steps` (per step across ranks).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Mapping
from typing import Any, cast

from memdiag.analyze.attribution import summary_entry as attribution_entry
from memdiag.analyze.collective_table import collective_log, collective_summary
from memdiag.analyze.failure import diagnose
from memdiag.analyze.live_bytes import live_steps
from memdiag.analyze.mode_applied import mode_applied, not_applied_reasons
from memdiag.analyze.padding import padding_summary
from memdiag.analyze.rank_summary import rank_summary, training_steps
from memdiag.analyze.rows import distinct_rows_summary, gradient_rows
from memdiag.analyze.steps import step_summary
from memdiag.format import rundir
from memdiag.format.reader import Run
from memdiag.format.records import FirstGradient
from memdiag.format.results import PolicySummary, RunSummary


def summarize(run: Run) -> RunSummary:
    m = run.manifest
    lives = {r: live_steps(collective_log(run.ranks[r].collectives)) for r in sorted(run.ranks)}
    ranks = [rank_summary(run.ranks[r], lives[r][0]) for r in sorted(run.ranks)]
    steps, consistency = step_summary(run)
    items = [s["items"] for r in run.ranks.values() for s in training_steps(r) if s.get("items")]
    step_times = [r["step_time_s"] for r in ranks if r["step_time_s"]]
    throughput = None
    if items and step_times:
        throughput = len(ranks) * statistics.median(items) / max(step_times)
    policy: dict[str, PolicySummary] = {}
    every_rank: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for records in run.ranks.values():
        seen: set[str] = set()
        for p in records.policies:
            entry = policy.setdefault(p["name"], cast(PolicySummary, {k: v for k, v in p.items()
                                                                      if k not in ("type", "rank", "t", "step")}))
            if p.get("optimizer_input") and "optimizer_input" not in entry:
                # auto: a later record says the optimizer took the gathered rows dense (memdiag.optimizer_input)
                entry.update({"optimizer_input": p["optimizer_input"], "optimizer": p.get("optimizer") or "",
                              "reason": p["reason"]})
            if p["name"] not in seen:
                seen.add(p["name"])
                every_rank[p["name"]].append({**p, "rank": records.rank})
    # One rank's record is not the job's: rows differ between ranks outside auto (gradient_rows).
    for name, found in gradient_rows(run, every_rank).items():
        entry = policy[name]
        entry.update(found)
        rows, row_bytes, index_bytes = entry.get("rows_gathered"), entry.get("row_bytes"), entry.get("index_bytes")
        entry["formula_gathered_bytes"] = None if rows is None or row_bytes is None or index_bytes is None \
            else rows * (row_bytes + index_bytes)
    collectives = collective_summary(run)
    for name, entry in policy.items():
        # The reduce op decides what a gathered byte costs (Average adds one quotient at a time, Sum none).
        entry["reduce_op"] = next((c["reduce_op"] for c in collectives if c["name"] == name and c["reduce_op"]),
                                  "average")
    peaks = [r["peak_rss_bytes"] for r in ranks if r["peak_rss_bytes"]]
    steady = [r for r in ranks if r.get("steady_peak_rss_bytes")]
    top = max(steady, key=lambda r: r["steady_peak_rss_bytes"] or 0, default=None)
    by_name: list[Mapping[str, Any]] = list(ranks)  # read by a field's name

    def largest(key: str) -> int | None:
        values = [r[key] for r in by_name if r.get(key) is not None]
        return max(values) if values else None
    checks = [c for records in run.ranks.values() for c in records.reduction_checks]
    choices: list[dict[str, Any]] = []
    for records in run.ranks.values():
        for c in records.choices:
            choice = {k: v for k, v in c.items() if k not in ("type", "rank", "t", "step")}
            if choice not in choices:
                choices.append(choice)
    params = {"params_initial": {r: rec.get("digest") for r, records in run.ranks.items() for rec in records.params_initial},
              "params_final": {r: rec.get("digest") for r, records in run.ranks.items() for rec in records.params_final}}
    first_gradients: dict[str, dict[str, FirstGradient]] = {}
    for r, records in sorted(run.ranks.items()):
        for rec in records.first_gradients:
            first_gradients.setdefault(str(rec["name"]), {}).setdefault(str(r), {
                "step": rec.get("step"), "rows": rec.get("rows"), "indices_digest": rec.get("indices_digest"),
                "values_digest": rec.get("values_digest")})
    summary: RunSummary = {
        "format": rundir.SUMMARY_FORMAT,
        "workload": m.get("workload"),
        "script": m.get("script"),
        "preset": m.get("preset"),
        "mode": str(m.get("mode") or "unknown"),
        "world_size": int(m.get("world_size") or len(run.ranks)),
        "steps": m.get("steps"),
        "steps_recorded": max((r["steps_completed"] for r in ranks), default=0),
        "status": str(m.get("status") or "unknown"),
        "oversubscribed": m.get("oversubscribed"),
        "peak_rss_bytes_max": max(peaks) if peaks else None,
        # Steady state (docs/explanation/measurement.md): what comparisons and predictions use.
        "steady_peak_rss_bytes_max": largest("steady_peak_rss_bytes"),
        "steady": None if not steady else all(r["steady"] for r in steady),
        "first_step_peak_rss_bytes_max": largest("first_step_peak_rss_bytes"),
        "compute_peak_rss_bytes_max": largest("compute_peak_rss_bytes"),
        "collective_peak_rss_bytes_max": largest("collective_peak_rss_bytes"),
        "collective_live_peak_bytes_max": largest("collective_live_peak_bytes"),
        "collective_live_all_peak_bytes_max": largest("collective_live_all_peak_bytes"),
        # what glibc's heaps held freed and kept, on the rank that set the steady peak (memdiag.agent.heap)
        "heap_free_bytes_at_peak": None if top is None else top.get("heap_free_bytes"),
        # tensors whose allgathers one grouped call made alive together (the live model counts them as one)
        "allgather_groups": [list(g) for g in sorted({tuple(g) for live in lives.values() for g in live[1]})],
        "peak_phase": None if top is None else top["peak_phase"],
        "throughput_items_per_s": throughput,
        "ranks": ranks,
        "collectives": collectives,
        "policy": sorted(policy.values(), key=lambda p: p["name"]),
        # What the script asked Horovod for (DistributedGradientTape / DistributedOptimizer arguments).
        "script_choices": choices,
        "changes_to_job": m.get("changes_to_job", []),
        "memory_environment": m.get("memory_environment", {}),
        "initial_params_digest": params["params_initial"].get(0),
        "final_params_digest": params["params_final"].get(0),
        # a comparison's runs: each IndexedSlices gradient the first time it was reduced, per rank, before any
        # mode changed it (what tells the script's own randomness from a mode's effect)
        "first_gradients": dict(sorted(first_gradients.items())),
        "steps_detail": steps,
        "consistency": consistency,
        "reduction_checks": checks,
        "distinct_rows": distinct_rows_summary(run),
        "engine": m.get("engine", "horovod"),
        # What the first rank to start ran on (TensorFlow, Keras, Horovod, MPI), from its start record.
        "versions": next((r.start.get("versions", {}) for _, r in sorted(run.ranks.items()) if r.start), {}),
        "padding": padding_summary(run),  # tf-distribute: MWMS's zero rows per tensor
        "failure": diagnose(run),
        "warnings": list(run.warnings),
    }
    if summary["engine"] == "horovod":
        labelling = next((str(r.get("error")) for records in run.ranks.values() for r in records.bookkeeping
                          if str(r.get("what", "")).startswith("label")), None)
        not_applied = [r for records in run.ranks.values() for r in records.not_applied]
        summary["mode_applied"] = mode_applied(summary["mode"], collectives, summary["policy"],
                                               not_applied_reasons(not_applied), labelling)
    attribution = attribution_entry(run.path)
    if attribution is not None:  # only when the run has memray files
        summary["attribution"] = attribution
    return summary
