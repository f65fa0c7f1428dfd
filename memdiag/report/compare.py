"""The comparison report: modes x rank counts, growth per added rank, chart, verdict.

Tables are :class:`memdiag.report._fit.FitTable`: no figure, rank count or mode is ever cut.
"""

from __future__ import annotations

from typing import Any, cast

from rich.console import Console, Group
from rich.panel import Panel
from rich.text import Text

from memdiag.format.results import Comparison, EnginesComparison, Physics, RankOrderLook
from memdiag.report._fit import Column, FitTable
from memdiag.report.chart import peak_chart
from memdiag.report.terminal import (
    LIVE_ASSUMPTION,
    common_scope,
    describe_memory_environment,
    second_figure,
    short_name,
)
from memdiag.units import format_bytes


def compare_table(result: Comparison) -> FitTable:
    repeated = any(r.get("peak_spread_bytes") is not None for r in result["rows"])
    columns = [Column("N", key=True), Column("mode", justify="left", key=True), Column("peak RSS")]
    if repeated:
        columns.append(Column("spread"))
    unsettled = any(r.get("steady") is False for r in result["rows"])
    if unsettled:
        columns.append(Column("steady", justify="left"))
    columns += [Column("set by", justify="left"), Column("coll/step"), Column("gathered"),
                Column("step", group=1), Column("items/s", group=1), Column("status", justify="left", group=1)]
    title = "Per rank count and mode (max over ranks, steady state" + (", median of repeats)" if repeated else ")")
    table = FitTable(columns, title=title)
    for row in result["rows"]:
        cells = [str(row["world_size"]), row["mode"], format_bytes(row["steady_peak_rss_bytes_median"])]
        if repeated:
            cells.append("-" if row.get("peak_spread_bytes") is None else format_bytes(row["peak_spread_bytes"]))
        if unsettled:
            cells.append("NO *" if row.get("steady") is False else ("yes" if row.get("steady") else "-"))
        cells += [row.get("peak_phase") or "-",
                  format_bytes(row["collective_bytes_per_rank"]), format_bytes(row["allgather_bytes_per_rank"]),
                  "-" if row["step_time_s"] is None else f"{row['step_time_s'] * 1000:.0f} ms",
                  "-" if not row["throughput_items_per_s"] else f"{row['throughput_items_per_s']:.0f}",
                  row["status"]]
        table.add_row(*cells)
    return table


def growth_table(result: Comparison) -> FitTable:
    since = result.get("growth_fitted_from_world_size", 1)
    # measured beside the peak: what glibc's heaps held freed and kept (memdiag.agent.heap), where read
    heap = result.get("heap_free_growth_bytes_per_rank") or {}
    heaps = any(v is not None for v in heap.values())
    columns = [Column("mode", justify="left", key=True), Column("peak RSS"), Column("collective bytes")]
    table = FitTable(columns + ([Column("heaps' freed")] if heaps else []),
                     title=f"Growth per added rank (fitted over N >= {since})")
    collective = result.get("collective_growth_bytes_per_rank", {})
    for mode, slope in result["growth_bytes_per_rank"].items():
        table.add_row(mode, _signed(slope), _signed(collective.get(mode)), *([_signed(heap.get(mode))] if heaps else []))
    predicted = result.get("predicted_growth_bytes_per_rank")
    if predicted is not None:
        # the formula with each run's rows gathered (the sum over its ranks), fitted as the rows above
        table.add_row("formula", "", _signed(predicted), *([""] if heaps else []))
    return table


def _signed(value: float | None) -> str:
    if value is None:
        return "-"
    return ("+" if value >= 0 else "") + format_bytes(value)


