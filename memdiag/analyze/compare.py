"""A comparison of modes across rank counts: its table rows, growth per added rank and noise, built into one result.

:func:`build` makes the comparison of one engine's runs: a row per (rank count, mode), the growth of
each per added rank measured and as the formula predicts it, the gathered tensors, and the noise the
differences are judged against; with the modes' correctness (:mod:`memdiag.analyze.correctness`) and
the figures of the verdict (:mod:`memdiag.analyze.physics`). Two engines side by side:
:mod:`memdiag.analyze.engines`.
"""

from __future__ import annotations

import os
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from memdiag.analyze.correctness import correctness
from memdiag.analyze.model import linear_fit
from memdiag.analyze.physics import physics
from memdiag.analyze.predicted import predicted_gathered
from memdiag.analyze.ranks_spread import rank_mean, within_run
from memdiag.format import rundir
from memdiag.format.results import CompareRow, Comparison, GrowthTensor, RunSummary


def load_summary(run_dir: str) -> RunSummary:
    return rundir.read_summary(run_dir)


def table_row(summary: RunSummary, run_dir: str) -> CompareRow:
    ranks = summary["ranks"]
    step_times = [r["step_time_s"] for r in ranks if r["step_time_s"] is not None]
    return {
        "world_size": summary["world_size"],
        "mode": summary["mode"],
        "status": summary["status"],
        # Steady-state figures where the run has them (docs/explanation/measurement.md); the first step's apart.
        "steady_peak_rss_bytes_median": summary.get("steady_peak_rss_bytes_max") or summary["peak_rss_bytes_max"],
        "first_step_peak_rss_bytes": summary.get("first_step_peak_rss_bytes_max"),
        "steady": summary.get("steady"),
        "peak_phase": summary.get("peak_phase"),
        "compute_peak_rss_bytes": summary.get("compute_peak_rss_bytes_max"),
        "collective_peak_rss_bytes": summary.get("collective_peak_rss_bytes_max"),
        "collective_live_peak_bytes": summary.get("collective_live_peak_bytes_max"),
        "collective_live_all_peak_bytes": summary.get("collective_live_all_peak_bytes_max"),
        "heap_free_bytes": summary.get("heap_free_bytes_at_peak"),
        # the mean over the ranks of their steady peaks, and the ranks' spread about it (ranks_spread)
        "rank_mean_peak_rss_bytes": rank_mean(_rank_peaks(summary)),
        "rank_spread": _within_runs([summary]),
        "collective_bytes_per_rank": max((r["collective_bytes_per_step"] for r in ranks), default=0),
        "allgather_bytes_per_rank": max((r["allgather_bytes_per_step"] for r in ranks), default=0),
        "allreduce_bytes_per_rank": max((r["allreduce_bytes_per_step"] for r in ranks), default=0),
        "step_time_s": max(step_times) if step_times else None,
        "throughput_items_per_s": summary.get("throughput_items_per_s"),
        "run_dir": os.path.basename(run_dir),
        "failure": summary.get("failure"),
    }


def growth(rows: Sequence[Mapping[str, Any]], key: str, min_world_size: int = 1) -> dict[str, float | None]:
    """Per mode: the fitted increase of ``key`` per added rank, over rows with N >= min_world_size."""
    by_mode: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for row in rows:
        if row["world_size"] >= min_world_size:
            by_mode[row["mode"]].append(row)
    result = {}
    for mode, mode_rows in by_mode.items():
        fit = linear_fit([r["world_size"] for r in mode_rows], [r[key] for r in mode_rows])
        result[mode] = None if fit is None else fit[0]
    return result


def predicted_growth(summaries: dict[tuple[int, str], RunSummary], min_world_size: int = 1) -> int | None:
    """Bytes each added rank adds to every rank's allgather output by the formula, fitted per added rank
    as the measured growth is (over the sparse runs of N >= ``min_world_size``): at each N the formula
    with the rows that run gathered, the sum over its ranks of each rank's own rows (allgatherv gathers
    them all), so ranks with different rows count as they are. One rank gathers nothing (Horovod runs no
    collective for it), so N=1 is no point of the formula's line: with one run of N >= 2, the growth is
    its formula bytes over its N (the mean rows per rank).

    The rows are each rank's own rows in (read from its graph when traced, else from its records),
    never the gathered bytes out: an independent prediction, not the measured bytes restated.
    """
    points = sorted((n, predicted_gathered(s, n)) for (n, mode), s in summaries.items()
                    if mode == "sparse" and n >= max(min_world_size, 2))
    known = [(n, g) for n, g in points if g is not None]
    if not known:
        return None
    fit = linear_fit([float(n) for n, _ in known], [float(g) for _, g in known])
    if fit is None:
        n, gathered = max(known)
        return round(gathered / n)
    return round(fit[0])


