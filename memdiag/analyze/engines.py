"""Two engines compared (``memdiag compare --engine both``): their rows side by side, a verdict, parameters across engines.

Each engine's runs make the comparison of modes on their own (:func:`memdiag.analyze.compare.build`),
and :func:`build_engines` sets them side by side: per rank count, engine and mode the steady peak, the
bytes gathered and all-reduced, MultiWorkerMirroredStrategy's padding, and what the formula
(:mod:`memdiag.formula`, :mod:`memdiag.analyze.predicted`) predicted from every rank's own rows in; a
verdict across the engines; and the final parameters of each engine against the first engine's (the
reference, Horovod) at the same rank count and mode. Engines are told apart by the data: an engine
pads its gathers when its policy records carry every worker's rows (``rows_per_worker``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from memdiag.analyze import verify
from memdiag.analyze.compare import build, load_summary
from memdiag.analyze.correctness import parameter_check, second_look, spread_check
from memdiag.analyze.predicted import gathered_policies, predicted_gathered, predicted_padding
from memdiag.format.results import (
    CompareRow,
    Comparison,
    CrossEngineCheck,
    EnginePeak,
    EngineRow,
    EnginesComparison,
    EnginesVerdict,
    RunSummary,
)


def build_engines(target: str, preset: str | None,
                  run_dirs: Mapping[str, Mapping[tuple[int, str], str | list[str]]],
                  verify_dirs: Mapping[str, str] | None = None,
                  order_dirs: Mapping[str, Mapping[tuple[int, str], str]] | None = None) -> EnginesComparison:
    """Every (engine, rank count, mode): each engine's own comparison (``engines``), the rows side by
    side, the verdict across engines and the parameters of each engine against the first one's."""
    verify_dirs, order_dirs = verify_dirs or {}, order_dirs or {}
    order = list(run_dirs)
    results: dict[str, Comparison] = {}
    for engine, dirs in run_dirs.items():
        results[engine] = build(target, preset, dirs, verify_dirs.get(engine), order_dirs.get(engine))
        results[engine]["engine"] = engine
    firsts = {engine: {key: paths if isinstance(paths, str) else paths[0] for key, paths in dirs.items()}
              for engine, dirs in run_dirs.items()}
    summaries = {engine: {key: load_summary(path) for key, path in dirs.items()} for engine, dirs in firsts.items()}
    rows = [engine_row(engine, row, summaries[engine][(row["world_size"], row["mode"])])
            for engine in order for row in results[engine]["rows"]]
    rows.sort(key=lambda r: (r["world_size"], order.index(r["engine"]), r["mode"]))
    across = across_engines(order, firsts, summaries, order_dirs.get(order[0]))
    verdicts = [results[e]["correctness"]["passed"] for e in order] + [c["passed"] for c in across]
    known = [v for v in verdicts if v is not None]
    compared = [c["passed"] for c in across if c["passed"] is not None]
    headlines = [f"{e}: {results[e]['headline']}" for e in order if results[e].get("headline")]
    return {
        "engine": "both",
        "engine_order": order,
        "workload": target,
        "preset": preset,
        "headline": "; ".join(headlines) or None,
        "side_by_side": rows,
        "verdict": engines_verdict(order, rows, results, summaries),
        "correctness": {
            "passed": None if not known else all(known),
            "by_engine": {e: results[e]["correctness"]["passed"] for e in order},
            # The engines whose verification run ran (each engine compared makes one, from N=2 on).
            "reduction_checked": [e for e in order if results[e]["correctness"].get("reduction") is not None],
            "across_engines": across,
            "across_engines_passed": None if not compared else all(compared),
            "rtol": verify.RTOL,
            "atol": verify.ATOL,
        },
        "engines": results,
        "all_ok": all(results[e]["all_ok"] for e in order),
        "oversubscribed": any(results[e].get("oversubscribed") for e in order),
        "memory_environment": {k: v for e in order for k, v in (results[e].get("memory_environment") or {}).items()},
    }


