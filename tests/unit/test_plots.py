"""PNG plots: written where the report says, real images, and a one-line note without matplotlib."""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path

import pytest

from memdiag.format.reader import load_run
from memdiag.report import plots
from tests.helpers import memdiag
from tests.unit.fake_run import make_run

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def add_samples(run_dir: Path, rank: int, count: int = 200) -> list[float]:
    """A rank's RSS climbing through a step, as the sampler writes it: 500 + 50 x rank + i MiB at the
    i-th sample, 5 ms apart, after every record make_run wrote. Returns the samples' times."""
    start = time.time() + 1
    times = [start + i * 0.005 for i in range(count)]
    with open(run_dir / f"rank-{rank}.jsonl", "a") as f:
        f.write(json.dumps({"type": "mem", "rank": rank, "step": 3, "t": 1.0, "times": times,
                            "rss": [(500 + rank * 50 + i) * 2**20 for i in range(count)]}) + "\n")
    return times


class RecordingPyplot:
    """matplotlib.pyplot as the plots module uses it, but a figure it closes is kept for the test to read."""

    def __init__(self) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        self.plt = plt
        self.figures: list = []

    def __getattr__(self, name: str):
        return getattr(self.plt, name)

    def close(self, fig) -> None:
        self.figures.append(fig)


@pytest.fixture
def drawn(monkeypatch):
    """The figures the plot functions draw (one axes each), closed after the test."""
    pyplot = RecordingPyplot()
    monkeypatch.setattr(plots, "_pyplot", lambda: pyplot)
    yield pyplot
    for fig in pyplot.figures:
        pyplot.plt.close(fig)


def test_memory_plot_of_a_run(tmp_path, drawn):
    # GIVEN a run of 2 ranks and 3 steps whose ranks each end with 200 samples, rank r at 500 + 50 r + i MiB
    run_dir = make_run(tmp_path / "run", world_size=2)
    added = {rank: add_samples(run_dir, rank) for rank in (0, 1)}
    # WHEN its plots are written
    paths = plots.write_run_plots(load_run(str(run_dir)))
    # THEN memory.png is written in the run directory, a 10 x 5 inch image at 100 dpi
    assert paths == [str(run_dir / plots.MEMORY_PLOT)]
    width, height = png_size(run_dir / plots.MEMORY_PLOT)
    assert (width, height) == (1000, 500) and (run_dir / plots.MEMORY_PLOT).stat().st_size > 10_000
    # AND it has one line per rank, labelled with it, ending with that rank's samples in MiB, 5 ms apart
    [fig] = drawn.figures
    [ax] = fig.axes
    assert [line.get_label() for line in ax.lines] == ["rank 0", "rank 1"]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["rank 0", "rank 1"]
    for rank, line in enumerate(ax.lines):
        seconds, mib = list(line.get_xdata()), list(line.get_ydata())
        assert mib[-200:] == [500 + 50 * rank + i for i in range(200)]
        assert seconds == sorted(seconds) and seconds[-1] - seconds[-200] == pytest.approx(199 * 0.005)
    # AND both ranks share one time axis, counted from the run's first sample (make_run's, before the added)
    assert min(min(line.get_xdata()) for line in ax.lines) == 0.0
    rank0, rank1 = (line.get_xdata()[-200] for line in ax.lines)
    assert rank1 - rank0 == pytest.approx(added[1][0] - added[0][0], abs=1e-6) and rank0 > 1.0
    # AND rank 0's 3 training steps are shaded, and the title names the run
    assert len(ax.patches) == 3
    assert ax.get_title() == "transformer (tiny), mode sparse, 2 ranks: resident memory per rank"
    assert ax.get_ylabel() == "RSS (MiB)"


def test_memory_series_are_per_rank_seconds_and_mib(tmp_path):
    # GIVEN a run whose rank 1 ends with three samples of 550, 551 and 552 MiB, 5 ms apart
    run_dir = make_run(tmp_path / "run", world_size=2)
    added = add_samples(run_dir, 1, count=3)
    # WHEN its memory series are read
    origin, series = plots.memory_series(load_run(str(run_dir)))
    # THEN every rank has a series, rank 1's ending with those samples in MiB at their seconds since the origin
    assert sorted(series) == [0, 1]
    times, rss = series[1]
    assert rss[-3:] == [550.0, 551.0, 552.0]
    assert [origin + t for t in times[-3:]] == pytest.approx(added, abs=1e-6)
    # AND the origin is the run's first sample: no time before it, one at it
    assert times == sorted(times) and min(min(t) for t, _ in series.values()) == 0.0
    assert origin < added[0]


def test_rss_series_keeps_every_peak_when_it_halves_the_points():
    # GIVEN 100 samples of 1 MiB each, but for one of 900 MiB at the 38th, split over two records given out of order
    times = [1000.0 + i for i in range(100)]
    rss = [900 * 2**20 if i == 37 else 2**20 for i in range(100)]
    memory = [{"type": "mem", "times": times[50:], "rss": rss[50:]}, {"type": "mem", "times": times[:50], "rss": rss[:50]}]
    # WHEN they are reduced to at most 10 points
    points = plots.rss_series(memory, limit=10)
    # THEN there are no more than 10, in time order, each one of the samples, the 900 MiB one among them
    assert 0 < len(points) <= 10
    assert [t for t, _ in points] == sorted(t for t, _ in points)
    assert set(points) <= set(zip(times, rss)) and (1037.0, 900 * 2**20) in points
    # AND under the limit every sample is kept, in time order
    assert plots.rss_series(memory, limit=100) == list(zip(times, rss))
    # AND a record that kept only its first, largest and last sample gives those three
    aggregate = {"type": "mem", "t_first": 5.0, "rss_first": 10, "t_max": 6.0, "rss_max": 30, "t_last": 7.0,
                 "rss_last": 20}
    assert plots.rss_series([aggregate]) == [(5.0, 10), (6.0, 30), (7.0, 20)]