def verdict(result: Comparison) -> Text:
    text = Text()
    for row in result["rows"]:
        failure = row.get("failure")
        if failure and failure["kind"] != "mem-limit":
            text.append(f"{row['mode']} at N={row['world_size']} failed: {failure['headline']}\n", style="red")
    tensors = result.get("tensors", [])
    scope = common_scope([t["name"] for t in tensors])
    growing = [t for t in tensors if t.get("growth_bytes_per_rank")]
    if growing:
        text.append("Growth comes from IndexedSlices gradients reduced by allgather:\n", style="bold")
        for t in growing:
            text.append(f"  {short_name(t['name'], scope)}: +{format_bytes(t['growth_bytes_per_rank'])} per added rank "
                        f"({format_bytes(t['gathered_bytes'])} gathered at N={t['at_world_size']})")
            if t.get("auto_decision"):
                text.append(f"; auto -> {t['auto_decision']}: {t['auto_reason']}")
            text.append("\n")
    elif not any(r["mode"] == "sparse" and r["status"] == "ok" for r in result["rows"]):
        # the growth is measured on the sparse runs: without one it is unknown, not absent
        kept = [short_name(t["name"], scope) for t in tensors if t.get("auto_decision") in ("sparse", "dedup")]
        line = "Growth with the rank count not measured: no sparse run (add sparse to --modes)"
        if kept:
            line += f"; auto kept {', '.join(kept)} on the allgather path"
        text.append(line + ".\n", style="bold")
    else:
        text.append("No collective output grows with the rank count (no IndexedSlices gathered).\n",
                    style="bold")
    for t in tensors:
        if not t.get("growth_bytes_per_rank") and t.get("auto_decision"):
            text.append(f"  {short_name(t['name'], scope)}: auto -> {t['auto_decision']}: {t['auto_reason']}\n")
    for t in tensors:
        d = t.get("dedup")
        if d:
            text.append(f"  {short_name(t['name'], scope)} merged (dedup, N={d['world_size']}): "
                        f"{d['distinct_rows_min']}-{d['distinct_rows_max']} distinct of {d['rows_largest_rank']} rows "
                        f"per rank, gathered {format_bytes(d['gathered_bytes'])}")
            saved, merge_s = d.get("bytes_saved"), d.get("merge_s_median")
            if saved is not None:
                text.append(f" ({format_bytes(saved)} less than unmerged)")
            if merge_s is not None:
                text.append(f"; merging cost {merge_s * 1000:.2f} ms per step")
            text.append("\n")
    correctness_text(result, text)
    environment_notes(result, text)
    return text


def environment_notes(result: Comparison | EnginesComparison, text: Text) -> None:
    """What every run shared that changes its figures: allocator settings, cores shared by the ranks."""
    for phrase in describe_memory_environment(result.get("memory_environment") or {}):
        text.append(f"Set in the environment of every run: {phrase}.\n", style="yellow")
    if result.get("oversubscribed"):
        text.append("Ranks shared cores on this host: step times and throughput are not a scaling measurement.\n",
                    style="yellow")
    bound = result.get("binding")
    if isinstance(bound, dict) and bound:
        cpus = ", ".join(f"{'/'.join(map(str, v))} at N={n}" for n, v in bound.items())
        text.append(f"Ranks bound by the launcher, as a plain mpirun binds them: the CPUs each could run on went {cpus}. "
                    "TensorFlow sizes its default thread pools by them"
                    + (", so the rank counts ran different jobs per rank" if len({tuple(v) for v in bound.values()}) > 1
                       else "") + " (OMPI_MCA_hwloc_base_binding_policy=none unbinds them).\n", style="yellow")


def correctness_text(result: Comparison, text: Text) -> None:
    """The correctness result of one engine's comparison, appended to ``text``."""
    c = result["correctness"]
    reduction = c.get("reduction")
    if c["passed"] is None and not c["checks"] and (reduction is None or reduction["passed"] is None):
        text.append("Correctness: not checked (needs a sparse run beside another mode).\n", style="yellow")
    else:
        if c["passed"] is None:
            text.append("Correctness not decided: ", style="bold yellow")
        else:
            style = "bold green" if c["passed"] else "bold red"
            word = "PASSED" if c["passed"] else "FAILED"
            text.append(f"Correctness {word}: ", style=style)
        if c["max_abs_diff"] is not None:
            text.append(f"max |diff| {_num(c['max_abs_diff'])}, max relative {_num(c['max_rel_diff'])} "
                        f"(tolerance rtol {c['rtol']:g}, atol {c['atol']:g}")
            if c.get("update_allowance"):
                text.append(f", + {c['update_allowance']:.2g} of each variable's largest update: float "
                            f"rounding's share for sums of up to {c['terms_max']} numbers")
            text.append("); ")
        elif c["checks"]:
            text.append("final parameters not compared (below); ")
        if reduction and reduction.get("failed_run"):
            text.append(f"reduction check did not finish (verification run: {reduction['failed_run']}; see its "
                        "mpirun.log); ", style="bold red")
        elif reduction and reduction["passed"] is not None:
            by = reduction.get("by_reduction") or {"dense": reduction}
            for against, label in (("dense", "dense allreduce"), ("dedup", "merged allgather")):
                r = by.get(against)
                if r is None:
                    continue
                if r.get("rounding_bound_ratio") is not None:
                    within = (f"{r['rounding_bound_ratio']:.2g} of float rounding's bound for sums of up to "
                              f"{r.get('terms_max')} rows")
                else:
                    within = f"tolerance {r['rtol']:g}"
                text.append(f"reduction check at N={reduction['world_size']}: allgather and {label} of "
                            f"{len(reduction['tensors'])} gradient(s) differ by at most {_num(r['max_rel_diff'])} "
                            f"relative ({within}); ", style=None if r["passed"] else "bold red")
        if reduction is None and result.get("engine", "horovod") != "horovod":
            # No verification run (it needs N > 1): say so rather than imply the check covered this engine.
            text.append(f"no reduction check (it needs a rank count above 1), so {result['engine']}'s modes are "
                        "checked by their final parameters only; ", style="yellow")
        identical = c.get("ranks_identical_every_step")
        text.append("parameters identical on all ranks every step\n" if identical else
                    ("parameters DIFFER between ranks\n" if identical is False else "\n"))
        for note in c.get("notes", []):
            text.append(f"  {note}\n", style="yellow")
        for check in c["checks"]:
            again = check.get("rank_order")
            if again:
                text.append(f"  N={check['world_size']} {check['mode']} vs {check['against']}: max |diff| "
                            f"{_num(check['max_abs_diff'])} with MPI's own allreduce order, beyond the tolerance; "
                            f"run again summing the ranks' gradients in rank order, as the allgather path sums "
                            f"them ({again['run']}): max |diff| {_num(again['max_abs_diff'])}, ",
                            style=None if check["passed"] else "red")
                text.append(second_look_outcome(check["rank_order"], check["mode"], check["against"]),
                            style=None if check["passed"] else "red")
            if check["passed"] is False:
                text.append(f"  N={check['world_size']} {check['mode']} vs {check['against']}: "
                            f"max |diff| {_num(check['max_abs_diff'])}, loss rel diff "
                            f"{_num(check['loss_max_rel_diff'])} {check.get('note', '')}\n", style="red")