def engine_row(engine: str, row: CompareRow, summary: RunSummary) -> EngineRow:
    """One engine's comparison row with its gathered bytes split from MWMS's gathers of the row counts,
    its padding, and the formula's figures for it."""
    collectives = summary.get("collectives", [])
    # A tensor's counts are gathered once per step: bytes of one call times the calls per step.
    lengths = sum(int(c["bytes_out_per_rank"]) * round(c.get("calls_per_step") or 1) for c in collectives
                  if c["op"] == "allgather" and c.get("part") == "lengths")
    padding_engine = any("rows_per_worker" in p for p in summary.get("policy", []))
    return {
        "world_size": row["world_size"],
        "engine": engine,
        "mode": row["mode"],
        "status": row["status"],
        "steady_peak_rss_bytes_median": row.get("steady_peak_rss_bytes_median"),
        "peak_spread_bytes": row.get("peak_spread_bytes"),
        "repeats": row.get("repeats", 1),
        "peak_phase": row.get("peak_phase"),
        "gathered_bytes_per_rank": row["allgather_bytes_per_rank"] - lengths,
        "lengths_bytes_per_rank": lengths,
        "predicted_gathered_bytes_per_rank": predicted_gathered(summary, row["world_size"]),
        "padding_bytes_per_rank": sum(int(p["padding_bytes_per_step"]) for p in summary.get("padding", []))
        if padding_engine else None,
        "predicted_padding_bytes_per_rank": predicted_padding(summary) if padding_engine else None,
        "allreduce_bytes_per_rank": row["allreduce_bytes_per_rank"],
        "run_dir": row["run_dir"],
    }


def across_engines(order: Sequence[str], run_dirs: Mapping[str, Mapping[tuple[int, str], str]],
                   summaries: Mapping[str, Mapping[tuple[int, str], RunSummary]],
                   reference_order_dirs: Mapping[tuple[int, str], str] | None = None) -> list[CrossEngineCheck]:
    """Final parameters of each engine's runs against the reference engine's (the first) at the same rank
    count and mode: the same data and initial values; Horovod averages the gradients, MWMS sums the
    gradients of a loss scaled by 1/N, so they differ by float rounding only, within the tolerance of
    the parameter check between modes (docs/explanation/correctness.md). Where a pair fails and the reference made a
    rank-order run of that (rank count, mode) for its own check
    (:func:`memdiag.analyze.correctness.rank_order_check`), the pair is compared again against that run,
    which differs from the reference's in the summation order alone: it passes if that agrees, or if
    every variable that failed is no farther from the reference's run than the reference's two runs are
    from each other (``spread``, as :func:`memdiag.analyze.correctness.rank_order_check` does), every
    figure kept."""
    reference, *others = order
    checks: list[CrossEngineCheck] = []
    for engine in others:
        for (n, mode), path in sorted(run_dirs[engine].items()):
            ref_dir = run_dirs[reference].get((n, mode))
            ref, other = summaries[reference].get((n, mode)), summaries[engine][(n, mode)]
            if ref_dir is None or ref is None or ref.get("status") != "ok" or other.get("status") != "ok":
                continue
            found = parameter_check(n, mode, mode, ref_dir, path, ref, other)
            check: CrossEngineCheck = {
                "world_size": n, "mode": mode, "engine": engine, "against_engine": reference,
                "passed": found["passed"], "max_abs_diff": found["max_abs_diff"], "max_rel_diff": found["max_rel_diff"],
                "loss_max_rel_diff": found["loss_max_rel_diff"], "update_allowance": found.get("update_allowance"),
                "terms": found.get("terms"),
                "worst_variable": max(found["variables"], key=lambda d: d["max_abs_diff"])["name"]
                if found["variables"] else None}
            if found.get("note"):
                check["note"] = found["note"]
            order_dir = (reference_order_dirs or {}).get((n, mode))
            if found["passed"] is False and order_dir is not None:
                order_summary = load_summary(order_dir)
                again = parameter_check(n, mode, mode, order_dir, path, order_summary, other)
                if again["passed"] is not None:
                    check["as_run_passed"] = False
                    check["passed"] = again["passed"]
                    look = check["rank_order"] = second_look(again, order_dir)
                    if not again["passed"]:
                        # the reference engine's two runs, which differ in MPI's summation order alone
                        spread = parameter_check(n, mode, mode, ref_dir, order_dir, ref, order_summary)
                        if spread["passed"] is not None:
                            look["spread"] = spread_check(found, spread)
                            check["passed"] = look["spread"]["within"]
            checks.append(check)
    return checks


