"""The prediction report: per rank count and mode, collective bytes and peak memory."""

from __future__ import annotations

from typing import Any

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from memdiag.report.terminal import common_scope, short_name
from memdiag.units import format_bytes


def prediction_report(table: dict[str, Any]) -> Group:
    measured = {(m["world_size"], m["mode"]): m for m in table.get("measured", [])}
    grid = Table(title="Predicted per rank (collective bytes exact; peak fitted)", title_justify="left")
    for column in ("N", "mode", "collective/step", "gathered", "peak RSS", "measured peak", "error"):
        grid.add_column(column, justify="left" if column == "mode" else "right", no_wrap=True)
    for row in table["rows"]:
        seen = measured.get((row["world_size"], row["mode"]))
        error = "" if not seen or not seen["peak_rss_bytes"] else \
            f"{(row['peak_rss_bytes'] - seen['peak_rss_bytes']) / seen['peak_rss_bytes']:+.1%}"
        peak = format_bytes(row["peak_rss_bytes"])
        if row["over_budget"]:
            peak = f"{peak} OOM"
        grid.add_row(str(row["world_size"]), row["mode"], format_bytes(row["collective_bytes_per_rank"]),
                     format_bytes(row["gathered_bytes_per_rank"]), peak,
                     format_bytes(seen["peak_rss_bytes"]) if seen else "", error)
    notes = Text()
    fitted = table.get("fitted_cost_per_gathered_byte")
    notes.append(f"peak = base + {table['cost_per_gathered_byte']:.2f} x gathered bytes (Horovod holds gathered "
                 f"values twice), anchored at the largest of N = {', '.join(map(str, table['fitted_from_world_sizes']))}"
                 + (f"; a straight fit over those N gives {fitted:.2f}" if fitted else "") + "\n")
    if table.get("budget_bytes"):
        for mode, n in table["ranks_over_budget"].items():
            where = "never (up to 2^20 ranks)" if n is None else f"from N = {n}"
            notes.append(f"{mode}: exceeds {format_bytes(table['budget_bytes'])} per rank {where}\n")
    scope = common_scope(list(table["count_overflow"]))
    for name, n in table["count_overflow"].items():
        if n:
            notes.append(f"{short_name(name, scope)}: gathered values pass MPI's 32-bit count limit at N = {n}\n")
    return Group(grid, notes)


def print_prediction(table: dict[str, Any], console: Console | None = None) -> None:
    (console or Console()).print(prediction_report(table))