def second_look_outcome(again: RankOrderLook, mode: str, against: str, runs: str | None = None) -> str:
    """How a failed parameter check of ``mode`` against ``against`` ended its second look (``again``,
    its ``rank_order``), in words; ``runs``: what the two runs of the spread are (the mode's, unless said)."""
    spread = again.get("spread")
    if again["passed"]:
        return "within it: the difference was the summation order's rounding\n"
    if spread is None:
        return "beyond it too\n"
    runs = runs or f"the two runs of {mode}"
    apart = f"beyond it too; {runs}, which differ in the summation order alone, are {_num(spread['max_abs_diff'])} apart"
    if spread["within"]:
        return apart + f": the difference from {against} is within that rounding, variable by variable\n"
    return apart + f", less than from {against}\n"


# a per-added-rank figure beside the growth (glibc's heaps' freed bytes; the mean over the ranks' peaks against
# the largest rank's) is named in a verdict where it moved by at least this per added rank
SHOWN_PER_RANK_BYTES = 2**20


def heap_clause(p: Physics) -> str:
    """What glibc's heaps' freed bytes did per added rank, for the verdict's sparse clause: "" where not read
    or where they moved by less than SHOWN_PER_RANK_BYTES a rank; weighed against their own run-to-run spread
    with repeats, named as one run's without."""
    heap = p.get("sparse_heap_free_growth_bytes_per_rank")
    if heap is None or abs(heap) < SHOWN_PER_RANK_BYTES:
        return ""
    within = p.get("sparse_heap_free_within_noise")
    if within:
        return (f"; glibc's heaps' freed memory moved by {_signed(heap)} per added rank, within its run-to-run "
                f"spread ({format_bytes(p.get('heap_free_noise_bytes') or 0)})")
    where = "measured at the largest rank's peak step" + ("" if within is False else ", one run")
    return f"; glibc's heaps kept {_signed(heap)} per added rank of freed memory (resident, in no tensor; {where})"


def ranks_clause(p: Physics) -> str:
    """The growth of the mean over the ranks' peaks beside the largest rank's, and what the ranks' spread
    alone makes the largest of more ranks grow by (memdiag.analyze.ranks_spread): "" where the two growths
    differ by less than SHOWN_PER_RANK_BYTES a rank (ranks alike) or a figure is missing."""
    growth, mean = p.get("sparse_growth_bytes_per_rank"), p.get("sparse_rank_mean_growth_bytes_per_rank")
    if growth is None or mean is None or abs(growth - mean) < SHOWN_PER_RANK_BYTES:
        return ""
    text = f"; the mean over the ranks grows {_signed(mean)} per added rank"
    largest, sd = p.get("sparse_largest_of_ranks_growth_bytes_per_rank"), p.get("sparse_rank_sd_bytes")
    if largest is not None and sd:
        text += (f", and the largest of more ranks stands {_signed(largest)} per added rank higher by the ranks' "
                 f"spread alone (standard deviation {format_bytes(sd)} between the ranks of a run, taken as normal "
                 "draws)")
    return text


