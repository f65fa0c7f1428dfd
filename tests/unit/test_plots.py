"""PNG plots: written where the report says, real images, and a one-line note without matplotlib."""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path

import pytest

from memdiag.collect import load_run
from memdiag.report import plots
from tests.helpers import memdiag
from tests.unit.fake_run import make_run

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def add_samples(run_dir: Path, rank: int, count: int = 200) -> None:
    """A rank's RSS climbing through a step, as the sampler writes it."""
    with open(run_dir / f"rank-{rank}.jsonl", "a") as f:
        f.write(json.dumps({"type": "mem", "rank": rank, "step": 3, "t": 1.0,
                            "times": [time.time() + 1 + i * 0.005 for i in range(count)],
                            "rss": [(500 + rank * 50 + i) * 2**20 for i in range(count)]}) + "\n")


def test_memory_plot_of_a_run(tmp_path):
    run_dir = make_run(tmp_path / "run", world_size=2)
    for rank in (0, 1):
        add_samples(run_dir, rank)
    paths = plots.write_run_plots(load_run(str(run_dir)))
    assert paths == [str(run_dir / plots.MEMORY_PLOT)]
    width, height = png_size(run_dir / plots.MEMORY_PLOT)
    assert (width, height) == (1000, 500) and (run_dir / plots.MEMORY_PLOT).stat().st_size > 10_000


def test_memory_series_are_per_rank_seconds_and_mib(tmp_path):
    run_dir = make_run(tmp_path / "run", world_size=2)
    add_samples(run_dir, 1, count=3)
    origin, series = plots.memory_series(load_run(str(run_dir)))
    times, rss = series[1]
    assert rss[-3:] == [550.0, 551.0, 552.0]
    assert times == sorted(times) and min(min(t) for t, _ in series.values()) == 0.0


def test_peak_against_ranks_plot(tmp_path):
    rows = [{"world_size": n, "mode": mode, "steady_peak_rss_bytes_median": (900 + (100 * n if mode == "sparse" else 5)) * 2**20}
            for n in (1, 2, 4, 8) for mode in ("sparse", "dense", "auto")]
    rows.append({"world_size": 16, "mode": "sparse", "steady_peak_rss_bytes_median": None})  # a failed run
    path = plots.plot_peak_vs_ranks(rows, str(tmp_path / plots.PEAK_PLOT), "transformer (tiny)")
    assert png_size(Path(path)) == (700, 500) and Path(path).stat().st_size > 10_000


def test_cli_writes_plots_beside_a_run_and_a_comparison(tmp_path):
    run_dir = make_run(tmp_path / "run", world_size=2)
    result = memdiag("report", str(run_dir), "--plots")
    assert result.returncode == 0, result.stderr
    assert f"wrote {run_dir / plots.MEMORY_PLOT}" in result.stdout
    png_size(run_dir / plots.MEMORY_PLOT)
    # JSON output stays parseable: the plot's path goes to stderr
    result = memdiag("report", str(run_dir), "--plots", "--format", "json")
    assert json.loads(result.stdout)["world_size"] == 2 and plots.MEMORY_PLOT in result.stderr
    compare = tmp_path / "cmp"
    compare.mkdir()
    (compare / "compare.json").write_text(json.dumps({
        "workload": "transformer", "preset": "tiny", "rows": [
            {"world_size": n, "mode": m, "steady_peak_rss_bytes_median": (900 + n * 10) * 2**20}
            for n in (1, 2) for m in ("sparse", "dense")]}))
    result = memdiag("report", str(compare), "--plots", "--format", "json")
    assert result.returncode == 0, result.stderr
    png_size(compare / plots.PEAK_PLOT)


def test_without_matplotlib_one_line_says_so(tmp_path, monkeypatch, capsys):
    from memdiag.commands.report import _say_plots

    monkeypatch.setattr(plots, "_pyplot", lambda: None)
    run_dir = make_run(tmp_path / "run", world_size=1)
    assert plots.write_run_plots(load_run(str(run_dir))) is None
    assert plots.plot_peak_vs_ranks([], str(tmp_path / "p.png")) is None
    _say_plots(None, "text")
    out = capsys.readouterr().out
    assert out.strip() == plots.MISSING and out.count("\n") == 1 and "matplotlib" in out
    assert not (run_dir / plots.MEMORY_PLOT).exists()


@pytest.mark.parametrize("rows", [[], [{"world_size": 2, "mode": "sparse", "steady_peak_rss_bytes_median": None}]])
def test_peak_plot_without_figures_is_still_an_image(tmp_path, rows):
    path = plots.plot_peak_vs_ranks(rows, str(tmp_path / "empty.png"))
    png_size(Path(path))
