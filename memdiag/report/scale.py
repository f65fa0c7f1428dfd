"""The scaling report: measured rank counts, the verdict on the set-up, the projection beside published figures.

Tables are :class:`memdiag.report._fit.FitTable`: on a narrow terminal a table is drawn in parts
(time, then memory; efficiencies, then communication) that repeat N, rather than cutting a figure.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console, Group
from rich.panel import Panel
from rich.text import Text

from memdiag.format.results import ScaleResult
from memdiag.report._fit import Column, FitTable
from memdiag.units import format_bytes


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.0f}%"


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 0.01:
        return f"{value * 1000:.1f} ms"
    return f"{value * 1000:.0f} ms" if value < 10 else f"{value:.1f} s"


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}" if value < 100 else f"{value:.0f}"


def header(result: ScaleResult) -> Panel:
    study = result["study"]
    target = study["workload"] + (f" ({study['preset']})" if study.get("preset") else "")
    scaling = f"{study['scaling']} scaling" if study.get("scaling") else "one run"
    line = Text(f"{target}  {scaling}  mode {study['mode']}  ranks {', '.join(map(str, study['rank_counts']))}  "
                f"steps {study['steps']}")
    if study.get("hosts"):
        line.append(f"  hosts {study['hosts']}")
    return Panel(line, title="memdiag scale", expand=False)


def measured_table(result: ScaleResult) -> FitTable:
    table = FitTable([Column("N", key=True), Column("items/rank"), Column("step"), Column("items/s"),
                      Column("speedup"), Column("efficiency"), Column("in coll."),
                      Column("status", justify="left"), Column("peak RSS", group=1), Column("coll/step", group=1),
                      Column("gather/step", group=1)],
                     title="Measured, per rank count (per rank and per step: max over ranks)")
    for row in result["rows"]:
        in_collectives = ("-" if row["collective_time_fraction"] is None else
                          f"{_seconds(row['collective_time_s'])} {_percent(row['collective_time_fraction'])}")
        table.add_row(
            str(row["world_size"]), _number(row["items_per_rank"]), _seconds(row["step_time_s"]),
            _number(row["throughput"]), "-" if row["speedup"] is None else f"{row['speedup']:.2f}x",
            _percent(row["efficiency"]), in_collectives, row["status"], format_bytes(row["peak_rss_bytes_max"]),
            format_bytes(row["collective_bytes_per_rank"]), format_bytes(row["allgather_bytes_per_rank"]),
        )
    return table


def notes(result: ScaleResult) -> Text:
    text = Text()
    for warning in result["warnings"]:
        style = "bold red" if warning.startswith("NOT a scaling experiment") else "yellow"
        text.append(warning + "\n", style=style)
    text.append(result["collective_time_method"] + "\n", style="dim")
    return text


def projection_table(projection: dict[str, Any]) -> FitTable:
    base = projection["base"]
    table = FitTable([Column("N", key=True), Column("weak sparse"), Column("weak dense"), Column("strong sparse"),
                      Column("strong dense"), Column("comm sparse", group=1), Column("comm dense", group=1),
                      Column("gathered/rank", group=1), Column("published", kind="prose", justify="left", group=1)],
                     title=f"Projected efficiency (strong scaling from N={projection['strong_base_world_size']}, "
                           f"global batch {projection['strong_base_world_size']} x {_number(base['items_per_rank'])})")
    for row in projection["rows"]:
        gathered = format_bytes(row["gathered_bytes_per_rank"]) + (" >MPI int" if row["exceeds_mpi_count"] else "")
        published = "; ".join(f"{_percent(r['efficiency'])} {r['scaling']}" for r in row["references"]) or ""
        table.add_row(
            str(row["world_size"]), _percent(row["weak_sparse_efficiency"]), _percent(row["weak_dense_efficiency"]),
            _percent(row["strong_sparse_efficiency"]), _percent(row["strong_dense_efficiency"]),
            _seconds(row["sparse_communication_s"]), _seconds(row["dense_communication_s"]), gathered, published,
        )
    return table


def projection_notes(projection: dict[str, Any]) -> Text:
    net, base = projection["network"], projection["base"]
    text = Text()
    text.append(f"network: alpha {net['alpha_s']:.3g} s, beta {format_bytes(net['beta_bytes_per_s'])}/s "
                f"({net['source']}); fusion buffer {format_bytes(projection['fusion_bytes'])}\n")
    text.append(f"from {base['run_dir']} (N={base['world_size']}): compute {_seconds(base['compute_s'])} per step "
                f"({projection['compute_source']}), {base['dense_tensors']} dense gradients "
                f"{format_bytes(base['dense_allreduce_bytes'])}, {len(base['sparse'])} IndexedSlices gradient(s)\n")
    for reference in projection["references"]:
        text.append(f"published: {reference['text']}\n", style="cyan")
    text.append("assumptions: " + "; ".join(projection["assumptions"]) + "\n", style="dim")
    return text


def scale_report(result: ScaleResult) -> Group:
    parts: list[Any] = [header(result), measured_table(result), notes(result)]
    if projection := result.get("projection"):
        parts += [projection_table(projection), projection_notes(projection)]
    if result.get("projection_error"):
        parts.append(Text(f"no projection: {result['projection_error']}", style="bold red"))
    return Group(*parts)


def print_scale(result: ScaleResult, console: Console | None = None) -> None:
    (console or Console()).print(scale_report(result))