def growth_judgement(p: Physics) -> str:
    """Whether sparse's growth is within the noise of k x the formula, and what judged it: two of its standard
    errors with repeats at every rank count (memdiag.analyze.precision), else the noise figure named."""
    within = p.get("sparse_growth_within_noise")
    if within is None:
        return ""
    se = p.get("sparse_growth_se_bytes_per_rank")
    if p.get("sparse_growth_judged_by") != "standard_error" or se is None:
        against = "noise" if p.get("noise_source") == "repeats" else "the spread between one run's ranks"
        return f", within {against}" if within else f", beyond {against}"
    two = f"two standard errors (\u00b1{format_bytes(se)} each)"
    if within:
        return f", within {two}"
    text = f", beyond {two}"
    after = p.get("sparse_growth_within_after_named")
    if after is None:
        return text
    heap, term = p.get("sparse_heap_free_growth_bytes_per_rank"), p.get("sparse_largest_of_ranks_growth_bytes_per_rank")
    named = []
    if heap is not None and heap > 0 and p.get("sparse_heap_free_within_noise") is not True:
        named.append(f"the {_signed(heap)} per added rank that glibc's heaps kept freed")
    if term:
        named.append(f"the {_signed(term)} per added rank that the ranks' spread alone adds to the largest of more "
                     "ranks")
    counted = " and ".join(named) + " counted"
    return text + (f", within them with {counted}" if after else f", and beyond them with {counted}")


def physics_parts(p: Physics) -> list[str]:
    """The clauses of one engine's verdict sentence, from its ``physics`` figures."""
    parts = []
    growth, predicted = p.get("sparse_growth_bytes_per_rank"), p.get("predicted_rss_growth_bytes_per_rank")
    if growth is not None:
        part = f"sparse allgather adds {_signed(growth)} per rank for each added rank"
        if predicted:
            part += (f" (k x formula: {_signed(predicted)}, k = {p['cost_per_gathered_byte']:.2f}; "
                     f"measured/predicted {growth / predicted:.2f}")
            part += growth_judgement(p)
            part += ")"
        part += ranks_clause(p)
        if p.get("sparse_live_growth_bytes_per_rank") is not None:
            part += (f"; its live collective buffers {_signed(p['sparse_live_growth_bytes_per_rank'])} (modelled "
                     f"from the records: {LIVE_ASSUMPTION})")
            part += live_bounds_text(growth, p["sparse_live_growth_bytes_per_rank"],
                                     p.get("sparse_live_all_growth_bytes_per_rank"))
        part += heap_clause(p)
        parts.append(part)
    if p.get("dense_peak_bytes") is not None:
        part = f"dense stays at {format_bytes(p['dense_peak_bytes'])}"
        if p.get("dense_change") is not None:
            part += f" ({p['dense_change']:+.1%} over N >= 2)"
        parts.append(part)
    if p.get("auto_vs_sparse") is not None or p.get("auto_minus_best_bytes") is not None:
        count = len(p.get("auto_densified") or [])
        part = f"auto densified {count} tensor(s)"
        if p.get("auto_merged"):
            part += f" and merged {len(p['auto_merged'])}"
        handed_dense = len(p.get("auto_dense_to_optimizer") or [])
        if handed_dense:
            part += f", and handed {handed_dense} gathered dense to the optimizer"
        if p.get("auto_vs_sparse") is not None:
            part += f": {p['auto_vs_sparse']:+.0%} against sparse at N={p['largest_world_size']}"
        above_best = p.get("auto_minus_best_bytes")
        if above_best is not None:
            best = p.get("best_fixed_mode") or "the better mode"
            if p.get("auto_vs_best_beyond_noise") is False:
                part += f", level with {best} within noise"
            elif above_best <= 0:
                part += f", at or below {best}"
            else:
                part += f", {format_bytes(above_best)} above {best}"
                if p.get("auto_vs_best_beyond_noise"):
                    phase = (p.get("phases") or {}).get("auto", {}).get(str(p["largest_world_size"]))
                    weighs = ("the bytes its collectives move and the optimizer's update as measured in one "
                              "process (memdiag/optimizer_input.py), not the whole step" if handed_dense else
                              "the bytes its collectives move, not what the rest of the step does with a tensor "
                              "kept sparse")
                    part += (f" beyond the noise (auto weighs {weighs}"
                             + (f"; its peak was set in the {phase} phase" if phase else "") + ")")
        parts.append(part)
    level = p.get("lowest_peak_modes_within_noise") or []
    if len(level) > 1:
        parts.append(f"lowest peak at N={p['largest_world_size']}: {' and '.join(level)}, level within noise")
    elif p.get("lowest_peak_mode"):
        parts.append(f"lowest peak at N={p['largest_world_size']}: {p['lowest_peak_mode']}")
    return parts


def live_position(measured: float, one: float | None, every: float | None) -> str | None:
    """Where the measured growth lies against the live model's two figures (all three per added rank):
    "between", "above" or "below"; None where there is no second figure (one gathered tensor, or a
    comparison written before it)."""
    if one is None or every is None or not second_figure(one, every):
        return None
    return "between" if one <= measured <= every else "above" if measured > every else "below"


