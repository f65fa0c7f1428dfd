""""What holds memory at the peak": the attribution of each rank's memray high-water mark, drawn
with rich from ``summary["attribution"]``, read back into memdiag.analyze.attribution's dataclasses.

The group table has one column per rank; on a terminal too narrow for all ranks it is drawn in parts
that repeat the group names (:class:`memdiag.report._fit.FitTable`), so no figure is cut.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from collections.abc import Mapping
from typing import Any

from rich.console import Group
from rich.text import Text

from memdiag.analyze.attribution import ALLGATHER, Attribution, RankAttribution
from memdiag.report._fit import Column, FitTable
from memdiag.units import format_bytes

STACK_GROUPS = 2  # groups per rank whose top stacks are listed
AVERAGE_NOTE_BYTES = 2**20  # an allgather output this large gets the note on Horovod's averaging copy


def flamegraph_command(memray_file: str) -> str:
    """memray's flame graph of a file shows the allocations alive at the high-water mark."""
    output = memray_file[:-len(".memray.bin")] + ".flamegraph.html" if memray_file.endswith(".memray.bin") \
        else memray_file + ".html"
    memray = "memray" if shutil.which("memray") else f"{shlex.quote(sys.executable)} -m memray"
    return f"{memray} flamegraph -f -o {shlex.quote(output)} {shlex.quote(memray_file)}"


def _group_order(ranks: list[RankAttribution]) -> list[str]:
    largest: dict[str, int] = {}
    for r in ranks:
        for g in r.groups:
            largest[g.group] = max(largest.get(g.group, 0), g.bytes)
    return sorted(largest, key=lambda name: -largest[name])


def group_table(attribution: Attribution) -> FitTable:
    """Groups as rows, ranks as columns: bytes held at the peak and their share of it."""
    ranks = attribution.ranks
    table = FitTable([Column("group", kind="prose", justify="left", key=True)]
                     + [Column(f"rank {r.rank}") for r in ranks],
                     title="What holds memory at the peak (memray high-water mark)")
    for name in _group_order(ranks):
        cells = []
        for r in ranks:
            g = r.group(name)
            cells.append("-" if g is None else f"{format_bytes(g.bytes)} {g.share * 100:.0f}%")
        table.add_row(name, *cells)
    table.add_section()
    table.add_row(Text("total of the groups", style="bold"),
                  *[Text(format_bytes(r.peak_bytes), style="bold") for r in ranks])
    table.add_row("memray's own peak", *[format_bytes(r.memray_peak_bytes) for r in ranks])
    return table


def _stack_lines(rank: RankAttribution) -> list[tuple[str, list[tuple[int, str]]]]:
    return [(g.group, [(s.bytes, " <- ".join(s.frames)) for s in g.top_stacks]) for g in rank.groups[:STACK_GROUPS]]


def top_stacks(attribution: Attribution) -> Text:
    """The top stacks of each rank's largest groups; a rank whose stacks repeat an earlier rank's
    is named, not repeated."""
    text = Text()
    shown: dict[tuple[Any, ...], int] = {}
    for r in attribution.ranks:
        lines = _stack_lines(r)
        key = tuple((group, tuple(frames for _, frames in stacks)) for group, stacks in lines)
        if key in shown:
            text.append(f"rank {r.rank}: the same top stacks as rank {shown[key]}\n", style="dim")
            continue
        shown[key] = r.rank
        text.append(f"rank {r.rank}: top stacks (innermost frame first)\n", style="bold")
        for group, stacks in lines:
            text.append(f"  {group}\n")
            for size, frames in stacks:
                text.append(f"    {format_bytes(size):>10}  {frames}\n")
    return text


def notes(attribution: Attribution, folder: str | None) -> Text:
    text = Text()
    pooled = [r for r in attribution.ranks if r.pooled_bytes]
    if pooled:
        worst = max(pooled, key=lambda r: r.pooled_bytes)
        text.append(
            f"{format_bytes(worst.pooled_bytes)} of rank {worst.rank}'s peak are regions of TensorFlow's "
            "pooling (BFC) allocator: memray sees a region when the pool grows, under the tensor that made "
            "it grow, not what the region holds at the peak. For tensor-by-tensor figures run with "
            "TF_ENABLE_ONEDNN_OPTS=0 in the environment (TensorFlow then allocates each CPU tensor "
            "itself).\n", style="yellow")
    gathered = [g for r in attribution.ranks for g in r.groups if g.group == ALLGATHER]
    if any(g.bytes >= AVERAGE_NOTE_BYTES for g in gathered):
        text.append("Horovod averages gathered gradient values (values / size) into a second tensor as large as "
                    "the gathered values: TensorFlow's kernel allocates it, so it is counted under TensorFlow "
                    "tensors (tensorflow::BinaryOp::Compute).\n")
    if folder and attribution.ranks:
        text.append("Flame graphs of each rank's peak (add --temporal to choose a time range instead):\n")
        for r in attribution.ranks:
            text.append(f"  {flamegraph_command(os.path.join(folder, r.file))}\n")
    for warning in attribution.warnings:
        text.append(f"warning: {warning}\n", style="yellow")
    return text


def attribution_section(entry: Mapping[str, Any]) -> Group:
    """``entry``: summary.json's ``attribution`` (memdiag.analyze.attribution.summary_entry)."""
    attribution = Attribution.from_dict(entry)
    parts: list[Any] = []
    if attribution.ranks:
        parts += [group_table(attribution), top_stacks(attribution)]
    parts.append(notes(attribution, entry.get("dir")))
    return Group(*parts)
