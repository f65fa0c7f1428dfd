"""The two regimes of a comparison in one figure and one table.

For each mode of a comparison directory (written by ``memdiag compare``, holding ``compare.json``) it
draws the per-rank steady peak against the rank count N, as measured (compare.json's rows: the largest
per-rank steady peak, the median over ``--repeats``), with

* a horizontal line at the compute peak (RSS when the first gradient reduction started, the largest
  over the runs with N >= 2), and
* the collective line collective base + k x G(N): G(N) from the byte formula, k from the reduce op,
  the base anchored at the largest N measured,

both as ``memdiag predict`` fits them from the same directory (``memdiag.analyze.model``), so the
point where the collective line passes the compute line is the rank count predict names.

The figure is a PNG drawn with matplotlib when it is installed (default ``DIR/regimes.png``); without
matplotlib, or with ``--text``, a plain-text chart per mode goes to stdout, within 80 columns. The
figures themselves are always printed as a table.

Example::

    .venv/bin/python probes/regimes_figure.py runs/compare-transformer-small-20260101-120000
    .venv/bin/python probes/regimes_figure.py DIR --text --max-ranks 16
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import textwrap
from dataclasses import dataclass, field
from typing import Any

from memdiag.analyze.model import MemoryModel, build_model
from memdiag.commands.predict import load_summaries
from memdiag.format.rundir import read_comparison
from memdiag.units import format_bytes

MIB = 2**20
WIDTH = 80
FIGURE = "regimes.png"
PHASE_MARKS = {"compute": "o", "collectives": "x"}  # text chart: a measured peak and the phase that set it


@dataclass
class Point:
    world_size: int
    peak: float
    spread: float | None
    phase: str | None


@dataclass
class ModeFigures:
    mode: str
    measured: list[Point]
    compute: float | None  # None: summaries without the split peaks, one regime
    base: float
    k: float  # this mode's k at the largest N drawn (held / gathered), the overall k where nothing is gathered
    per_rank: float  # G(N) / N at the largest N drawn
    crossover: int | None  # first N where base + k x G(N) passes the compute peak (predict's rank count)
    line: dict[int, float] = field(default_factory=dict)  # N -> base + k x G(N)
    gathered: dict[int, int] = field(default_factory=dict)  # N -> G(N)


def load(compare_dir: str) -> tuple[dict[str, Any], MemoryModel]:
    return read_comparison(compare_dir), build_model(load_summaries(compare_dir))


def figures(result: dict[str, Any], model: MemoryModel, max_ranks: int | None) -> tuple[list[ModeFigures], int]:
    rows = [r for r in result["rows"] if r.get("steady_peak_rss_bytes_median")]
    modes = [m for m in result.get("modes") or sorted({r["mode"] for r in rows}) if any(r["mode"] == m for r in rows)]
    largest = max((r["world_size"] for r in rows), default=2)
    crossovers = [model.regime_change_ranks(m) for m in modes]
    last = max_ranks or max([largest + 1, *((c + 1) for c in crossovers if c is not None)])
    last = max(last, 2)
    out = []
    for mode, crossover in zip(modes, crossovers):
        measured = sorted((Point(r["world_size"], r["steady_peak_rss_bytes_median"], r.get("peak_spread_bytes"),
                                 r.get("peak_phase")) for r in rows if r["mode"] == mode), key=lambda p: p.world_size)
        # From N = 1 as predict scans it (one rank gathers nothing: the line is the base there).
        span = range(1, last + 1)
        gathered = {n: model.gathered_bytes(mode, n) for n in span}
        # k and G(N) / N where the most is gathered (auto gathers fewer tensors as N grows)
        ref = max((n for n in span if gathered[n]), default=last)
        k = model.held_bytes(mode, ref) / gathered[ref] if gathered[ref] else model.cost_per_gathered_byte
        out.append(ModeFigures(mode, measured, model.compute_peak_of(mode), model.collective_base(mode), k,
                               gathered[ref] / ref, crossover,
                               line={n: model.collective_peak(mode, n) for n in span}, gathered=gathered))
    return out, last


# -- the table ------------------------------------------------------------------------------------

def table(modes: list[ModeFigures]) -> str:
    header = f"{'mode':<10} {'N':>4} {'measured':>9} {'spread':>9} {'set by':<11} {'compute':>9} {'base+kG(N)':>10} {'model'}"
    lines = ["Per-rank steady peak: measured (set by: the phase that set it), the compute peak",
             "and the collective line base + k x G(N) as predict fits them (model: the regime",
             "they give)", header, "-" * WIDTH]
    for m in modes:
        counts = sorted({p.world_size for p in m.measured} | ({m.crossover} if m.crossover else set()))
        points = {p.world_size: p for p in m.measured}
        for n in counts:
            p = points.get(n)
            line = m.line.get(n)
            regime = ("-" if m.compute is None or line is None
                      else "compute" if n < 2 or line <= m.compute else "collectives")  # one rank: no collective
            lines.append(f"{m.mode:<10} {n:>4} {_size(p.peak if p else None):>9} {_size(p.spread if p else None):>9} "
                         f"{(p.phase or '-') if p else '(predicted)':<11} {_size(m.compute):>9} {_size(line):>10} "
                         f"{regime}")
    lines.append("")
    for m in modes:
        text = f"{m.mode}: compute peak {_size(m.compute)}; collective line {_size(m.base)}"
        text += (f" + {m.k:.2f} x G(N), G(N) = N x {_size(m.per_rank)}; " if m.per_rank else " (nothing gathered); ")
        if m.compute is None:
            text += "one regime (these summaries do not separate the compute and collective peaks)"
        elif m.crossover is None:
            text += "compute sets the peak at every N predict scans"
        else:
            text += f"the collective regime takes over at N={m.crossover}"
        lines.extend(textwrap.wrap(text, WIDTH, subsequent_indent="  "))
    return "\n".join(lines)


def _size(value: float | None) -> str:
    return "-" if value is None else format_bytes(value)


# -- the PNG --------------------------------------------------------------------------------------

def plot_png(modes: list[ModeFigures], last: int, path: str, title: str) -> str | None:
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(modes), figsize=(4.5 * len(modes), 4.5), dpi=100, sharey=True, squeeze=False)
    for ax, m in zip(axes[0], modes):
        ns = [n for n in sorted(m.line) if n >= 2]  # one rank runs no collective: no window to draw
        ax.plot(ns, [m.line[n] / MIB for n in ns], color="tab:red", label="collective base + k x G(N)")
        if m.compute is not None:
            ax.axhline(m.compute / MIB, color="tab:blue", linestyle="--", label="compute peak")
        if m.crossover is not None:
            ax.axvline(m.crossover, color="0.5", linestyle=":", label=f"collectives from N={m.crossover}")
        for phase, marker in (("compute", "o"), ("collectives", "s"), (None, "D")):
            pts = [p for p in m.measured if p.phase == phase or (phase is None and p.phase not in PHASE_MARKS)]
            if pts:
                ax.errorbar([p.world_size for p in pts], [p.peak / MIB for p in pts],
                            yerr=[(p.spread or 0) / 2 / MIB for p in pts], fmt=marker, color="black",
                            mfc="white" if phase == "compute" else "black", capsize=3,
                            label=f"measured, set by {phase or '?'}")
        ax.set_title(m.mode)
        ax.set_xlabel("ranks N")
        ax.set_xlim(0.5, last + 0.5)
        ax.grid(True, alpha=0.3)
        ax.legend(loc="upper left", fontsize="x-small")
    axes[0][0].set_ylabel("per-rank steady peak RSS (MiB)")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


# -- the plain-text chart ---------------------------------------------------------------------------

def text_chart(m: ModeFigures, last: int, low: float, high: float, height: int = 14) -> str:
    """One mode within 80 columns: '-' the compute peak, '.' the collective line, 'o' / 'x' a measured
    peak set by compute / by the collectives ('?' unknown), '|' the crossover."""
    label_width = 10
    plot_width = WIDTH - label_width - 2
    span = max(high - low, 1.0)

    def column(n: float) -> int:
        return round((n - 1) / max(last - 1, 1) * (plot_width - 1))

    def row(value: float) -> int:
        return height - 1 - round((value - low) / span * (height - 1))

    grid = [[" "] * plot_width for _ in range(height)]
    if m.crossover is not None and m.crossover <= last:
        for r in range(height):
            grid[r][column(m.crossover)] = "|"
    if m.compute is not None:
        for c in range(plot_width):
            grid[row(m.compute)][c] = "-"
    for c in range(plot_width):  # the collective line, between the rank counts it is computed at
        n = 1 + c / max(plot_width - 1, 1) * (last - 1)
        if n >= 2:
            below, above = math.floor(n), min(math.ceil(n), last)
            value = m.line[below] + (m.line[above] - m.line[below]) * (n - below)
            if low <= value <= high:
                grid[row(value)][c] = "."
    for p in m.measured:
        if p.world_size <= last:
            grid[row(p.peak)][column(p.world_size)] = PHASE_MARKS.get(p.phase or "", "?")
    lines = [f"{m.mode}: per-rank steady peak (MiB) against N"]
    for r, cells in enumerate(grid):
        value = high - r / max(height - 1, 1) * span
        label = f"{value / MIB:.0f}" if r in (0, height - 1) or r == height // 2 else ""
        lines.append(f"{label:>{label_width}} |" + "".join(cells).rstrip())
    axis = [" "] * plot_width
    ticks = sorted({1, last, *(p.world_size for p in m.measured), *([m.crossover] if m.crossover else [])})
    for n in ticks:
        text, c = str(n), column(n)
        start = min(max(0, c - len(text) // 2), plot_width - len(text))
        if all(ch == " " for ch in axis[max(0, start - 1):start + len(text) + 1]):
            axis[start:start + len(text)] = list(text)
    lines.append(" " * label_width + " +" + "-" * plot_width)
    lines.append(" " * (label_width + 2) + "".join(axis).rstrip() + "  N")
    lines.append(" " * (label_width + 2) + "- compute peak  . base+kG(N)  measured, set by: o compute,")
    lines.append(" " * (label_width + 2) + "x collectives  | collectives take over")
    return "\n".join(line[:WIDTH] for line in lines)


def text_charts(modes: list[ModeFigures], last: int) -> str:
    values = [v for m in modes for v in (*(v for n, v in m.line.items() if n >= 2), *(p.peak for p in m.measured),
                                         *([m.compute] if m.compute is not None else []))]
    low, high = min(values), max(values)
    pad = (high - low) * 0.05 or high * 0.05
    return "\n\n".join(text_chart(m, last, low - pad, high + pad) for m in modes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("compare_dir", help="a directory written by `memdiag compare` (holds compare.json)")
    parser.add_argument("--out", help=f"the PNG to write (default COMPARE_DIR/{FIGURE})")
    parser.add_argument("--text", action="store_true", help="print a plain-text chart instead of writing a PNG")
    parser.add_argument("--max-ranks", type=int, default=None, metavar="N",
                        help="draw the lines up to N ranks (default: past the largest measured N and the crossover)")
    args = parser.parse_args(argv)
    if not os.path.isfile(os.path.join(args.compare_dir, "compare.json")):
        parser.error(f"{args.compare_dir} holds no compare.json: give a directory written by `memdiag compare`")
    if args.max_ranks is not None and args.max_ranks < 2:
        parser.error("--max-ranks must be at least 2")
    result, model = load(args.compare_dir)
    modes, last = figures(result, model, args.max_ranks)
    if not modes:
        print(f"{args.compare_dir}: no run recorded a peak", file=sys.stderr)
        return 1
    path = None
    if not args.text:
        title = f"{result.get('workload', '?')} ({result.get('preset') or 'script'}): two regimes per mode"
        path = plot_png(modes, last, args.out or os.path.join(args.compare_dir, FIGURE), title)
        if path is None:
            print("matplotlib is not installed: plain-text chart instead", file=sys.stderr)
    if path is None:
        print(text_charts(modes, last))
        print()
    print(table(modes))
    if path is not None:
        print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