def live_bounds_text(measured: float, one: float | None, every: float | None) -> str:
    """The live model's other bound, every gathered tensor's outputs and quotient alive at once, and where
    the measured growth lies against the two (:func:`live_position`); "" where there is no other bound."""
    position = live_position(measured, one, every)
    if position is None:
        return ""
    text = f", {_signed(every)} with every gathered tensor's outputs and quotient alive at once"
    if position == "between":
        return text + (": the measured growth lies between the two, as when the tensors' reductions overlap "
                       "in part")
    return text + f": the measured growth is {position} both"


def segments_text(p: Physics) -> str:
    """Sparse's growth between each two rank counts against k x the formula, and what the model leaves:
    "unexplained" only where repeats show the gap beyond run-to-run noise; from one run, the gap and
    what it would take to tell."""
    segments = p.get("sparse_segments") or []
    if len(segments) < 2 and not any(s["beyond_noise"] for s in segments):
        return ""
    repeats = p.get("noise_source") == "repeats"
    phases = (p.get("phases") or {}).get("sparse", {})
    shown = []
    for s in segments:
        span = f"N={s['from_world_size']} to {s['to_world_size']}"
        clause = (f"{span}: {_signed(s['measured_bytes_per_rank'])} per added rank, the model "
                  f"{_signed(s['predicted_bytes_per_rank'])}")
        se = s.get("standard_error_bytes_per_rank")
        # what a gap is weighed against: two standard errors of the segment's growth, else the noise figure
        noise = ("run-to-run noise" if se is None
                 else f"two standard errors of the repeats (\u00b1{format_bytes(se)} per added rank each)")
        one, every = s.get("live_bytes_per_rank"), s.get("live_all_bytes_per_rank")
        overlap = live_position(s["measured_bytes_per_rank"], one, every) == "between"
        heap = s.get("heap_free_bytes_per_rank")
        heap_text = (f"; glibc's heaps kept {_signed(heap)} per added rank of freed memory"
                     if heap is not None and abs(heap) >= SHOWN_PER_RANK_BYTES and s.get("heap_free_beyond_noise")
                     is not False else "")
        kept = heap if heap_text and heap is not None and heap > 0 else 0.0
        # the ranks' spread alone lifts the largest of more ranks: named and taken off where it shows
        term = s.get("largest_of_ranks_bytes_per_rank") or 0.0
        term = term if term >= SHOWN_PER_RANK_BYTES and s.get("beyond_noise_after_named") is not None else 0.0
        term_text = f"{_signed(term)} that the ranks' spread alone adds to the largest of more ranks"
        if repeats and s["beyond_noise"] and not overlap and (kept or term) and s["unexplained_bytes_per_rank"] > 0:
            left = s["unexplained_bytes_per_rank"] - kept - term
            named = ([f"{_signed(kept)} that glibc's heaps kept freed"] if kept else []) + ([term_text] if term else [])
            if s.get("beyond_noise_after_named") if term else s.get("beyond_noise_after_heap"):
                clause += (f"; unexplained: {_signed(left)} per added rank between N={s['from_world_size']} and "
                           f"N={s['to_world_size']}, beyond {noise}, after " + " and ".join(named))
            else:
                clause += (heap_text + (f"; {term_text}" if term else "")
                           + f", and the rest of the gap is within {noise}")
            heap_text = ""
        elif s["unexplained_bytes_per_rank"] < 0 and phases.get(str(s["from_world_size"])) == "compute":
            # the two regimes: the gathered buffers hid under the compute peak at the lower rank count
            clause += f" (at N={s['from_world_size']} compute set the peak, and the gathered buffers fit under it)"
        elif repeats and s["beyond_noise"] and overlap:
            # a gap the live model's other figure covers: the tensors' reductions overlapping, not unexplained
            clause += f"; {_signed(s['unexplained_bytes_per_rank'])} per added rank beyond it, beyond {noise}"
        elif repeats and s["beyond_noise"]:
            clause += (f"; unexplained: {_signed(s['unexplained_bytes_per_rank'])} per added rank between "
                       f"N={s['from_world_size']} and N={s['to_world_size']}, beyond {noise}")
        elif repeats and s["beyond_noise"] is False:
            clause += f", within {noise}"
        else:
            clause += f" ({_signed(s['unexplained_bytes_per_rank'])} apart)"
        bounds = live_bounds_text(s["measured_bytes_per_rank"], one, every)
        if bounds:
            clause += f"; live buffers {_signed(one)} one tensor at a time" + bounds
        cpus = s.get("cpus_per_rank")
        if cpus:
            low_cpus, high_cpus = ("/".join(map(str, c)) for c in cpus)
            clause += (f"; its ranks could run on {low_cpus} CPU(s) at N={s['from_world_size']} and {high_cpus} at "
                       f"N={s['to_world_size']} (the launcher's binding), and TensorFlow sizes its thread pools by "
                       "them: the segment spans that change too")
        shown.append(clause + heap_text)
    text = "Sparse growth by segment: " + "; ".join(shown) + "."
    if not repeats:
        text += (" One run per configuration: whether a gap repeats, and so is the model's to explain, needs "
                 "--repeats 3.")
    return text


