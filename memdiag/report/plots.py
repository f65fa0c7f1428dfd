"""PNG plots with matplotlib (an optional dependency, drawn with the Agg back end, no display):
each rank's memory over time, and peak memory against the number of ranks for each mode."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any, cast

from memdiag.format.layout import decimate
from memdiag.format.reader import Run, mem_points
from memdiag.format.results import Comparison

MEMORY_PLOT = "memory.png"
PEAK_PLOT = "peak-vs-ranks.png"
MIB = 2**20
MAX_POINTS = 20_000  # per rank in the memory plot: more than its pixels
MISSING = "matplotlib is not installed: no plots written (pip install 'memdiag[plots]')"


def _pyplot() -> Any | None:
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def rss_series(memory: Sequence[Mapping[str, Any]], limit: int = MAX_POINTS) -> list[tuple[float, int]]:
    """A rank's RSS over the run from its ``mem`` records: the samples of the steps that kept them and
    the first, largest and last sample of every other step, in time order; beyond ``limit`` points,
    neighbouring pairs are merged into their larger value (as the sampler does), so no peak is lost."""
    points = sorted(p for m in memory for p in mem_points(m))
    if len(points) <= limit:
        return points
    times, rss = [t for t, _ in points], [r for _, r in points]
    while len(rss) > limit:
        times, rss = decimate(times, rss)
    return list(zip(times, rss))


def memory_series(run: Run) -> tuple[float, dict[int, tuple[list[float], list[float]]]]:
    """The run's first sample time, and per rank: seconds since then, RSS in MiB."""
    samples = {rank: rss_series(records.memory) for rank, records in run.ranks.items()}
    starts = [s[0][0] for s in samples.values() if s]
    if not starts:
        return 0.0, {}
    origin = min(starts)
    return origin, {rank: ([t - origin for t, _ in s], [rss / MIB for _, rss in s])
                    for rank, s in sorted(samples.items()) if s}


def plot_memory(run: Run, path: str | None = None) -> str | None:
    """RSS of every rank over the run, the first rank's steps shaded; None without matplotlib."""
    plt = _pyplot()
    if plt is None:
        return None
    path = path or os.path.join(run.path, MEMORY_PLOT)
    origin, series = memory_series(run)
    fig, ax = plt.subplots(figsize=(10, 5), dpi=100)
    first = min(run.ranks) if run.ranks else None
    if first is not None:
        for s in run.ranks[first].steps:
            if "t_start" in s and "t_end" in s and s.get("step", 0) >= 0:
                ax.axvspan(s["t_start"] - origin, s["t_end"] - origin, color="0.92", zorder=0)
    for rank, (times, rss) in series.items():
        ax.plot(times, rss, linewidth=1.2, label=f"rank {rank}")
    m = run.manifest
    ax.set_title(f"{m.get('workload', '?')} ({m.get('preset') or 'script'}), mode {m.get('mode')}, "
                 f"{m.get('world_size')} ranks: resident memory per rank")
    ax.set_xlabel("seconds since the first sample" + ("" if first is None else
                                                      f" (shaded: training steps of rank {first})"))
    ax.set_ylabel("RSS (MiB)")
    ax.grid(True, alpha=0.3)
    if series:
        ax.legend(loc="upper left", ncol=min(4, len(series)), fontsize="small")
    else:
        ax.text(0.5, 0.5, "no memory samples in this run", ha="center", va="center", transform=ax.transAxes)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_peak_vs_ranks(rows: Sequence[Mapping[str, Any]], path: str, title: str = "") -> str | None:
    """Largest per-rank peak RSS against the number of ranks, one line per mode (compare.json's rows)."""
    plt = _pyplot()
    if plt is None:
        return None
    by_mode: dict[str, list[tuple[int, float]]] = {}
    for row in rows:
        if row.get("steady_peak_rss_bytes_median") and row.get("world_size"):
            by_mode.setdefault(row.get("mode", "?"), []).append((row["world_size"], row["steady_peak_rss_bytes_median"] / MIB))
    fig, ax = plt.subplots(figsize=(7, 5), dpi=100)
    markers = {"sparse": "o", "dense": "s", "auto": "^"}
    counts = sorted({n for points in by_mode.values() for n, _ in points})
    for mode, points in sorted(by_mode.items()):
        points.sort()
        (n0, first), (n1, last) = points[0], points[-1]
        label = f"{mode}: {first:.0f} MiB at {n0} -> {last:.0f} MiB at {n1}" if len(points) > 1 else mode
        ax.plot([n for n, _ in points], [p for _, p in points], marker=markers.get(mode, "D"), label=label)
    if counts:
        ax.set_xscale("log", base=2)
        ax.set_xticks(counts, [str(n) for n in counts])
        ax.minorticks_off()
    ax.set_ylim(bottom=0)  # growth read against the whole peak, not against the axis' cut
    ax.set_xlabel("ranks")
    ax.set_ylabel("largest per-rank peak RSS (MiB)")
    ax.set_title(title or "peak memory per rank against the number of ranks")
    ax.grid(True, alpha=0.3)
    if by_mode:
        ax.legend(loc="lower right", fontsize="small")
    else:
        ax.text(0.5, 0.5, "no peak figures in these runs", ha="center", va="center", transform=ax.transAxes)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def write_run_plots(run: Run) -> list[str] | None:
    """``memory.png`` in the run directory; None without matplotlib."""
    path = plot_memory(run)
    return None if path is None else [path]


def write_compare_plots(compare_dir: str) -> list[str] | None:
    """``peak-vs-ranks.png`` in a comparison directory (from its compare.json); None without matplotlib."""
    from memdiag.format.rundir import read_comparison

    result = cast(Comparison, read_comparison(compare_dir))
    title = f"{result.get('workload', '?')} ({result.get('preset', '?')}): peak memory per rank against ranks"
    path = plot_peak_vs_ranks(result.get("rows", []), os.path.join(compare_dir, PEAK_PLOT), title)
    return None if path is None else [path]
