"""The prediction report: per rank count and mode, collective bytes, peak memory and what sets it.

Renders the plain data of :func:`memdiag.analyze.model.prediction_table`; computes nothing. Tables are
:class:`memdiag.report._fit.FitTable` (no figure, rank count or mode is cut); the notes say in words
which regime sets the peak up to which N, what a gathered byte costs and why (the reduce op), and where
each mode passes the memory budget and MPI's 32-bit counts.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console, Group
from rich.text import Text

from memdiag.format.results import Prediction, PredictionRow
from memdiag.report._fit import Column, FitTable
from memdiag.report.terminal import common_scope, second_figure, short_name
from memdiag.units import format_bytes

# Why a gathered byte costs k bytes at the peak, per reduce op (Horovod's sparse path).
K_REASONS = {
    "average": "op=Average, one tensor's gathered output is alive at a time (Horovod completes the "
               "allgathers one after another), beside one quotient values / N (the dividend is freed "
               "once it is made)",
    "sum": "op=Sum, the gathered values are used as they are: one tensor's values and indices at a time",
}
NO_GATHER_REASON = "has no allgather path in Horovod (sparse_as_dense needed): reduced densely in every mode"


def _all_at_once(row: PredictionRow) -> float | None:
    """The row's peak with every gathered tensor's buffers alive at once, where it differs (more than 1%)."""
    every = row.get("peak_rss_all_at_once_bytes")
    return every if every is not None and second_figure(row["peak_rss_bytes"], every) else None


def predicted_table(table: Prediction) -> FitTable:
    overlap = any(_all_at_once(row) is not None for row in table["rows"])
    columns = [Column("N", key=True), Column("mode", justify="left", key=True), Column("coll/step"),
               Column("gathered"), Column("peak RSS"), *([Column("all at once")] if overlap else []),
               Column("set by", justify="left")]
    grid = FitTable(columns, title="Predicted per rank (bytes from the formula; peak modelled)")
    for row in table["rows"]:
        peak = format_bytes(row["peak_rss_bytes"]) + (" OOM" if row["over_budget"] else "")
        every = _all_at_once(row)
        extra = [format_bytes(every) if every is not None else "-"] if overlap else []
        grid.add_row(str(row["world_size"]), row["mode"], format_bytes(row["collective_bytes_per_rank"]),
                     format_bytes(row["gathered_bytes_per_rank"]), peak, *extra, row.get("regime") or "-")
    return grid


def measured_table(table: Prediction) -> FitTable | None:
    """Predicted beside measured, where a run was made at a predicted rank count."""
    predicted = {(r["world_size"], r["mode"]): r for r in table["rows"]}
    pairs = [(predicted[(m["world_size"], m["mode"])], peak) for m in table.get("measured", [])
             if (m["world_size"], m["mode"]) in predicted and (peak := m["peak_rss_bytes"])]
    if not pairs:
        return None
    grid = FitTable([Column("N", key=True), Column("mode", justify="left", key=True), Column("predicted"),
                     Column("measured"), Column("error")],
                    title="Predicted peak against the runs at the same N")
    for row, seen in pairs:
        error = (row["peak_rss_bytes"] - seen) / seen
        grid.add_row(str(row["world_size"]), row["mode"], format_bytes(row["peak_rss_bytes"]),
                     format_bytes(seen), f"{error:+.1%}")
    return grid


def _cost_note(table: Prediction) -> str:
    ops = table.get("reduce_ops", {})
    k = table["cost_per_gathered_byte"]
    gathering = sorted({op for op in ops.values() if op in K_REASONS})
    others = sorted({op for op in ops.values() if op not in K_REASONS})
    if not gathering:
        text = ("k: no IndexedSlices gradient is predicted" if table.get("not_predicted") else
                "k: no IndexedSlices gradient is gathered in any mode")
    elif len(gathering) == 1:
        text = f"k = {k:.2f} bytes per gathered byte: with {K_REASONS[gathering[0]]}"
    else:
        text = (f"k = {k:.2f} bytes per gathered byte, weighted over the tensors: "
                + "; ".join(f"with {K_REASONS[op]}" for op in gathering))
    for op in others:
        text += f"; op={op} {NO_GATHER_REASON}"
    return text


def _regime_note(mode: str, table: Prediction, limit: str) -> str:
    n = table["regime_change_ranks"].get(mode)
    compute = format_bytes(table["compute_peak_bytes"][mode])
    again = (table.get("compute_again_ranks") or {}).get(mode)
    base = (table.get("collective_base_bytes") or {}).get(mode)
    compute_bytes = table["compute_peak_bytes"][mode]
    if n is None and base is not None and compute_bytes is not None and base > compute_bytes:
        # reductions that overlap the backward pass: the window's base is the step's, not the collectives'
        return (f"{mode}: compute sets the peak at every N up to {limit}: what the gathered buffers add stays under "
                f"1% of the {format_bytes(base)} the step holds in its collective window besides (above the "
                f"{compute} held when its first gradient reduction started: the backward pass runs on there)")
    if n is None:
        return f"{mode}: compute sets the peak ({compute}) at every N up to {limit}"
    if n == 1:
        text = f"{mode}: the collective window sets the peak (above the compute peak {compute})"
        return text + (f" up to N={again - 1}; compute from N={again}, auto having densified" if again else "")
    text = f"{mode}: compute sets the peak ({compute}) up to N={n - 1}; "
    if again is None:
        return text + f"from N={n} the gathered buffers do"
    return text + (f"the gathered buffers from N={n} to N={again - 1}; compute again from N={again}, "
                   "once auto has densified them")


def _rows_notes(table: Prediction, scope: str) -> list[str]:
    """Where the rows came from, for each tensor whose ranks' rows differ or were read off the run's
    records; and each tensor the prediction leaves out, with why."""
    lines = []
    for name, r in (table.get("tensor_rows") or {}).items():
        own = list((r.get("own_rows_by_rank") or {}).values())
        uneven = len(set(own)) > 1
        varying = r.get("own_rows_range")
        if not uneven and not varying and r.get("rows_from") != "records":
            continue
        line = f"{short_name(name, scope)}: extrapolated from the largest rank's rows, {r['rows_per_rank']} per rank"
        if varying:
            line += (f" (the most of any step: a rank's rows changed from step to step, {varying[0]} to "
                     f"{varying[2]}, median {varying[1]})")
        if uneven:
            line += (f" (the ranks had {min(own)}-{max(own)}"
                     + (f", {r['rows_gathered']} gathered at N={r['world_size']}" if r.get("rows_gathered") else "")
                     + "): every rank counted as the largest, an upper bound while no added rank looks up more")
        if r.get("rows_from") == "records":
            line += "; rows unknown when the graph was traced, read from the run's records"
        lines.append(line)
    for name, why in (table.get("not_predicted") or {}).items():
        lines.append(f"{short_name(name, scope)}: NOT PREDICTED, left out of every figure above: {why}")
    return lines


def notes(table: Prediction) -> Text:
    text = Text()
    limit = f"2^{table.get('scan_limit_ranks', 2**20).bit_length() - 1}"
    measured_at = ", ".join(map(str, table["fitted_from_world_sizes"]))
    two_regimes = any(v is not None for v in table.get("compute_peak_bytes", {}).values())
    if two_regimes:
        text.append("peak = max(compute peak, collective base + k x gathered bytes)\n", style="bold")
    else:
        text.append("peak = base + k x gathered bytes (these summaries do not separate the compute and "
                    "collective peaks: one regime)\n", style="bold")
    text.append(_cost_note(table) + "\n")
    if any(_all_at_once(row) is not None for row in table["rows"]):
        text.append("all at once: the peak if every gathered tensor's outputs and quotient were alive at once "
                    "(the tensors' reductions overlapping), on the same collective base: an upper figure\n")
    fitted = table.get("fitted_cost_per_gathered_byte")
    text.append(f"collective base anchored at the largest of N = {measured_at}"
                + (f"; a straight fit over those N gives k = {fitted:.2f}" if fitted else "") + "\n")
    if two_regimes:
        for mode, compute in table["compute_peak_bytes"].items():
            if compute is not None:
                text.append(_regime_note(mode, table, limit) + "\n")
    if table.get("budget_bytes"):
        budget = format_bytes(table["budget_bytes"])
        for mode, n in table["ranks_over_budget"].items():
            text.append(f"{mode}: never exceeds {budget} per rank (up to {limit} ranks)\n" if n is None else
                        f"{mode}: exceeds {budget} per rank from N = {n}\n")
    scope = common_scope(list(table["count_overflow"]) + list(table.get("not_predicted") or {}))
    for line in _rows_notes(table, scope):
        text.append(line + "\n", style="yellow" if "NOT PREDICTED" in line else None)
    for name, n in table["count_overflow"].items():
        if n:
            text.append(f"{short_name(name, scope)}: gathered values pass MPI's 32-bit count limit at N = {n}\n")
    for name, n in table.get("count_overflow_merged", {}).items():
        if n:
            text.append(f"{short_name(name, scope)}: merged values (U rows per rank) pass it at N = {n}\n")
    return text


def prediction_report(table: Prediction) -> Group:
    parts: list[Any] = [predicted_table(table)]
    against = measured_table(table)
    if against is not None:
        parts.append(against)
    parts.append(notes(table))
    return Group(*parts)


def print_prediction(table: Prediction, console: Console | None = None) -> None:
    (console or Console()).print(prediction_report(table))