def noise_phrase(noise: float | None, source: str | None, whose: str = "", weighed: bool = False) -> str:
    """What the noise figure is, after a verdict; ``whose`` names where it comes from; ``weighed``: the verdict
    weighed its differences against standard errors from the repeats' spread, not against this figure."""
    if noise is None:
        return "Run-to-run noise not measured (--repeats 1)."
    if source == "ranks":
        return (f"Noise{whose}: {format_bytes(noise)}, the largest spread between the ranks of one run "
                "(--repeats R measures run-to-run noise).")
    if weighed:
        return (f"Run-to-run noise{whose}: {format_bytes(noise)}, the widest range of a row's repeats; the "
                "differences above are weighed against two standard errors from the repeats' spread, as a range "
                "widens with more repeats.")
    return f"Run-to-run noise{whose}: {format_bytes(noise)}."


def precision_phrase(p: Physics) -> str:
    """How precisely the repeats pin sparse's growth (memdiag.analyze.precision): "" without repeats at every
    rank count fitted."""
    se = p.get("sparse_growth_se_bytes_per_rank")
    if se is None:
        return ""
    text = (f"Sparse's growth: \u00b1{format_bytes(se)} per added rank, one standard error from the repeats' "
            "spread (run back to back: a slower drift of the machine is not in it)")
    growth, predicted = p.get("sparse_growth_bytes_per_rank"), p.get("predicted_rss_growth_bytes_per_rank")
    if se > 0 and growth is not None and predicted:
        apart = (growth - predicted) / se
        text += f"; it stands {abs(apart):.1f} standard errors {'above' if apart >= 0 else 'below'} k x the formula"
    needed = p.get("sparse_growth_repeats_for_tenth")
    if needed is not None:
        text += (f"; about {needed} repeats at each N put two standard errors within 10% of the model"
                 if needed > (p.get("sparse_growth_repeats") or 0) else "; two standard errors are within 10% of the model")
    return text + "."


def physics_verdict(result: Comparison) -> Text:
    """The comparison in one sentence with its numbers, then which phase set each mode's peaks."""
    p = result.get("physics")
    text = Text()
    if not p or p.get("largest_world_size") is None:
        return text
    parts = physics_parts(p)
    if parts:
        text.append("; ".join(parts) + ".", style="bold")
        weighed = p.get("sparse_growth_judged_by") == "standard_error"
        text.append(" " + noise_phrase(p.get("noise_bytes"), p.get("noise_source"), weighed=weighed))
        precision = precision_phrase(p)
        text.append((" " + precision if precision else "") + "\n")
    segments = segments_text(p)
    if segments:
        text.append(segments + "\n")
    for mode, phases in (p.get("phases") or {}).items():
        known = [(int(n), phase) for n, phase in phases.items() if phase and int(n) > 1]
        if not known:
            continue
        words = ", ".join(f"N={n}: {phase}" for n, phase in sorted(known))
        text.append(f"{mode}: peak set by {words}\n")
    return text


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def _steps(result: Comparison | EnginesComparison) -> str:
    """The header's steps: a built-in workload's (a script runs its own: null in compare.json)."""
    return "" if result.get("steps") is None else f"  steps {result.get('steps')}"


def compare_report(result: Comparison) -> Group:
    title = f"{result['workload']}" + (f" ({result['preset']})" if result.get("preset") else "")
    engine = f"  engine {result['engine']}" if result.get("engine") else ""  # Horovod's compare.json names none
    header = Panel(Text(f"{title}{engine}  modes {', '.join(result.get('modes', []))}  "
                        f"ranks {', '.join(map(str, result.get('rank_counts', [])))}{_steps(result)}"),
                   title="memdiag compare sparse-vs-dense", expand=False)
    parts: list[Any] = [header]
    if headline := result.get("headline"):
        parts.append(Panel(Text(headline, style="bold red"), title="headline", expand=False))
    parts.append(physics_verdict(result))
    if any(r.get("steady") is False for r in result["rows"]):
        unsettled = [f"N={r['world_size']} {r['mode']}" for r in result["rows"] if r.get("steady") is False]
        footnote = Text(f"* steady NO ({', '.join(unsettled)}): the per-step peaks of its last steps still rose or "
                        "swung by more than 1%; its figure is its largest peak. More steps let it settle (a built-in "
                        "workload: --steps, --max-warmup; a script: its own step count).\n", style="yellow")
    else:
        footnote = Text("")
    return Group(*parts, compare_table(result), footnote, growth_table(result),
                 Panel(peak_chart(result["rows"]), title="peak RSS per rank", expand=False), verdict(result))


