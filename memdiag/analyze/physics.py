"""The figures of a comparison's verdict: sparse's growth against k x the formula, how flat dense stays, what auto saved.

Also which phase set each peak, and whether each difference is larger than the noise: with repeats at both
ends of a difference, two standard errors of it from the repeats' spread (memdiag.analyze.precision); else the
noise figure (:func:`memdiag.analyze.compare.noise`, :func:`memdiag.analyze.compare.rank_noise`).
"""

from __future__ import annotations

from memdiag._errors import UserError
from memdiag.analyze.precision import difference_standard_error, repeats_for, slope_standard_error, within
from memdiag.analyze.ranks_spread import largest_of_ranks_growth, pooled_sd
from memdiag.format.results import Comparison, GrowthSegment, Physics, RunSummary


def physics(result: Comparison, summaries: dict[tuple[int, str], RunSummary]) -> Physics:
    """The figures of the verdict: how sparse grows against k x the formula, how flat dense stays,
    what auto chose and what it saved, which phase set each peak, and whether each difference is
    larger than the noise."""
    by_key = {(r["world_size"], r["mode"]): r for r in result["rows"] if r["status"] == "ok"}
    counts = sorted({n for n, _ in by_key})
    largest = max(counts, default=None)
    multi = [n for n in counts if n >= 2]
    predicted = result.get("predicted_growth_bytes_per_rank")
    k = None
    sparse = [s for (n, mode), s in summaries.items() if mode == "sparse" and n > 1]
    if sparse:
        from memdiag.analyze.model import build_model

        try:
            k = build_model([max(sparse, key=lambda s: s["world_size"])]).cost_per_gathered_byte
        except UserError:
            k = None
    noise_bytes = result.get("noise_bytes")
    heap_noise = result.get("heap_free_noise_bytes")

    def peak(n: int | None, mode: str) -> float | None:
        row = by_key.get((n, mode)) if n is not None else None
        return None if row is None else row["steady_peak_rss_bytes_median"]

    def spread(n: int | None, mode: str) -> tuple[float, int] | None:
        """The row's repeats: their sample standard deviation and count (None: one run, or no row)."""
        row = by_key.get((n, mode)) if n is not None else None
        sd = None if row is None else row.get("peak_sd_bytes")
        if row is None or sd is None or int(row.get("peak_runs") or 0) < 2:
            return None
        return float(sd), int(row["peak_runs"])

    def beyond_noise(mode: str, other: str | None, n: int | None) -> bool | None:
        """Whether two modes' peaks at N=n differ beyond the noise: two standard errors of the difference of
        their medians where both have repeats, else the noise figure."""
        a, b = peak(n, mode), None if other is None else peak(n, other)
        if a is None or b is None or other is None:
            return None
        ends = spread(n, mode), spread(n, other)
        se = difference_standard_error([ends[0], ends[1]]) if ends[0] and ends[1] else None
        if se is not None:
            return not within(a - b, se)
        return None if noise_bytes is None else bool(abs(a - b) > noise_bytes)

    dense_low, dense_high = (peak(min(multi), "dense"), peak(max(multi), "dense")) if len(multi) >= 2 else (None, None)
    fixed: dict[str, float] = {}
    for mode in ("sparse", "dedup", "dense"):
        value = peak(largest, mode)
        if value is not None:
            fixed[mode] = value
    best = min(fixed.values(), default=None)
    auto_peak = peak(largest, "auto")
    every = {**fixed, **({} if auto_peak is None else {"auto": auto_peak})}
    lowest = min(every, key=lambda m: every[m]) if every else None
    sparse_peak = peak(largest, "sparse")
    densified = [t["name"] for t in result.get("tensors", []) if t.get("auto_decision") == "dense"]
    merged = [t["name"] for t in result.get("tensors", []) if t.get("auto_decision") == "dedup"]
    handed_dense = [t["name"] for t in result.get("tensors", []) if t.get("auto_optimizer_input") == "dense"]
    sparse_growth = result["growth_bytes_per_rank"].get("sparse")
    predicted_rss = None if predicted is None or k is None else k * predicted
    fitted = [n for n in counts if (n, "sparse") in by_key and n >= result.get("growth_fitted_from_world_size", 1)]
    # the largest of more ranks stands higher by the ranks' spread alone (memdiag.analyze.ranks_spread)
    spread_parts = [(part[0], int(part[1])) for n in fitted
                    if (part := (by_key.get((n, "sparse")) or {}).get("rank_spread"))]
    rank_sd = pooled_sd(spread_parts) if len(fitted) >= 2 else None
    largest_term = None if rank_sd is None else largest_of_ranks_growth(rank_sd, fitted)
    # how precisely the repeats pin the growth (memdiag.analyze.precision): None without repeats at every N
    precision_points = [(float(n), *known) for n in fitted if (known := spread(n, "sparse")) is not None]
    growth_se = slope_standard_error(precision_points) if len(precision_points) == len(fitted) else None
    fewest_repeats = min((r for _, _, r in precision_points), default=0)
    heap_growth = (result.get("heap_free_growth_bytes_per_rank") or {}).get("sparse")
    # its change across the rank counts fitted against its own run-to-run spread (None: no repeats)
    heap_within = None if heap_growth is None or heap_noise is None or len(fitted) < 2 \
        else bool(abs(heap_growth) * (fitted[-1] - fitted[0]) <= heap_noise)
    # The fitted growth against k x the formula: with repeats at every rank count fitted, within two of its
    # standard errors; else as the difference it makes to the peak across the rank counts fitted, within
    # the noise figure. Where it is beyond and above, whether the named terms bring it within: what the
    # heaps kept (unless within its own spread) and what the ranks' spread alone adds to the largest rank.
    growth_within_noise = judged_by = within_after_named = None
    if sparse_growth is not None and predicted_rss is not None and len(fitted) >= 2:
        gap = sparse_growth - predicted_rss
        if growth_se is not None:
            judged_by = "standard_error"
            growth_within_noise = within(gap, growth_se)
            kept = heap_growth if heap_growth is not None and heap_growth > 0 and heap_within is not True else 0.0
            named = kept + (largest_term or 0.0)
            if not growth_within_noise and gap > 0 and named > 0:
                within_after_named = within(gap - named, growth_se)
        elif noise_bytes is not None:
            judged_by = result.get("noise_source")
            growth_within_noise = bool(abs(gap) * (fitted[-1] - fitted[0]) <= noise_bytes)

    def per_rank(key: str, a: int, b: int) -> float | None:
        """The figure ``key`` of sparse's rows (the live model's, the heaps' freed bytes), per added rank
        between N=a and N=b."""
        rows = [by_key.get((n, "sparse")) for n in (a, b)]
        low, high = (None if row is None else row.get(key) for row in rows)
        if not isinstance(low, (int, float)) or not isinstance(high, (int, float)):
            return None
        return (high - low) / (b - a)

    binding = result.get("binding") or {}
    segments: list[GrowthSegment] = []
    for a, b in zip(fitted, fitted[1:]):
        low, high = peak(a, "sparse"), peak(b, "sparse")
        if low is None or high is None or predicted_rss is None:
            continue
        measured = (high - low) / (b - a)
        gap = measured - predicted_rss  # what the model leaves, per added rank
        # measured: what glibc's heaps held freed and kept grew by (resident memory in no tensor)
        heap_free = per_rank("heap_free_bytes", a, b)
        # counted against the gap only where it grew beyond its own run-to-run spread (or there are no repeats)
        heap_beyond = None if heap_free is None or heap_noise is None else bool(abs(heap_free) * (b - a) > heap_noise)
        kept = heap_free if heap_free is not None and heap_free > 0 and heap_beyond is not False else 0.0
        # the ranks' spread alone: the largest of b ranks stands this much higher per added rank than of a
        term = None if not rank_sd else largest_of_ranks_growth(rank_sd, [a, b])
        ends = [spread(a, "sparse"), spread(b, "sparse")]
        se = None if None in ends else slope_standard_error([(float(n), *e) for n, e in zip((a, b), ends) if e])

        def beyond(left: float, span: int = b - a, se: float | None = se) -> bool | None:
            """``left`` per added rank beyond two standard errors of the segment, else beyond the noise figure
            over the segment."""
            if se is not None:
                return not within(left, se)
            return None if noise_bytes is None else bool(abs(left) * span > noise_bytes)

        segments.append({"from_world_size": a, "to_world_size": b, "measured_bytes_per_rank": measured,
                         "predicted_bytes_per_rank": predicted_rss, "unexplained_bytes_per_rank": gap,
                         "beyond_noise": beyond(gap),
                         "standard_error_bytes_per_rank": se,
                         "live_bytes_per_rank": per_rank("collective_live_peak_bytes", a, b),
                         "live_all_bytes_per_rank": per_rank("collective_live_all_peak_bytes", a, b),
                         "heap_free_bytes_per_rank": heap_free,
                         "heap_free_beyond_noise": heap_beyond,
                         "beyond_noise_after_heap": None if heap_free is None else beyond(gap - kept),
                         "largest_of_ranks_bytes_per_rank": term,
                         "beyond_noise_after_named": None if term is None else beyond(gap - kept - term)})
        # ranks bound alike at both ends or not at all: nothing to say; else the segment spans a change of the
        # CPUs each rank could run on, which TensorFlow's thread pools follow (memdiag.analyze.compare.binding)
        low_cpus, high_cpus = binding.get(str(a)), binding.get(str(b))
        if low_cpus and high_cpus and low_cpus != high_cpus:
            segments[-1]["cpus_per_rank"] = [low_cpus, high_cpus]
    return {
        "largest_world_size": largest,
        "cost_per_gathered_byte": k,
        "sparse_growth_bytes_per_rank": sparse_growth,
        "predicted_rss_growth_bytes_per_rank": predicted_rss,
        "sparse_growth_within_noise": growth_within_noise,
        # what judged it: "standard_error" (two of the growth's), "repeats" (the largest range of a row's
        # repeats) or "ranks" (the largest spread between one run's ranks); None: not judged
        "sparse_growth_judged_by": judged_by,
        # beyond two standard errors above k x the formula: within them once the named terms are added (the
        # heaps' growth unless within its own spread, and sparse_largest_of_ranks_growth_bytes_per_rank)
        "sparse_growth_within_after_named": within_after_named,
        # between each two rank counts fitted: the growth measured against k x the formula's
        "sparse_segments": segments,
        "sparse_live_growth_bytes_per_rank": (result.get("live_growth_bytes_per_rank") or {}).get("sparse"),
        "sparse_live_all_growth_bytes_per_rank": (result.get("live_all_growth_bytes_per_rank") or {}).get("sparse"),
        "sparse_heap_free_growth_bytes_per_rank": heap_growth,
        "sparse_rank_mean_growth_bytes_per_rank": (result.get("rank_mean_growth_bytes_per_rank") or {}).get("sparse"),
        "sparse_rank_sd_bytes": rank_sd,
        "sparse_largest_of_ranks_growth_bytes_per_rank": largest_term,
        "sparse_growth_se_bytes_per_rank": growth_se,
        "sparse_growth_repeats": None if growth_se is None else fewest_repeats,
        "sparse_growth_repeats_for_tenth": None if growth_se is None or not predicted_rss
        else repeats_for(growth_se, fewest_repeats, 0.1 * abs(predicted_rss)),
        "sparse_heap_free_within_noise": heap_within,
        "heap_free_noise_bytes": heap_noise,
        "dense_change": None if not dense_low or dense_high is None else (dense_high - dense_low) / dense_low,
        "dense_peak_bytes": dense_high if dense_high is not None else peak(largest, "dense"),
        "auto_densified": densified,
        "auto_merged": merged,
        "auto_dense_to_optimizer": handed_dense,
        "best_fixed_mode": None if not fixed else min(fixed, key=lambda m: fixed[m]),
        "lowest_peak_mode": lowest,
        # every mode whose peak is within the noise of the lowest (alphabetical: which of them is lowest
        # by a margin inside the noise changes from run to run); None without a noise figure
        "lowest_peak_modes_within_noise": None if not every or any(
            beyond_noise(m, lowest, largest) is None for m in every) else sorted(
            m for m in every if not beyond_noise(m, lowest, largest)),
        "auto_vs_sparse": None if auto_peak is None or not sparse_peak else auto_peak / sparse_peak - 1,
        "auto_minus_best_bytes": None if auto_peak is None or best is None else auto_peak - best,
        "auto_vs_best_beyond_noise": None if auto_peak is None or not fixed
        else beyond_noise("auto", min(fixed, key=lambda m: fixed[m]), largest),
        "phases": {mode: {str(n): summaries[(n, mode)].get("peak_phase") for n in counts if (n, mode) in summaries}
                   for mode in sorted({m for _, m in summaries})},
        "noise_bytes": noise_bytes,
        "noise_source": result.get("noise_source"),
    }