def growth_tensors(summaries: dict[tuple[int, str], RunSummary], min_world_size: int = 1) -> list[GrowthTensor]:
    """The IndexedSlices gradients that were gathered, with what auto chose for each and why. A tensor's
    growth per added rank is its gathered bytes (from the records) fitted over the sparse runs of
    N >= ``min_world_size`` and N >= 2 as the formula's are (:func:`predicted_growth`); with one run, its
    bytes over N."""
    sparse = [(n, s) for (n, mode), s in summaries.items() if mode == "sparse" and n > 1]
    autos = [(n, s) for (n, mode), s in summaries.items() if mode == "auto"]
    auto_policy = {}
    if autos:
        _, auto_summary = max(autos, key=lambda item: item[0])
        auto_policy = {p["name"]: p for p in auto_summary.get("policy", [])}
        auto_n = max(n for n, _ in autos)
    tensors: dict[str, GrowthTensor] = {}
    if sparse:
        n, summary = max(sparse, key=lambda item: item[0])
        # as the formula's line: one rank gathers nothing (no collective), so N=1 is not on it
        by_n = {m: _gathered_by_tensor(s) for (m, mode), s in summaries.items()
                if mode == "sparse" and m >= max(min_world_size, 2)}
        for name, gathered in _gathered_by_tensor(summary).items():
            points = sorted((m, found.get(name, 0)) for m, found in by_n.items())
            fit = linear_fit([float(m) for m, _ in points], [float(g) for _, g in points])
            tensors[name] = {"name": name, "growth_bytes_per_rank": round(gathered / n) if fit is None else round(fit[0]),
                             "gathered_bytes": gathered, "at_world_size": n}
    for name, policy in auto_policy.items():
        entry = tensors.setdefault(name, {"name": name, "growth_bytes_per_rank": None,
                                          "gathered_bytes": None, "at_world_size": None})
        entry["auto_decision"] = policy["decision"]
        entry["auto_reason"] = policy["reason"]
        entry["auto_world_size"] = auto_n
        if policy.get("optimizer_input"):
            entry["auto_optimizer_input"] = policy["optimizer_input"]
    _add_merging(tensors, summaries)
    return sorted(tensors.values(), key=lambda t: -(t["growth_bytes_per_rank"] or 0))


def _gathered_by_tensor(summary: RunSummary) -> dict[str, int]:
    """Per IndexedSlices gradient, the bytes one rank received by allgather per call (values and indices),
    from the records; none at one rank."""
    found: dict[str, int] = defaultdict(int)
    for c in summary.get("collectives", []):
        if c["op"] == "allgather" and c["sparse"] and summary.get("world_size", 2) > 1:
            found[c["name"]] += c["bytes_out_per_rank"]
    return dict(found)


def _add_merging(tensors: dict[str, GrowthTensor], summaries: dict[tuple[int, str], RunSummary]) -> None:
    """What merging did to each gathered tensor, from the dedup run at the largest rank count: the
    distinct rows U against the rows T per rank, the bytes gathered merged and unmerged at that N, and
    what the merge cost in compute per step."""
    deduped = [(n, s) for (n, mode), s in summaries.items() if mode == "dedup" and n > 1]
    if not deduped:
        return
    n, summary = max(deduped, key=lambda item: item[0])
    sparse = summaries.get((n, "sparse"))
    for d in summary.get("distinct_rows", []):
        entry = tensors.setdefault(d["name"], {"name": d["name"], "growth_bytes_per_rank": None,
                                               "gathered_bytes": None, "at_world_size": None})
        merged = sum(c["bytes_out_per_rank"] for c in summary["collectives"]
                     if c["name"] == d["name"] and c["op"] == "allgather" and c.get("merged"))
        unmerged = None if sparse is None else sum(
            c["bytes_out_per_rank"] for c in sparse["collectives"] if c["name"] == d["name"] and c["op"] == "allgather")
        entry["dedup"] = {"world_size": n, "rows_largest_rank": d["rows_max"],
                          "distinct_rows_min": d["distinct_rows_min"], "distinct_rows_max": d["distinct_rows_max"],
                          "distinct_rows_per_rank": d["distinct_rows_per_rank"],
                          "gathered_bytes": merged, "unmerged_gathered_bytes": unmerged,
                          "bytes_saved": None if unmerged is None else unmerged - merged,
                          "merge_s_median": d.get("merge_s_median")}