# -- two engines (--engine both) ---------------------------------------------------------------------

def engines_sentence(result: EnginesComparison) -> str:
    """The verdict across engines in words, with its numbers (terminal and Markdown say the same)."""
    v = result.get("verdict") or {}
    peaks = v.get("peaks") or []
    if not peaks:
        return "No run completed: nothing to compare."
    low = peaks[0]
    text = (f"At N={v['world_size']} the lowest per-rank peak is {low['engine']} {low['mode']}, "
            f"{format_bytes(low['peak_rss_bytes'])}")
    if len(peaks) >= 2:
        runner = peaks[1]
        text += f", {format_bytes(v['lead_bytes'])} below {runner['engine']} {runner['mode']}"
        noise = format_bytes(v.get("noise_bytes"))
        if v.get("lead_beyond_noise") is None:
            text += " (noise not measured)"
        elif v["lead_beyond_noise"]:
            text += f", beyond the noise ({noise})"
        else:
            text += f", within noise ({noise}): level"
        rest = [f"{p['engine']} {p['mode']} {format_bytes(p['peak_rss_bytes'])}" for p in peaks[2:]]
        if rest:
            text += "; then " + ", ".join(rest)
    text += "."
    ranked = [b for e in result.get("engine_order", []) if (b := (v.get("best_by_engine") or {}).get(e))]
    gap = v.get("engine_gap_bytes")
    if len(ranked) >= 2 and gap is not None:
        text += (f" The lowest of {ranked[1]['engine']} ({ranked[1]['mode']}, "
                 f"{format_bytes(ranked[1]['peak_rss_bytes'])}) is {format_bytes(abs(gap))} "
                 f"{'above' if gap >= 0 else 'below'} the lowest of {ranked[0]['engine']}")
        if v.get("engine_gap_beyond_noise") is not None:
            text += ", beyond the noise" if v["engine_gap_beyond_noise"] else ", within noise"
        text += "."
    gathered = v.get("gathered_bytes") or {}
    order = [e for e in result.get("engine_order", []) if e in gathered]
    if len(order) >= 2:
        reference, other = order[0], order[1]
        text += (f" In mode sparse {other} gathered {format_bytes(gathered[other])} per rank per step, "
                 f"{reference} {format_bytes(gathered[reference])}")
        if v.get("gathered_ratio") is not None:
            text += f" ({v['gathered_ratio']:.2f}x)"
        padding = v.get("padding_bytes")
        if padding == 0 and v.get("equal_rows"):
            rows = sorted({r for each in v["rows_per_worker"].values() for r in each})
            text += (f"; {other}'s padding was 0 B because every worker had the same rows "
                     f"({', '.join(map(str, rows))} per tensor)")
        elif padding:
            text += f"; {format_bytes(padding)} of {other}'s was padding"
        text += "."
    exact = v.get("formula_exact") or {}
    if exact:
        if all(exact.values()):
            text += " Gathered bytes equal the formula's on " + " and ".join(exact) + "."
        else:
            text += " Gathered bytes differ from the formula's on " + " and ".join(e for e, ok in exact.items()
                                                                               if not ok) + "."
    return text


def engines_peak_table(result: EnginesComparison) -> FitTable:
    rows = result["side_by_side"]
    repeated = any(r.get("peak_spread_bytes") is not None for r in rows)
    columns = [Column("N", key=True), Column("engine", justify="left", key=True),
               Column("mode", justify="left", key=True), Column("peak RSS")]
    if repeated:
        columns.append(Column("spread"))
    columns += [Column("set by", justify="left"), Column("status", justify="left")]
    title = "Per-rank steady peak (max over ranks" + (", median of repeats)" if repeated else ")")
    table = FitTable(columns, title=title)
    for i, row in enumerate(rows):
        cells = [str(row["world_size"]), row["engine"], row["mode"], format_bytes(row.get("steady_peak_rss_bytes_median"))]
        if repeated:
            cells.append(format_bytes(row.get("peak_spread_bytes")))
        cells += [row.get("peak_phase") or "-", row["status"]]
        table.add_row(*cells)
        if i + 1 < len(rows) and rows[i + 1]["world_size"] != row["world_size"]:
            table.add_section()
    return table