def test_peak_against_ranks_plot(tmp_path, drawn):
    # GIVEN comparison rows at 1, 2, 4 and 8 ranks: sparse peaks at 900 + 100 N MiB, dense and auto at 905 MiB,
    # and a failed sparse run at 16 ranks with no peak
    def peak_mib(n, mode):
        return 900 + (100 * n if mode == "sparse" else 5)

    rows = [{"world_size": n, "mode": mode, "steady_peak_rss_bytes_median": peak_mib(n, mode) * 2**20}
            for n in (1, 2, 4, 8) for mode in ("sparse", "dense", "auto")]
    rows.append({"world_size": 16, "mode": "sparse", "steady_peak_rss_bytes_median": None})  # a failed run
    # WHEN the peak plot is drawn
    path = plots.plot_peak_vs_ranks(rows, str(tmp_path / plots.PEAK_PLOT), "transformer (tiny)")
    # THEN it is a 7 x 5 inch image at 100 dpi, where it was asked for
    assert path == str(tmp_path / plots.PEAK_PLOT)
    assert png_size(Path(path)) == (700, 500) and Path(path).stat().st_size > 10_000
    # AND it has one line per mode, through that mode's peaks in MiB at 1, 2, 4 and 8 ranks (not the failed run)
    [fig] = drawn.figures
    [ax] = fig.axes
    lines = {line.get_label().split(":")[0]: line for line in ax.lines}
    assert sorted(lines) == ["auto", "dense", "sparse"] and len(ax.lines) == 3
    for mode, line in lines.items():
        assert list(line.get_xdata()) == [1, 2, 4, 8]
        assert list(line.get_ydata()) == [peak_mib(n, mode) for n in (1, 2, 4, 8)]
    # AND each label gives the first and last peak, the axis of ranks is log 2 with a tick at each count,
    # and the peaks are read from 0
    assert lines["sparse"].get_label() == "sparse: 1000 MiB at 1 -> 1700 MiB at 8"
    assert lines["dense"].get_label() == "dense: 905 MiB at 1 -> 905 MiB at 8"
    assert ax.get_xscale() == "log" and [t.get_text() for t in ax.get_xticklabels()] == ["1", "2", "4", "8"]
    assert ax.get_ylim()[0] == 0 and ax.get_title() == "transformer (tiny)"


def test_cli_writes_plots_beside_a_run_and_a_comparison(tmp_path):
    run_dir = make_run(tmp_path / "run", world_size=2)
    result = memdiag("report", str(run_dir), "--plots")
    assert result.returncode == 0, result.stderr
    assert f"wrote {run_dir / plots.MEMORY_PLOT}" in result.stdout
    assert png_size(run_dir / plots.MEMORY_PLOT) == (1000, 500)
    # JSON output stays parseable: the plot's path goes to stderr
    result = memdiag("report", str(run_dir), "--plots", "--format", "json")
    assert json.loads(result.stdout)["world_size"] == 2 and plots.MEMORY_PLOT in result.stderr
    compare = tmp_path / "cmp"
    compare.mkdir()
    (compare / "compare.json").write_text(json.dumps({
        "workload": "transformer", "preset": "tiny", "rows": [
            {"world_size": n, "mode": m, "steady_peak_rss_bytes_median": (900 + n * 10) * 2**20}
            for n in (1, 2) for m in ("sparse", "dense")]}))
    (compare / plots.PEAK_PLOT).unlink(missing_ok=True)
    result = memdiag("report", str(compare), "--plots", "--format", "json")
    assert result.returncode == 0, result.stderr
    assert png_size(compare / plots.PEAK_PLOT) == (700, 500) and plots.PEAK_PLOT in result.stderr


def test_without_matplotlib_one_line_says_so(tmp_path, monkeypatch, capsys):
    from memdiag.commands.report import _say_plots

    # GIVEN no matplotlib
    monkeypatch.setattr(plots, "_pyplot", lambda: None)
    run_dir = make_run(tmp_path / "run", world_size=1)
    # WHEN a run's and a comparison's plots are asked for
    assert plots.write_run_plots(load_run(str(run_dir))) is None
    assert plots.plot_peak_vs_ranks([], str(tmp_path / "p.png")) is None
    # THEN one line says so and how to install it, and no file is written
    _say_plots(None, "text")
    out = capsys.readouterr().out
    assert out.strip() == plots.MISSING and out.count("\n") == 1
    assert "matplotlib is not installed" in out and "pip install 'memdiag[plots]'" in out
    assert not (run_dir / plots.MEMORY_PLOT).exists() and not (tmp_path / "p.png").exists()


@pytest.mark.parametrize("rows", [[], [{"world_size": 2, "mode": "sparse", "steady_peak_rss_bytes_median": None}]])
def test_peak_plot_without_figures_is_still_an_image(tmp_path, rows, drawn):
    # GIVEN no row with a peak; WHEN the peak plot is drawn
    path = plots.plot_peak_vs_ranks(rows, str(tmp_path / "empty.png"))
    # THEN it is an image with no line and no legend, saying there is no figure to plot
    assert png_size(Path(path)) == (700, 500)
    [fig] = drawn.figures
    [ax] = fig.axes
    assert len(ax.lines) == 0 and ax.get_legend() is None
    assert [t.get_text() for t in ax.texts] == ["no peak figures in these runs"]