def binding(summaries: Mapping[tuple[int, str], RunSummary]) -> dict[str, list[int]] | None:
    """The CPUs a rank could run on (its launcher's binding), by rank count: the values seen over the
    modes' ranks. None when every rank could run on all of its host's CPUs, or none recorded it."""
    seen: dict[int, set[int]] = {}
    bound = False
    for (n, _mode), summary in summaries.items():
        for r in summary["ranks"]:
            allowed, count = r.get("cpus_allowed"), r.get("cpu_count")
            if isinstance(allowed, int):
                seen.setdefault(n, set()).add(allowed)
                bound = bound or (isinstance(count, int) and allowed < count)
    return {str(n): sorted(v) for n, v in sorted(seen.items())} if bound else None


def headline(rows: Sequence[Mapping[str, Any]]) -> str | None:
    """When a memory limit killed some runs and not others, that is the news."""
    killed = [r for r in rows if (r.get("failure") or {}).get("kind") == "mem-limit"]
    if not killed:
        return None
    parts = []
    for row in killed:
        parts.append(f"{row['mode']} at N={row['world_size']}: {row['failure']['headline']}")
    survivors = sorted({(r["mode"], r["world_size"]) for r in rows if r["status"] == "ok"
                        and r["world_size"] in {k["world_size"] for k in killed}})
    text = "killed by the memory limit: " + "; ".join(parts)
    if survivors:
        text += ". Completed under the same limit: " + ", ".join(f"{m} at N={n}" for m, n in survivors)
    return text


def build(target: str, preset: str | None, run_dirs: Mapping[tuple[int, str], str | list[str]],
          verify_dir: str | None = None, order_dirs: Mapping[tuple[int, str], str] | None = None) -> Comparison:
    """The comparison of every (rank count, mode): each key holds one run directory or, with
    ``--repeats``, several; their peaks give the median and the run-to-run spread."""
    repeats = {key: [paths] if isinstance(paths, str) else list(paths) for key, paths in run_dirs.items()}
    firsts = {key: paths[0] for key, paths in repeats.items()}
    every = {key: [load_summary(path) for path in paths] for key, paths in repeats.items()}
    summaries = {key: runs[0] for key, runs in every.items()}
    verify_summary = load_summary(verify_dir) if verify_dir else None
    rows = [with_repeats(table_row(summaries[key], firsts[key]), every[key]) for key in sorted(summaries)]
    fit_from = 2 if len({r["world_size"] for r in rows if r["world_size"] >= 2}) >= 2 else 1
    result: Comparison = {
        "headline": headline(rows),
        "workload": target,
        "preset": preset,
        "rows": rows,
        # One rank runs no collective and allocates none of Horovod's buffers: growth per added
        # rank is fitted from N >= 2 where two such rank counts exist.
        "growth_bytes_per_rank": growth(rows, "steady_peak_rss_bytes_median", fit_from),
        "collective_growth_bytes_per_rank": growth(rows, "collective_bytes_per_rank", fit_from),
        # Modelled, from the records (no RSS noise): the collective outputs alive at once per step, as
        # live_bytes.live_collective_bytes counts them (its docstring names the assumptions).
        "live_growth_bytes_per_rank": growth([r for r in rows if r.get("collective_live_peak_bytes") is not None],
                                             "collective_live_peak_bytes", fit_from),
        # the same with every gathered output and quotient of a step alive at once: the model's other bound
        "live_all_growth_bytes_per_rank": growth(
            [r for r in rows if r.get("collective_live_all_peak_bytes") is not None],
            "collective_live_all_peak_bytes", fit_from),
        # measured: what glibc's heaps held freed and kept at the largest rank's steady peak (agent.heap)
        "heap_free_growth_bytes_per_rank": growth([r for r in rows if r.get("heap_free_bytes") is not None],
                                                  "heap_free_bytes", fit_from),
        # the mean over the ranks' steady peaks, without the largest of more ranks standing higher (ranks_spread)
        "rank_mean_growth_bytes_per_rank": growth([r for r in rows if r.get("rank_mean_peak_rss_bytes") is not None],
                                                  "rank_mean_peak_rss_bytes", fit_from),
        "growth_fitted_from_world_size": fit_from,
        "predicted_growth_bytes_per_rank": predicted_growth(summaries, fit_from),
        "tensors": growth_tensors(summaries, fit_from),
        "correctness": correctness(firsts, summaries, verify_summary, order_dirs=order_dirs),
        "oversubscribed": any(s.get("oversubscribed") for s in summaries.values()),
        "binding": binding(summaries),
        "memory_environment": {k: v for s in summaries.values() for k, v in (s.get("memory_environment") or {}).items()},
        "all_ok": all(r["status"] == "ok" for r in rows),
        "noise_bytes": noise(rows),
        # the run-to-run spread of the heaps' freed bytes, the largest over the repeated configurations
        "heap_free_noise_bytes": noise(rows, "heap_free_spread_bytes"),
        "noise_source": "repeats" if noise(rows) is not None else None,
    }
    if result["noise_bytes"] is None:
        result["noise_bytes"] = rank_noise(summaries)
        result["noise_source"] = "ranks" if result["noise_bytes"] is not None else None
    result["physics"] = physics(result, summaries)
    return result