def engines_bytes_table(result: EnginesComparison) -> FitTable:
    rows = result["side_by_side"]
    table = FitTable([Column("N", key=True), Column("engine", justify="left", key=True),
                      Column("mode", justify="left", key=True), Column("gathered"), Column("formula"),
                      Column("padding"), Column("allreduce")],
                     title="Bytes per rank per step (formula: every rank's rows in, summed)")
    for i, row in enumerate(rows):
        table.add_row(str(row["world_size"]), row["engine"], row["mode"], format_bytes(row["gathered_bytes_per_rank"]),
                      format_bytes(row.get("predicted_gathered_bytes_per_rank")),
                      format_bytes(row.get("padding_bytes_per_rank")), format_bytes(row["allreduce_bytes_per_rank"]))
        if i + 1 < len(rows) and rows[i + 1]["world_size"] != row["world_size"]:
            table.add_section()
    return table


def engines_details(result: EnginesComparison) -> Text:
    """Per engine: its own verdict and correctness, briefly; then the parameters across engines."""
    text = Text()
    for engine in result.get("engine_order", []):
        each = result["engines"][engine]
        text.append(f"{engine}: ", style="bold")
        parts = physics_parts(each.get("physics") or {})
        if parts:
            text.append("; ".join(parts) + ". ")
        text.append(f"Noise {format_bytes(each.get('noise_bytes'))}.\n")
        for row in each["rows"]:
            failure = row.get("failure")
            if failure:
                text.append(f"  {row['mode']} at N={row['world_size']} failed: {failure['headline']}\n", style="red")
        correctness_text(each, text)
    c = result["correctness"]
    across = c.get("across_engines") or []
    compared = [check for check in across if check["passed"] is not None]
    if compared:
        worst = max(compared, key=lambda check: check["max_abs_diff"] or 0.0)
        passed = c.get("across_engines_passed")
        text.append(f"Across engines {'PASSED' if passed else 'FAILED'}: ", style="bold green" if passed else "bold red")
        allowance = max((check.get("update_allowance") or 0.0 for check in compared), default=0.0)
        text.append(f"final parameters of {worst['engine']} against {worst['against_engine']}, same N and mode "
                    f"({len(compared)} pair(s)): max |diff| {_num(worst['max_abs_diff'])} at N={worst['world_size']} "
                    f"{worst['mode']}, max relative {_num(max(ch['max_rel_diff'] or 0.0 for ch in compared))}, "
                    f"loss {_num(max(ch['loss_max_rel_diff'] or 0.0 for ch in compared))} (tolerance as between modes: "
                    f"rtol {c['rtol']:g}, atol {c['atol']:g}"
                    + (f", + {allowance:.2g} of each variable's largest update" if allowance else "") + ")\n")
        for check in compared:
            again = check.get("rank_order")
            if again:
                text.append(f"  N={check['world_size']} {check['mode']}: max |diff| {_num(check['max_abs_diff'])} "
                            f"against {check['against_engine']}'s run, beyond the tolerance; against its run again "
                            f"with MPI's allreduce in rank order ({again['run']}): max |diff| "
                            f"{_num(again['max_abs_diff'])}, "
                            + second_look_outcome(again, check["mode"], f"{check['against_engine']}'s run",
                                                  runs=f"{check['against_engine']}'s two runs"),
                            style=None if check["passed"] else "red")
            if check["passed"] is False:
                text.append(f"  N={check['world_size']} {check['mode']}: max |diff| {_num(check['max_abs_diff'])} "
                            f"in {check.get('worst_variable')}, loss rel diff {_num(check['loss_max_rel_diff'])}\n",
                            style="red")
    for note in sorted({check["note"] for check in across if check.get("note")}):
        text.append(f"Across engines: {note}\n", style="yellow")
    environment_notes(result, text)
    return text


def engines_report(result: EnginesComparison) -> Group:
    title = f"{result['workload']}" + (f" ({result['preset']})" if result.get("preset") else "")
    header = Panel(Text(f"{title}  engines {', '.join(result.get('engine_order', []))}  "
                        f"modes {', '.join(result.get('modes', []))}  "
                        f"ranks {', '.join(map(str, result.get('rank_counts', [])))}{_steps(result)}"),
                   title="memdiag compare sparse-vs-dense --engine both", expand=False)
    parts: list[Any] = [Text(engines_sentence(result), style="bold"), header]
    if headline := result.get("headline"):
        parts.append(Panel(Text(headline, style="bold red"), title="headline", expand=False))
    v = result.get("verdict") or {}
    parts.append(Text(noise_phrase(v.get("noise_bytes"), v.get("noise_source"), " (the larger of the engines')")))
    return Group(*parts, engines_peak_table(result), engines_bytes_table(result), engines_details(result))


def print_compare(result: Comparison | EnginesComparison, console: Console | None = None) -> None:
    if result.get("engine") == "both":
        report = engines_report(cast(EnginesComparison, result))
    else:
        report = compare_report(cast(Comparison, result))
    (console or Console()).print(report)