def engines_verdict(order: Sequence[str], rows: Sequence[EngineRow], results: Mapping[str, Mapping[str, Any]],
                    summaries: Mapping[str, Mapping[tuple[int, str], RunSummary]]) -> EnginesVerdict:
    """The figures of the verdict at the largest rank count: every (engine, mode) peak, lowest first,
    the lowest's lead and the gap between the engines' lowest peaks against the noise (the larger of
    the engines'), the gathered bytes of each
    engine's sparse run, MWMS's padding and whether every worker had the same rows, and whether the
    measured gathered bytes equal the formula's."""
    done = [r for r in rows if r["status"] == "ok" and r.get("steady_peak_rss_bytes_median")]
    largest = max((r["world_size"] for r in done), default=None)
    at = sorted((r for r in done if r["world_size"] == largest), key=lambda r: r["steady_peak_rss_bytes_median"] or 0)
    peaks: list[EnginePeak] = [
        {"engine": r["engine"], "mode": r["mode"], "peak_rss_bytes": r["steady_peak_rss_bytes_median"] or 0} for r in at]
    lead = peaks[1]["peak_rss_bytes"] - peaks[0]["peak_rss_bytes"] if len(peaks) >= 2 else None
    best: dict[str, EnginePeak] = {}
    for p in peaks:  # lowest first: the first of each engine is its best
        best.setdefault(p["engine"], p)
    ranked = [best[e] for e in order if e in best]
    gap = ranked[1]["peak_rss_bytes"] - ranked[0]["peak_rss_bytes"] if len(ranked) >= 2 else None
    measured = [res for res in results.values() if res.get("noise_bytes") is not None]
    noise_bytes = max((res["noise_bytes"] for res in measured), default=None)
    sources = {res.get("noise_source") for res in measured}
    sparse = {r["engine"]: r for r in at if r["mode"] == "sparse"}
    gathered = {e: sparse[e]["gathered_bytes_per_rank"] for e in order if e in sparse}
    reference = order[0]
    others = [e for e in order[1:] if e in gathered]
    ratio = None
    if reference in gathered and others and gathered[reference]:
        ratio = gathered[others[0]] / gathered[reference]
    padded = [r for r in sparse.values() if r.get("padding_bytes_per_rank") is not None]
    rows_per_worker: dict[str, list[int]] = {}
    if padded and largest is not None:
        summary = summaries[padded[0]["engine"]][(largest, "sparse")]
        rows_per_worker = {p["name"]: list(counts) for p in gathered_policies(summary)
                          if (counts := p.get("rows_per_worker"))}
    exact: dict[str, bool] = {}
    for engine in order:
        pairs = [(r["gathered_bytes_per_rank"], r["predicted_gathered_bytes_per_rank"]) for r in rows
                 if r["engine"] == engine and r["mode"] == "sparse" and r["status"] == "ok"
                 and r.get("predicted_gathered_bytes_per_rank") is not None]
        if pairs:
            exact[engine] = all(a == b for a, b in pairs)
    return {
        "world_size": largest,
        "peaks": peaks,
        "lead_bytes": lead,
        "noise_bytes": noise_bytes,
        "noise_source": None if not sources else ("repeats" if sources == {"repeats"} else "ranks"),
        "lead_beyond_noise": None if lead is None or noise_bytes is None else lead > noise_bytes,
        "best_by_engine": best,
        "engine_gap_bytes": gap,
        "engine_gap_beyond_noise": None if gap is None or noise_bytes is None else abs(gap) > noise_bytes,
        "gathered_bytes": gathered,
        "gathered_ratio": ratio,
        "padding_bytes": padded[0]["padding_bytes_per_rank"] if padded else None,
        "rows_per_worker": rows_per_worker,
        "equal_rows": None if not rows_per_worker else all(len(set(v)) == 1 for v in rows_per_worker.values()),
        "formula_exact": exact,
    }