def with_repeats(row: CompareRow, runs: list[RunSummary]) -> CompareRow:
    """A row's peak as the median over repeated runs, with their spread (max - min)."""
    peaks = [r.get("steady_peak_rss_bytes_max") or r.get("peak_rss_bytes_max") for r in runs
             if r.get("status") == "ok"]
    found: list[float] = [p for p in peaks if p]
    row["repeats"] = len(runs)
    heaps = [h for r in runs if r.get("status") == "ok" and isinstance(h := r.get("heap_free_bytes_at_peak"), int)]
    if len(heaps) > 1:  # glibc's heaps' freed bytes: their median over the repeats, and their spread
        row["heap_free_bytes"] = statistics.median(heaps)
        row["heap_free_spread_bytes"] = max(heaps) - min(heaps)
    means = [m for r in runs if r.get("status") == "ok" and (m := rank_mean(_rank_peaks(r))) is not None]
    if len(means) > 1:
        row["rank_mean_peak_rss_bytes"] = statistics.median(means)
    if len(runs) > 1:
        row["rank_spread"] = _within_runs([r for r in runs if r.get("status") == "ok"])
    if len(found) > 1:
        row["steady_peak_rss_bytes_median"] = statistics.median(found)
        row["peak_spread_bytes"] = max(found) - min(found)
        row["peak_sd_bytes"] = statistics.stdev(found)
        row["peak_runs"] = len(found)
    else:
        row["peak_spread_bytes"] = None
    return row


def _rank_peaks(summary: RunSummary) -> list[float | None]:
    return [r.get("steady_peak_rss_bytes") for r in summary.get("ranks", [])]


def _within_runs(runs: Sequence[RunSummary]) -> list[float] | None:
    """[sum of squared deviations of the ranks' steady peaks from their run's mean, degrees of freedom],
    summed over ``runs`` (None: no run of two ranks or more with every rank's peak)."""
    parts = [part for r in runs if (part := within_run(_rank_peaks(r))) is not None]
    return [sum(s for s, _ in parts), sum(d for _, d in parts)] if parts else None


def noise(rows: Sequence[Mapping[str, Any]], key: str = "peak_spread_bytes") -> float | None:
    """The run-to-run noise of a per-rank peak (``key``: of another figure's spread, as the heaps' freed
    bytes'): the largest spread over the repeated configurations."""
    spreads = [r[key] for r in rows if r.get(key) is not None]
    return max(spreads) if spreads else None


def rank_noise(summaries: Mapping[tuple[int, str], RunSummary]) -> float | None:
    """Without repeats, the noise floor one run gives: the largest spread of the steady peaks between the
    ranks of one run (N >= 2), which run the same program on the same data sizes. It is larger than the
    run-to-run noise where ranks differ systematically (rank 0 saves the parameters), so it errs on the
    side of "within noise"."""
    spreads = []
    for (n, _), summary in summaries.items():
        peaks = [r.get("steady_peak_rss_bytes") for r in summary.get("ranks", [])]
        found = [p for p in peaks if p]
        if n >= 2 and summary.get("status") == "ok" and len(found) >= 2:
            spreads.append(max(found) - min(found))
    return max(spreads) if spreads else None
